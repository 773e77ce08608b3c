"""`make run` as a person runs it at a terminal: its processes are one foreground process group,
it starts without Dagster's warning that the dagster.yaml in its folder is unused, and Ctrl-C (SIGINT
to that group) stops every process it started, the load generator's included (issue 31: the EXIT
trap did not run on SIGINT under /bin/sh, leaving `scripts/serve-load` and two `xirang load` running).

Its state (the Dagster home, the ledger, the load's log) goes to a temporary `XIRANG_STATE`; no model
is deployed, so the load generator keeps retrying its `xirang load` runs, as on a fresh checkout."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

from xirang_platform.devtools import devserver

REPO = Path(__file__).resolve().parents[2]
UNUSED_YAML_WARNING = "will not be used to configure Dagster"


@dataclass
class MakeRun:
    """The running `make run`: its process (the group's leader), its port, state folder and log."""

    process: subprocess.Popen[bytes]
    port: int
    state: Path
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def alive(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def everything_started(make: MakeRun) -> set[int]:
    """Every process below `make run`, the load generator's session included."""
    return {p for p in devserver.descendants(make.process.pid) if alive(p)}


def load_running(make: MakeRun) -> bool:
    """Whether `scripts/serve-load` runs with its replay loops."""
    pid_file = make.state / "load.pid"
    return pid_file.is_file() and bool(devserver.descendants(int(pid_file.read_text())))


def commands(pids: set[int]) -> list[str]:
    out = []
    for pid in sorted(pids):
        with suppress(OSError):
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            out.append(f"{pid}: {command[:120]}")
    return out


@pytest.fixture(scope="module")
def make_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MakeRun]:
    state = tmp_path_factory.mktemp("xirang-state")
    port = devserver.free_port()
    log = state / "make-run.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XIRANG_", "DAGSTER_"))}
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["make", "--no-print-directory", "run", f"PORT={port}", f"XIRANG_STATE={state}"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as a terminal's foreground job
        )
    make = MakeRun(process, port, state, log)
    started: set[int] = set()
    try:
        server = devserver.DevServer(process, port, log)
        server.wait_ready(locations=2, timeout=600)
        deadline = time.monotonic() + 600
        while not load_running(make):
            assert process.poll() is None, make.output()
            assert time.monotonic() < deadline, f"the load generator did not start:\n{make.output()}"
            time.sleep(1)
        started = everything_started(make)
        yield make
    finally:
        for pid in sorted(started | everything_started(make)):  # whatever a failed test left running
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)


def test_make_run_starts_without_dagsters_unused_dagster_yaml_warning(make_run: MakeRun) -> None:
    output = make_run.output()
    assert "Serving dagster-webserver on http://127.0.0.1:" in output
    assert UNUSED_YAML_WARNING not in output


def test_ctrl_c_stops_every_process_make_run_started(make_run: MakeRun) -> None:
    started = everything_started(make_run)
    load = int((make_run.state / "load.pid").read_text())
    assert load in started
    assert len(started) >= 8, commands(started)  # make, its shell, dagster dev's servers, the load's loops

    os.killpg(make_run.process.pid, signal.SIGINT)  # Ctrl-C: the terminal signals its foreground group

    deadline = time.monotonic() + 300
    while left := {p for p in started if alive(p)}:
        assert time.monotonic() < deadline, f"still running 300 s after Ctrl-C: {commands(left)}"
        time.sleep(0.5)
    assert make_run.process.wait(timeout=60) != 0
    assert not (make_run.state / "load.pid").exists()
