"""`xirang demo --json` plays its scenario through the real coordinator, tick, sensors and daemons."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

XIRANG = Path(sys.executable).with_name("xirang")


def test_the_demo_preempts_for_retraining_and_serving_and_every_preempted_run_resumes_and_finishes() -> None:
    done = subprocess.run([str(XIRANG), "demo", "--json"], capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    counts = json.loads(done.stdout)
    # deploy, five sweeps, retraining, two replicas; plus one resumption per preemption
    assert counts["runs"] == 9 + counts["resumptions"]
    assert counts["preemptions"] >= 2, counts  # the retraining and the scale-up each take offline GPUs
    assert counts["resumptions"] == counts["preemptions"]
    assert counts["runs_by_status"] == {
        "CANCELED": counts["preemptions"],
        "SUCCESS": counts["runs"] - counts["preemptions"],
    }
    assert counts["borrows"] >= 1  # research's sweeps ran past its 4-GPU quota on idle GPUs
    assert set(counts["max_wait_s_by_tier"]) == {"inference", "online-training", "offline-training"}
    assert counts["live_allocations"] == 0
    assert counts["ledger_consistent"] is True
