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
import sys
import tempfile
from pathlib import Path

from dagster_graphql import DagsterGraphQLClient

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from xirang_platform.devtools import devserver  # noqa: E402
from xirang_platform.devtools.embedded import write_platform  # noqa: E402
from xirang_platform.devtools.headless import screenshot  # noqa: E402
from xirang_platform.devtools.live_scene import LIVE_POOL, hold_lifecycle, live_platform_doc, start_sweep  # noqa: E402

PLATFORM = live_platform_doc(product_gpus=2)
SWEEP = {"ops": {"research__architecture_sweep": {"config": {"widths": [16], "epochs": 120, "epoch_pause_s": 1.0}}}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="xirang-ui-") as tmp:
        config, home = write_platform(Path(tmp), PLATFORM, LIVE_POOL)
        with devserver.running(home, env={"XIRANG_CONFIG": str(config)}) as server:
            client = DagsterGraphQLClient("127.0.0.1", port_number=server.port, timeout=120)
            sweep = start_sweep(client, server, SWEEP)
            held, reason = hold_lifecycle(client, server)
            print(f"held: {reason}")
            # The runs list shows each run's tags: the held run's hold reason, the running sweep's allocation.
            screenshot(f"{server.url}/runs?tab=queued", args.out / "ui-held-run.png")
            screenshot(f"{server.url}/locations/research/asset-groups/lifecycle", args.out / "ui-asset-graph.png")
            client.terminate_runs([sweep, held])
    print(f"wrote {args.out / 'ui-held-run.png'} and {args.out / 'ui-asset-graph.png'}")


if __name__ == "__main__":
    main()
