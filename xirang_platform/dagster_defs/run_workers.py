"""Run worker processes on this host: which process runs a run, and whether it still lives.

Dagster's `DefaultRunLauncher` starts each run in a child process of the code server, which logs the
engine event "Started process for run (pid: N)" before it executes anything, and tags the run with
the code server's address (`.dagster/grpc_info`). Dagster's run monitoring cannot check such a worker
(the launcher has no `check_run_worker_health`), and the code server that fails a run whose process
died is gone after a crash or a restart. So the scheduling tick asks here: a run whose code server is
on this host and whose logged process is gone has no live worker. A pid the kernel reused for a
later process does not count as the worker: the process must have started before the event.

For runs launched elsewhere (Kubernetes Jobs, a code server on another host) the answer is unknown
(None) and Dagster's run monitoring (`check_run_worker_health`, the start and cancel timeouts) ends
them.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dagster import DagsterEventType, DagsterInstance, DagsterRun

from xirang_platform.dagster_compat import GRPC_INFO_TAG  # DefaultRunLauncher's: the code server's address

__all__ = ["GRPC_INFO_TAG", "Worker", "alive", "find_worker", "is_local", "wait_ended"]
STARTED_MESSAGE = "Started process for run (pid: "
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "")
# The kernel counts a process's start in clock ticks since boot, and boot time in whole seconds.
START_SLACK_S = 2.0
PROC = Path("/proc")


@dataclass(frozen=True)
class Worker:
    """A run's worker process: its pid and when it said it started (epoch seconds)."""

    pid: int
    started_at: float


def is_local(run: DagsterRun) -> bool:
    """Whether `run` was launched through a code server on this host (its process is one we can see)."""
    info = run.tags.get(GRPC_INFO_TAG)
    if not info:
        return False
    try:
        host = str(json.loads(info).get("host") or "")
    except (ValueError, AttributeError):
        return False
    return host in LOCAL_HOSTS or host == socket.gethostname()


def find_worker(instance: DagsterInstance, run_id: str) -> Worker | None:
    """The worker process the run logged, or None before it logged one."""
    records = instance.get_records_for_run(run_id, of_type=DagsterEventType.ENGINE_EVENT).records
    for record in records:
        entry = record.event_log_entry
        message = entry.dagster_event.message if entry.dagster_event else ""
        if message and message.startswith(STARTED_MESSAGE):
            pid = message[len(STARTED_MESSAGE) :].split(")", 1)[0]
            if pid.isascii() and pid.isdigit():
                return Worker(int(pid), entry.timestamp)
    return None


def alive(worker: Worker) -> bool:
    """Whether `worker`'s process still runs (not a zombie, not a later process under a reused pid)."""
    if not (PROC / "self").is_dir():  # no /proc here: ask the kernel whether the pid exists at all
        return _pid_exists(worker.pid)
    try:
        fields = (PROC / str(worker.pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    if fields[0] in ("Z", "X"):
        return False
    started = _boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return started <= worker.started_at + START_SLACK_S


def wait_ended(instance: DagsterInstance, run_ids: Iterable[str], timeout_s: float = 60.0) -> list[str]:
    """Wait until the worker processes of `run_ids` on this host have exited; the run ids whose
    worker still ran after `timeout_s` (empty when all exited)."""
    deadline = time.monotonic() + timeout_s
    pending = {}
    for rid in sorted(set(run_ids)):
        worker = find_worker(instance, rid)
        if worker is not None:
            pending[rid] = worker
    while pending:
        pending = {rid: w for rid, w in pending.items() if alive(w)}
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return sorted(pending)


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _boot_time() -> float:
    for line in (PROC / "stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0
