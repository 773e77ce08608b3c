"""Where serving replicas register: Prometheus file-based service discovery files, one per service.

`<directory>/<service>.json` holds the service's ready replicas in the standard `file_sd_configs`
format, one target group per replica (each carries its own labels):

```json
[{"targets": ["127.0.0.1:41234"], "labels": {"service": "t1", "run_id": "3f2a...", "model_version": "2"}}]
```

A Prometheus scrape config `file_sd_configs: [{files: ["<directory>/*.json"]}]` finds every replica,
and the load generator reads the same files. Writes are atomic (a temporary file renamed over the
old one, so a reader never sees half a file) and serialised per service with an advisory lock (two
replicas registering at once both stay listed). The directory is `registry_dir()`.
No Dagster here.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REGISTRY_ENV = "XIRANG_SERVING_DIR"
DAGSTER_HOME_SUBDIR = Path("xirang-serving") / "endpoints"
# Without DAGSTER_HOME: the one `make run` uses (the Makefile's DAGSTER_HOME_DIR), seen from the
# repository root, so `xirang load` there finds the replicas of `make run` without any setting.
DEFAULT_DIR = Path(".xirang") / "dagster" / DAGSTER_HOME_SUBDIR
# A replica closes a connection idle this long; a client of the listed replicas must give it up
# sooner (uvicorn's default, 5 s, equals httpx's, so a request sent as the server closed was reset).
KEEP_ALIVE_S = 20
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class RegistryError(ValueError):
    """A registry file or entry that cannot be used; the message names the file and the fix."""


@dataclass(frozen=True, order=True)
class Endpoint:
    """One ready replica of a service: where it answers, which run it is, which model version it serves."""

    service: str
    run_id: str
    host: str
    port: int
    model_version: str

    @property
    def target(self) -> str:
        """`host:port`, as Prometheus names a scrape target."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The replica's base URL."""
        return f"http://{self.target}"


def registry_dir() -> Path:
    """The registry directory: `XIRANG_SERVING_DIR`, else `$DAGSTER_HOME/xirang-serving/endpoints`,
    else `./.xirang/dagster/xirang-serving/endpoints` (`make run`'s Dagster home)."""
    explicit = os.environ.get(REGISTRY_ENV)
    if explicit:
        return Path(explicit)
    home = os.environ.get("DAGSTER_HOME")
    return Path(home) / DAGSTER_HOME_SUBDIR if home else DEFAULT_DIR


def service_file(directory: str | Path, service: str) -> Path:
    """The file_sd file of `service` under `directory` (RegistryError for a name unfit for a file)."""
    if not _NAME.match(service):
        raise RegistryError(
            f"service name {service!r} cannot name a registry file; use letters, digits, '.', '_' and '-'"
        )
    return Path(directory) / f"{service}.json"


def register(directory: str | Path, endpoint: Endpoint) -> None:
    """List `endpoint` in its service's file, replacing an earlier entry of the same run (a run is one
    replica of one service: listed under another service before, it moves)."""
    for other in services(directory):
        if other != endpoint.service:
            deregister(directory, endpoint.run_id, other)
    with _locked(directory, endpoint.service) as path:
        kept = [e for e in _read(path) if e.run_id != endpoint.run_id]
        _write(path, [*kept, endpoint])


def deregister(directory: str | Path, run_id: str, service: str | None = None) -> bool:
    """Remove the run's entry (from `service`'s file, or from every file); whether one was listed."""
    services = [service] if service is not None else sorted({e.service for e in endpoints(directory)})
    removed = False
    for name in services:
        with _locked(directory, name) as path:
            current = _read(path)
            kept = [e for e in current if e.run_id != run_id]
            if len(kept) != len(current):
                _write(path, kept)
                removed = True
    return removed


def prune(directory: str | Path, service: str, ended: Callable[[str], bool]) -> list[Endpoint]:
    """Remove `service`'s entries whose run has `ended` (a replica killed before it could deregister:
    its target would be scraped and probed for ever); the entries removed, in file order."""
    with _locked(directory, service) as path:
        current = _read(path)
        gone = [e for e in current if ended(e.run_id)]
        if gone:
            _write(path, [e for e in current if e not in gone])
    return gone


def endpoints(directory: str | Path, service: str | None = None) -> list[Endpoint]:
    """The registered endpoints (of `service`, or of every service), sorted by service, host, port, run."""
    directory = Path(directory)
    if service is not None:
        return sorted(_read(service_file(directory, service)))
    if not directory.is_dir():
        return []
    found: list[Endpoint] = []
    for path in sorted(directory.glob("*.json")):
        found.extend(_read(path))
    return sorted(found)


def services(directory: str | Path) -> list[str]:
    """The services that have a registry file under `directory` (listed or not), sorted."""
    directory = Path(directory)
    return sorted(p.stem for p in directory.glob("*.json")) if directory.is_dir() else []


def file_sd_document(entries: list[Endpoint]) -> list[dict]:
    """The file_sd JSON document (target groups) of `entries`, in their sorted order."""
    return [
        {
            "targets": [e.target],
            "labels": {"service": e.service, "run_id": e.run_id, "model_version": e.model_version},
        }
        for e in sorted(entries)
    ]


def _read(path: Path) -> list[Endpoint]:
    if not path.exists():
        return []
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise RegistryError(f"{path}: not valid JSON ({e}); delete the file, the replicas register again") from None
    if not isinstance(doc, list):
        raise RegistryError(f"{path}: expected a file_sd list of target groups; delete the file")
    found = []
    for i, group in enumerate(doc):
        try:
            labels = group["labels"]
            for target in group["targets"]:
                host, _, port = str(target).rpartition(":")
                found.append(
                    Endpoint(
                        str(labels["service"]),
                        str(labels["run_id"]),
                        host.strip("[]"),
                        int(port),
                        str(labels.get("model_version", "")),
                    )
                )
        except (KeyError, TypeError, ValueError) as e:
            raise RegistryError(
                f"{path}: target group {i} is not targets: [host:port] with labels service and run_id ({e}); "
                "delete the file, the replicas register again"
            ) from None
    return found


def _write(path: Path, entries: list[Endpoint]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(file_sd_document(entries), f, indent=1, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def _locked(directory: str | Path, service: str) -> Iterator[Path]:
    """The service's file path, with the service's lock held (a `.lock` file beside it)."""
    path = service_file(directory, service)
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / f".{service}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield path
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
