"""The platform as a user sees it in the Dagster UI: the real `dagster dev`, pages rendered by Debian's
headless chromium (the app's JavaScript and its GraphQL requests run), their visible text checked.

The scene (`live_scene.py`): an offline sweep holds three of the four H100s, so research's lifecycle run
(a 4-GPU gang) is queued by the scheduler with its reason, first in its tier. The sweep has no past run
to say when it ends, but the lifecycle (online training) may preempt it once its minimum runtime (an
hour) is over: that is the estimated start. One server for the whole module: starting it costs a minute.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dagster_graphql import DagsterGraphQLClient

from tests.dagster.live_platform import live_home
from tests.waiting import wait_for
from xirang_platform.control import run_tags as rt
from xirang_platform.devtools import devserver
from xirang_platform.devtools.headless import open_page, rendered_text
from xirang_platform.devtools.live_scene import (
    MIN_RUNTIME_S,
    hold_lifecycle,
    run_state,
    start_sweep,
    write_live_platform,
)
from xirang_platform.operations.queue_view import estimate_text

# Long enough to stay running while the pages render; the server's stop ends it.
SWEEP = {"ops": {"research__architecture_sweep": {"config": {"widths": [16], "epochs": 600, "epoch_pause_s": 1.0}}}}
LIFECYCLE_ASSETS = ("training_dataset", "trained_model", "model_evaluation", "inference_service")


@dataclass(frozen=True)
class Scene:
    url: str
    sweep: str
    held: str
    reason: str
    estimate: str  # the held run's `xirang/estimated-start`
    sweep_started: tuple[float, float]  # the sweep was admitted between these Unix times


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    tmp = tmp_path_factory.mktemp("ui")
    config = write_live_platform(tmp, product_gpus=2)
    with devserver.running(live_home(tmp, config), env={"XIRANG_CONFIG": str(config)}) as server:
        client = DagsterGraphQLClient("127.0.0.1", port_number=server.port, timeout=120)
        before = time.time()
        sweep = start_sweep(client, server, SWEEP, gpus=3)
        started = (before, time.time())
        held, reason = hold_lifecycle(client, server)
        estimate = wait_for(
            "the held run's estimated start", lambda: run_state(server, held)[1].get(rt.ESTIMATED_START, "")
        )
        try:
            yield Scene(server.url, sweep, held, reason, estimate, started)
        finally:
            client.terminate_runs([sweep, held])


def missing(page: str, fragments: list[str]) -> list[str]:
    """The fragments absent from the rendered page's text."""
    return [f for f in fragments if f not in page]


def test_the_runs_list_shows_the_held_run_with_its_reason_and_the_running_sweep_with_its_gpus(scene: Scene) -> None:
    page = rendered_text(f"{scene.url}/runs")
    expected = [
        scene.held[:8],
        f"xirang/hold-reason: {scene.reason}",
        "xirang/gate: capacity",
        "xirang/position: #1 in online-training",
        f"xirang/estimated-start: {scene.estimate}",
        "xirang/tier: online-training",
        scene.sweep[:8],
        "xirang/gate: open",
        '"node":"h100-00"',
        "Queued (1)",
        "In progress (1)",
    ]
    assert not missing(page, expected), (missing(page, expected), page[:3000])


def test_the_held_run_is_estimated_to_start_when_the_sweep_may_be_preempted(scene: Scene) -> None:
    earliest, latest = (t + MIN_RUNTIME_S for t in scene.sweep_started)
    minutes = [*range(int(earliest), int(latest) + 60, 60), latest]
    assert scene.estimate in {estimate_text(t, earliest - MIN_RUNTIME_S) for t in minutes}


def test_the_held_run_page_shows_it_queued_with_no_step_started(scene: Scene) -> None:
    page = rendered_text(f"{scene.url}/runs/{scene.held}")
    expected = [f"{scene.held[:8]} Queued Run of lifecycle", "Not executed (5)", "Executing (0)"]
    assert not missing(page, expected), (missing(page, expected), page[:3000])


def test_the_held_runs_own_page_says_why_where_and_when_in_its_queue_criteria(scene: Scene, tmp_path: Path) -> None:
    # Dagster's page of a queued run shows no events ("This run is queued for execution and will start
    # soon"); its menu's queue criteria list the run's tags that hold it, each at limit 0.
    expected = [
        "Run queue criteria",
        'xirang/gate="capacity"',
        f'xirang/hold-reason="{scene.reason}"',
        'xirang/position="#1 in online-training"',
        f'xirang/estimated-start="{scene.estimate}"',
    ]
    shot = tmp_path / "queue-criteria.png"
    with open_page(f"{scene.url}/runs/{scene.held}") as page:
        page.wait_for(["This run is queued for execution and will start soon."])
        page.click("expand_more")
        page.click("View queue criteria")
        page.wait_for(expected)
        page.screenshot(shot)
        shown = page.text()  # the text of the page the screenshot painted
    assert not missing(shown, expected), (missing(shown, expected), shown[-3000:])
    assert shown.count("Limit 0") == 4, shown[-3000:]  # the gate and the three tags that explain it
    assert png_size(shot) == (1600, 1000)


def png_size(path: Path) -> tuple[int, int]:
    """A PNG's width and height, from its header."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_the_lifecycle_asset_group_lists_its_assets_waiting_on_the_held_run(scene: Scene) -> None:
    page = rendered_text(f"{scene.url}/locations/research/asset-groups/lifecycle")
    expected = [f"{asset} Latest event" for asset in LIFECYCLE_ASSETS]
    assert not missing(page, expected), (missing(page, expected), page[:3000])
    assert page.count(f"Materializing... {scene.held[:8]}") == len(LIFECYCLE_ASSETS), page[:3000]


def test_headless_rendering_names_the_fix_when_chromium_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="apt-get install -y chromium"):
        rendered_text("http://127.0.0.1:1/")
