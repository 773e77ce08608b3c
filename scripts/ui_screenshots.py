"""Screenshots of the platform's Dagster UI for the README (Debian's headless chromium).

Starts the real `dagster dev` on a small temporary platform (4 H100 + 2 L40S), fills half the H100s
with an offline sweep so that research's lifecycle run (a 4-GPU gang) is held by the scheduler with
its reason, and saves `docs/ui-asset-graph.png` (the lifecycle asset graph) and `docs/ui-held-run.png`
(the runs list: the held run with its hold reason, the running sweep with its allocation).
Everything it started is stopped at the end.

    apt-get install -y chromium
    .venv/bin/python scripts/ui_screenshots.py [--out docs]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dagster_graphql import DagsterGraphQLClient

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from xirang_platform import devserver  # noqa: E402
from xirang_platform import run_tags as rt  # noqa: E402
from xirang_platform.embedded import write_platform  # noqa: E402
from xirang_platform.live_scene import LIVE_POOL, live_platform_doc, run_state, start_sweep  # noqa: E402

PLATFORM = live_platform_doc(product_gpus=2)
SWEEP = {"ops": {"research__architecture_sweep": {"config": {"widths": [16], "epochs": 120, "epoch_pause_s": 1.0}}}}


def screenshot(url: str, path: Path, wait_ms: int = 25000) -> None:
    """Load `url` in headless chromium, let the app render for `wait_ms` of virtual time, save a PNG."""
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                shutil.which("chromium") or "chromium",
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                f"--virtual-time-budget={wait_ms}",
                "--hide-scrollbars",
                "--window-size=1600,1000",
                f"--screenshot={path}",
                url,
            ],
            check=True,
            timeout=300,
            capture_output=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="xirang-ui-") as tmp:
        config, home = write_platform(Path(tmp), PLATFORM, LIVE_POOL)
        with devserver.running(home, env={"XIRANG_CONFIG": str(config)}) as server:
            client = DagsterGraphQLClient("127.0.0.1", port_number=server.port, timeout=120)
            sweep = start_sweep(client, server, SWEEP)
            held = client.submit_job_execution("lifecycle", "research", "__repository__")
            while True:
                _, tags = run_state(server, held)
                if "GPU" in tags.get(rt.HOLD_REASON, ""):
                    break
                time.sleep(1)
            print(f"held: {tags[rt.HOLD_REASON]}")
            # The runs list shows each run's tags: the held run's hold reason, the running sweep's allocation.
            screenshot(f"{server.url}/runs?tab=queued", args.out / "ui-held-run.png")
            screenshot(f"{server.url}/locations/research/asset-groups/lifecycle", args.out / "ui-asset-graph.png")
            client.terminate_runs([sweep, held])
    print(f"wrote {args.out / 'ui-held-run.png'} and {args.out / 'ui-asset-graph.png'}")


if __name__ == "__main__":
    main()
