"""The `--report` page: metrics table, per-tier table and three plots from an event log."""

from __future__ import annotations

from pathlib import Path

from tests.simulate.sim_builders import TWO_GPU_LOG
from xirang_platform.simulate.metrics import compute_metrics
from xirang_platform.simulate.report import write_report


def test_the_page_shows_the_metrics_and_links_every_plot(tmp_path: Path) -> None:
    metrics = compute_metrics(TWO_GPU_LOG, capacity_gpus=2)
    page = write_report(tmp_path / "out", TWO_GPU_LOG, metrics, capacity_gpus=2, title="tiny <log>")
    html = page.read_text()
    assert page == tmp_path / "out" / "index.html"
    assert "<title>tiny &lt;log&gt;</title>" in html
    assert "<tr><th>utilization</th><td>0.725</td></tr>" in html
    assert "<tr><th>inference_wait_p99_s</th><td>9.9</td></tr>" in html
    assert "<th>offline-training</th>" in html
    for png in ("utilization.png", "queue.png", "waits.png"):
        assert f'src="{png}"' in html
        assert (tmp_path / "out" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_empty_log_still_writes_a_page(tmp_path: Path) -> None:
    page = write_report(tmp_path, [], compute_metrics([], 4), capacity_gpus=4)
    assert "<h2>Metrics</h2>" in page.read_text()
