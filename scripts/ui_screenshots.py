"""Screenshots of the platform's Dagster UI for the README (Debian's headless chromium).

Starts the real `dagster dev` on a small temporary platform (4 H100 + 2 L40S). A first architecture
sweep on three H100s runs to its end, so the sweep's job has a past duration the queue view estimates
from; a second, long one then holds those H100s, so research's lifecycle run (a 4-GPU gang) is held by
the scheduler with its reason, its place in its tier and an estimated start (when the running sweep
is expected to end). Saves `docs/ui-held-run.png` (the held run's own page with its queue criteria
open: why, where and when it waits) and `docs/ui-asset-graph.png` (the lifecycle asset graph).
Everything it started is stopped at the end.

    apt-get install -y chromium
    .venv/bin/python scripts/ui_screenshots.py [--out docs]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from dagster_graphql import DagsterGraphQLClient

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from xirang_platform.control import run_tags as rt  # noqa: E402
from xirang_platform.devtools import devserver  # noqa: E402
from xirang_platform.devtools.embedded import write_platform  # noqa: E402
from xirang_platform.devtools.headless import open_page, screenshot  # noqa: E402
from xirang_platform.devtools.live_scene import (  # noqa: E402
    LIVE_POOL,
    hold_lifecycle,
    live_platform_doc,
    run_state,
    start_sweep,
)

PLATFORM = live_platform_doc(product_gpus=2)


def sweep_config(epochs: int) -> dict:
    """An architecture sweep of `epochs` one-second epochs."""
    return {
        "ops": {"research__architecture_sweep": {"config": {"widths": [16], "epochs": epochs, "epoch_pause_s": 1.0}}}
    }


def wait_estimated(server: devserver.DevServer, run_id: str, timeout: float = 120) -> str:
    """Wait until the held run carries an estimated start at a time of day; that text."""
    deadline = time.monotonic() + timeout
    while not (estimate := run_state(server, run_id)[1].get(rt.ESTIMATED_START, "")).endswith(" UTC"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no estimated start on run {run_id} (it says {estimate!r}):\n{server.tail()}")
        time.sleep(0.5)
    return estimate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="xirang-ui-") as tmp:
        config, home = write_platform(Path(tmp), PLATFORM, LIVE_POOL)
        with devserver.running(home, env={"XIRANG_CONFIG": str(config)}) as server:
            client = DagsterGraphQLClient("127.0.0.1", port_number=server.port, timeout=120)
            start_sweep(client, server, sweep_config(150), gpus=3, until="SUCCESS")
            sweep = start_sweep(client, server, sweep_config(1200), gpus=3)
            held, reason = hold_lifecycle(client, server)
            print(f"held: {reason}; estimated start {wait_estimated(server, held)}")
            with open_page(f"{server.url}/runs/{held}") as page:
                page.wait_for(["This run is queued for execution and will start soon."])
                page.click("expand_more")
                page.click("View queue criteria")
                page.wait_for(['xirang/gate="capacity"', "xirang/estimated-start="])
                page.screenshot(args.out / "ui-held-run.png")
            screenshot(f"{server.url}/locations/research/asset-groups/lifecycle", args.out / "ui-asset-graph.png")
            client.terminate_runs([sweep, held])
    print(f"wrote {args.out / 'ui-held-run.png'} and {args.out / 'ui-asset-graph.png'}")


if __name__ == "__main__":
    main()
