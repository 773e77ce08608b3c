"""The `--report DIR` page of a run with autoscaled inference: one or both policies side by side.

Plots, per policy: allocated GPUs over time stacked by tier against the pool's capacity; inference
demand (GPUs the load needs at full replica load) against the GPUs its replicas hold and the GPUs
reserved for it (siloed: its partition; unified: its quota, lent out while idle); and, both policies
on one plot, the training queue length. The metrics of the policies sit side by side in one table.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never open a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from xirang_platform.scheduling.model import Tier  # noqa: E402
from xirang_platform.simulate.inference_metrics import (  # noqa: E402
    milli_to_gpus,
    step_at,
    tier_series,
    waiting_training_series,
)
from xirang_platform.simulate.inference_replay import PolicyRun  # noqa: E402

HOUR = 3600.0
TIER_ORDER = [t.value for t in (Tier.INFERENCE, Tier.ONLINE_TRAINING, Tier.OFFLINE_TRAINING, Tier.BATCH_INFERENCE)]
SIDE_BY_SIDE = (
    "utilization",
    "inference_wait_p99_s",
    "inference_unserved",
    "training_wait_mean_s",
    "training_wait_p95_s",
    "training_jct_mean_s",
    "training_jct_p95_s",
    "preemptions",
    "lost_gpu_seconds",
    "lost_fraction",
    "returns",
    "training_unfinished",
    "inference_gpus",
    "capacity_gpus",
    "cycles",
)


def write_inference_report(directory: str | Path, results: Sequence[tuple[PolicyRun, dict]]) -> Path:
    """Write `index.html` and its PNG plots into `directory` (created if needed); return the page's path."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    plots: list[tuple[str, str]] = []
    for run, _ in results:
        for name, caption, fig in (
            (f"tiers_{run.policy}.png", f"{run.policy}: allocated GPUs by tier", _tier_plot(run)),
            (f"inference_{run.policy}.png", f"{run.policy}: inference demand and capacity", _inference_plot(run)),
        ):
            fig.savefig(out / name, dpi=100, bbox_inches="tight")
            plt.close(fig)
            plots.append((name, caption))
    fig = _queue_plot(results)
    fig.savefig(out / "training_queue.png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    plots.append(("training_queue.png", "Training requests waiting"))
    page = out / "index.html"
    page.write_text(_html(results, plots), encoding="utf-8")
    return page


def _tier_plot(run: PolicyRun):
    end = max(float(run.events[-1]["t"]), run.setup.load.end) if run.events else run.setup.load.end
    grid = np.linspace(0.0, end, 800)
    series = tier_series(run.events)
    tiers = [t for t in TIER_ORDER if t in series]
    stacks = [milli_to_gpus(step_at(*series[t], grid)) for t in tiers]
    fig, ax = plt.subplots(figsize=(9, 3.5))
    if stacks:
        ax.stackplot(grid / HOUR, stacks, labels=tiers, step="post")
    ax.axhline(run.capacity_gpus, color="black", linestyle="--", label=f"capacity ({run.capacity_gpus:g} GPUs)")
    if run.policy == "siloed":
        ax.axhline(run.inference_gpus, color="grey", linestyle=":", label="inference partition")
    ax.set_xlabel("simulated time (hours)")
    ax.set_ylabel("GPUs")
    ax.legend(loc="upper right", fontsize="small")
    return fig


def _inference_plot(run: PolicyRun):
    spec, load = run.setup.spec, run.setup.load
    grid = np.arange(load.start, load.end, 60.0)
    qps = np.array([np.nan if (q := load.at(float(t))) is None else q for t in grid])
    per_gpu = spec.replica_gpu_milli / 1000
    series = tier_series(run.events).get(Tier.INFERENCE.value)
    held = milli_to_gpus(step_at(*series, grid)) if series else np.zeros(len(grid))
    fig, ax = plt.subplots(figsize=(9, 3.5))
    ax.plot(grid / HOUR, qps / spec.replica_qps * per_gpu, label="demand (GPUs at full replica load)")
    ax.step(grid / HOUR, held, where="post", label="GPUs its replicas hold")
    reserved = "partition" if run.policy == "siloed" else "quota (lent while idle)"
    ax.axhline(run.inference_gpus, color="grey", linestyle=":", label=f"inference {reserved}")
    ax.set_xlabel("simulated time (hours)")
    ax.set_ylabel("GPUs")
    ax.legend(loc="upper right", fontsize="small")
    return fig


def _queue_plot(results: Sequence[tuple[PolicyRun, dict]]):
    fig, ax = plt.subplots(figsize=(9, 3.5))
    for run, _ in results:
        times, count = waiting_training_series(run.events)
        if len(times):
            ax.step(times / HOUR, count, where="post", label=run.policy)
    ax.set_xlabel("simulated time (hours)")
    ax.set_ylabel("training requests waiting")
    ax.legend(loc="upper right")
    return fig


def _html(results: Sequence[tuple[PolicyRun, dict]], plots: list[tuple[str, str]]) -> str:
    head = "".join(f"<th>{html.escape(run.policy)}</th>" for run, _ in results)
    rows = "\n".join(
        f"<tr><th>{html.escape(k)}</th>" + "".join(f"<td>{_fmt(m.get(k))}</td>" for _, m in results) + "</tr>"
        for k in SIDE_BY_SIDE
    )
    load = html.escape(results[0][1].get("inference_load", "")) if results else ""
    figures = "\n".join(
        f'<figure><img src="{name}" alt="{html.escape(cap)}"><figcaption>{html.escape(cap)}</figcaption></figure>'
        for name, cap in plots
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Xirang: unified vs siloed</title>
<style>body{{font-family:sans-serif;max-width:960px;margin:2em auto}}table{{border-collapse:collapse}}
th,td{{border:1px solid #ccc;padding:4px 8px;text-align:left}}figure{{margin:1.5em 0}}</style></head>
<body><h1>Autoscaled inference with training</h1>
<p>Inference load: {load}</p>
<h2>Metrics side by side</h2><table><tr><th>metric</th>{head}</tr>{rows}</table>
<h2>Plots</h2>{figures}
</body></html>
"""


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return html.escape(str(v))
