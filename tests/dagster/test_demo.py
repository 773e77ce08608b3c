"""`xirang demo --json` plays its scenario through the real coordinator, tick, sensors and daemons."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

from dagster import DagsterRunStatus, instance_for_test

from xirang_platform.dagster_compat import create_run_for_test
from xirang_platform.devtools.demo import settle_processes

XIRANG = Path(sys.executable).with_name("xirang")


def test_the_demo_preempts_for_retraining_and_serving_rolls_out_and_every_preempted_run_resumes() -> None:
    done = subprocess.run([str(XIRANG), "demo", "--json"], capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    counts = json.loads(done.stdout)
    serving = counts["serving"]
    # deploy, five sweeps, retraining, the redeploy, the service's replicas; one resumption per preemption
    assert counts["runs"] == 8 + serving["replica_runs"] + counts["resumptions"]
    assert counts["preemptions"] >= 2, counts  # the retraining and the scale-up each take offline GPUs
    assert counts["resumptions"] == counts["preemptions"]
    # a replica scaled down or replaced by the rollout once started stops normally and succeeds; one
    # scaled down while queued, or switched off at the end, is cancelled
    assert serving["replicas_stopped"] >= 1
    canceled = counts["preemptions"] + serving["replica_runs"] - serving["replicas_stopped"]
    assert counts["runs_by_status"] == {"CANCELED": canceled, "SUCCESS": counts["runs"] - canceled}
    assert counts["borrows"] >= 1  # research's sweeps ran past its 4-GPU quota on idle GPUs
    assert set(counts["max_wait_s_by_tier"]) == {"inference", "online-training", "offline-training"}
    assert counts["live_allocations"] == 0
    assert counts["ledger_consistent"] is True
    # every victim not yet ended gets its notice (one still queued too) and takes it from its step's
    # first line: it saves its epoch's checkpoint, or has nothing to save yet, and stops, losing nothing
    assert 1 <= counts["notices"] <= counts["preemptions"]
    assert counts["lost_gpu_seconds_after_notice"] == 0
    # the service: real requests through the router, scaled from scraped metrics, rolled out to v2
    assert serving["load_source"] == "scrape"
    assert serving["requests_failed"] == 0, serving["errors_by_reason"]
    assert serving["requests_ok"] > 500  # 8 QPS for 90 s, then 1 QPS
    assert 0 < serving["latency_p50_ms"] <= serving["latency_p99_ms"]
    assert serving["scale_ups"] >= 2  # the first replica, then the burst
    assert serving["scale_downs"] >= 1
    assert serving["max_ready_replicas"] >= 3
    assert serving["rollouts"] == 1
    assert serving["min_ready_replicas_during_rollout"] >= 1


def test_the_demo_removes_its_instance_only_after_every_run_process_exited() -> None:
    # issue 20 item 9: "Directory not empty: 'history'": a run process still wrote to the removed instance
    with instance_for_test() as instance:
        run = create_run_for_test(instance, job_name="probe", status=DagsterRunStatus.SUCCESS)
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
        instance.report_engine_event(f"Started process for run (pid: {worker.pid}).", run)
        reaper = threading.Thread(target=worker.wait)  # its parent reaps it, as a code server does
        reaper.start()

        assert settle_processes(instance) == []

        assert _has_exited(worker.pid)  # a zombie its reaper has not collected yet has exited too
        reaper.join()


def _has_exited(pid: int) -> bool:
    """Whether the process `pid` no longer runs: gone, or a zombie (state Z in /proc/PID/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"
