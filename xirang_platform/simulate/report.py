"""The `--report DIR` page: `index.html` with the metrics table and matplotlib plots of a replay."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never open a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from xirang_platform.pool.model import MILLI_PER_GPU  # noqa: E402
from xirang_platform.simulate.events import Event  # noqa: E402
from xirang_platform.simulate.metrics import allocated_series, job_times, queue_series  # noqa: E402

HOUR = 3600.0


def write_report(
    directory: str | Path, events: Sequence[Event], metrics: dict, capacity_gpus: float, title: str = "Xirang replay"
) -> Path:
    """Write `index.html` and its PNG plots into `directory` (created if needed); return the page's path."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    plots = [
        ("utilization.png", "Allocated GPUs over time", _utilization_plot(events, capacity_gpus)),
        ("queue.png", "Waiting requests over time", _queue_plot(events)),
        ("waits.png", "Wait (submit to first admit) per tier", _wait_plot(events)),
    ]
    for name, _, fig in plots:
        fig.savefig(out / name, dpi=100, bbox_inches="tight")
        plt.close(fig)
    page = out / "index.html"
    page.write_text(_html(title, metrics, [(name, caption) for name, caption, _ in plots]), encoding="utf-8")
    return page


def _utilization_plot(events: Sequence[Event], capacity_gpus: float):
    times, milli = allocated_series(events)
    fig, ax = plt.subplots(figsize=(9, 3.5))
    if len(times):
        ax.step(times / HOUR, milli / MILLI_PER_GPU, where="post", label="allocated GPUs")
    ax.axhline(capacity_gpus, color="grey", linestyle="--", label=f"capacity ({capacity_gpus:g} GPUs)")
    ax.set_xlabel("simulated time (hours)")
    ax.set_ylabel("GPUs")
    ax.legend(loc="lower right")
    return fig


def _queue_plot(events: Sequence[Event]):
    times, count = queue_series(events)
    fig, ax = plt.subplots(figsize=(9, 3.5))
    if len(times):
        ax.step(times / HOUR, count, where="post")
    ax.set_xlabel("simulated time (hours)")
    ax.set_ylabel("waiting requests")
    return fig


def _wait_plot(events: Sequence[Event]):
    jobs = job_times(events)
    tiers = sorted({j.tier for j in jobs})
    waits = [np.array([j.wait for j in jobs if j.tier == t and j.wait is not None]) for t in tiers]
    fig, ax = plt.subplots(figsize=(9, 3.5))
    shown = [(t, w) for t, w in zip(tiers, waits, strict=True) if len(w)]
    if shown:
        # +1 s so that zero waits show on the log axis.
        ax.boxplot([w + 1.0 for _, w in shown], tick_labels=[f"{t}\n(n={len(w)})" for t, w in shown])
        ax.set_yscale("log")
    ax.set_ylabel("wait + 1 (seconds, log scale)")
    return fig


def _html(title: str, metrics: dict, plots: list[tuple[str, str]]) -> str:
    rows = "\n".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(_fmt(v))}</td></tr>"
        for k, v in metrics.items()
        if not isinstance(v, dict | list)
    )
    tiers = metrics.get("tiers", {})
    columns = sorted({c for row in tiers.values() for c in row})
    tier_rows = "\n".join(
        "<tr><th>" + html.escape(t) + "</th>" + "".join(f"<td>{_fmt(row.get(c))}</td>" for c in columns) + "</tr>"
        for t, row in tiers.items()
    )
    tier_head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    figures = "\n".join(
        f'<figure><img src="{name}" alt="{html.escape(caption)}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        for name, caption in plots
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:960px;margin:2em auto}}table{{border-collapse:collapse}}
th,td{{border:1px solid #ccc;padding:4px 8px;text-align:left}}figure{{margin:1.5em 0}}</style></head>
<body><h1>{html.escape(title)}</h1>
<h2>Metrics</h2><table>{rows}</table>
<h2>Per tier</h2><table><tr><th>tier</th>{tier_head}</tr>{tier_rows}</table>
<h2>Plots</h2>{figures}
</body></html>
"""


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
