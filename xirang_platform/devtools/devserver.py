"""Start and stop a real `dagster dev` (webserver, daemon, code servers) for tests, screenshots and `make run`.

No Dagster import here: `dagster dev` runs as a child process in its own session, with signal handling
reset (some harnesses start processes that ignore SIGINT/SIGTERM, which `dagster dev` inherits), and
`stop` ends every process it started: the process group, then any descendant that left it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from xirang_platform.launch.local import NO_GPU_ENVIRONMENT

REPO = Path(__file__).resolve().parents[2]
LOCATIONS_QUERY = "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus } } } }"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prepare_home(home: Path, instance_yaml: Path | None = None) -> Path:
    """A DAGSTER_HOME holding the platform's `dagster.yaml` (the repository root's unless given)."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(instance_yaml or REPO / "dagster.yaml", home / "dagster.yaml")
    return home


@dataclass
class DevServer:
    """A running `dagster dev`: its process, port and log file."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        """The UI's address."""
        return f"http://127.0.0.1:{self.port}"

    def graphql(self, query: str, variables: Mapping[str, object] | None = None, timeout: float = 30) -> dict:
        """POST one GraphQL query to the webserver and return its `data`."""
        body = json.dumps({"query": query, "variables": dict(variables or {})}).encode()
        req = urllib.request.Request(f"{self.url}/graphql", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            payload = json.loads(resp.read())
        if payload.get("errors"):
            raise RuntimeError(f"GraphQL errors: {payload['errors']}")
        return payload["data"]

    def wait_ready(self, locations: int, timeout: float = 300) -> None:
        """Wait until the webserver answers and `locations` code locations are loaded."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"dagster dev exited with {self.process.returncode}:\n{self.tail()}")
            try:
                entries = self.graphql(LOCATIONS_QUERY, timeout=10)["workspaceOrError"]["locationEntries"]
                if len(entries) >= locations and all(e["loadStatus"] == "LOADED" for e in entries):
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError, RuntimeError, KeyError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"dagster dev not ready after {timeout:.0f} s:\n{self.tail()}")
            time.sleep(1)

    def tail(self, lines: int = 40) -> str:
        """The last lines of the server's log."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL the server and everything it started at once, as a host crash would (no cleanup)."""
        pids = {self.process.pid, *descendants(self.process.pid)}
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        for pid in sorted(pids):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self, grace_s: float = 20) -> None:
        """End the server and everything it started: SIGTERM to its group, then SIGKILL to what is left."""
        pids = {self.process.pid, *descendants(self.process.pid)}
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=grace_s)
        pids |= descendants(self.process.pid)
        for pid in sorted(pids):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)


def _reset_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (read from /proc; empty where /proc is missing)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def server_environment(home: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment `dagster dev` starts with: this process's, no GPU for any run process unless
    the platform gives it one (`NO_GPU_ENVIRONMENT`), `DAGSTER_HOME`, then `env`."""
    return {**os.environ, **NO_GPU_ENVIRONMENT, "DAGSTER_HOME": str(home), **(env or {})}


def start(home: Path, *, port: int | None = None, env: Mapping[str, str] | None = None, cwd: Path = REPO) -> DevServer:
    """Start `dagster dev -w workspace.yaml` with DAGSTER_HOME=`home` on 127.0.0.1:`port` (a free one by default)."""
    port = port or free_port()
    log = home / "dagster-dev.log"
    dagster = Path(sys.executable).with_name("dagster")
    child_env = server_environment(home, env)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(dagster), "dev", "-w", str(cwd / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)],
            cwd=cwd,
            env=child_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_reset_signals,  # noqa: PLW1509 - resets inherited signal dispositions only
        )
    return DevServer(process, port, log)


@contextmanager
def running(home: Path, *, locations: int = 2, **kwargs: object) -> Iterator[DevServer]:
    """`start`, wait until ready, yield, and always `stop`."""
    server = start(home, **kwargs)  # type: ignore[arg-type]
    try:
        server.wait_ready(locations)
        yield server
    finally:
        server.stop()
