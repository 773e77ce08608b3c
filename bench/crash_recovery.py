"""How long a crashed run holds its units: kill -9 of a run worker, and of a whole host's processes.

A real `dagster dev` deployment (the tree's `dagster.yaml`, Dagster's storage and the ledger on
PostgreSQL, the live scene's pool of four H100s; `xirang_platform/devtools/crash_scene.py`), research's
sweep runs on two H100s each, paced to last 15 minutes. Two kinds of trial:

- `worker_kill`: one running run's worker process is killed (its code server lives on);
- `host_crash`: two runs running, then every process of the deployment is killed at once (daemon,
  webserver, code servers, run workers) and `dagster dev` is started again on the same storage.

A trial's figure is the seconds from the kill until the ledger holds nothing for the killed runs
and Dagster shows them ended (for a host crash, the restart's seconds included; `restart_s` alone
beside it). A trial that reaches `--limit-s` counts as the limit (`reached_limit` says how many);
its runs are then failed by hand so that the next trial finds the pool free.

The same trials run against `--baseline-rev` (default: where this branch left `main`), checked out
with `git archive` into a temporary folder and imported from there by `dagster dev` (PYTHONPATH).

    .venv/bin/python bench/crash_recovery.py [--trials 5] [--limit-s 120] [--baseline-rev REV] [--no-baseline]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from xirang_platform.devtools import crash_scene
from xirang_platform.devtools.crash_scene import ENDED, Deployment

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PG = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"


@contextlib.contextmanager
def postgres(base_url: str) -> Iterator[tuple[str, str]]:
    """A fresh database (Dagster's storage URL) and a ledger schema in it (the ledger's URL); dropped after."""
    base = make_url(base_url)
    name = f"xirang_crash_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = base.set(database=name)
    try:
        engine = create_engine(url)
        with engine.begin() as conn:
            conn.execute(text("CREATE SCHEMA xirang_ledger"))
        engine.dispose()
        ledger = url.update_query_dict({"options": "-csearch_path=xirang_ledger"})
        yield url.render_as_string(hide_password=False), ledger.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def give_up(dep: Deployment, run_ids: list[str]) -> None:
    """Fail runs a trial left in progress (the release sensors then free their units), so the next
    trial starts on a free pool."""
    for rid in run_ids:
        run = dep.instance.get_run_by_id(rid)
        if run is not None and not run.is_finished:
            dep.instance.report_run_failed(run, "crash_recovery.py: the trial reached its limit")
    dep.wait_released(set(run_ids), 120)


def worker_kill(dep: Deployment, limit_s: float) -> float | None:
    """One trial: kill -9 a running run's worker; seconds until its units are back."""
    run = dep.submit()
    worker = dep.running_worker(run)
    began = time.monotonic()
    crash_scene.kill(worker)
    took = dep.wait_released({run}, limit_s, since=began)
    if took is None:
        give_up(dep, [run])
    return took


def host_crash(dep: Deployment, limit_s: float) -> tuple[float | None, float]:
    """One trial: two runs running, every process killed, `dagster dev` restarted; seconds until
    their units are back, and the restart's seconds."""
    runs = [dep.submit(), dep.submit()]
    for run in runs:
        dep.running_worker(run)
    began = time.monotonic()
    dep.crash()
    restart = dep.start()
    took = dep.wait_released(set(runs), limit_s, since=began)
    if took is None:
        give_up(dep, runs)
    return took, restart


def measure(code: Path, trials: int, limit_s: float, pg_url: str) -> dict[str, Any]:
    """Both kinds of trial on a deployment importing the platform from `code`."""
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="xirang-crash-"))
        dagster_url, ledger_url = stack.enter_context(postgres(pg_url))
        dep = stack.enter_context(crash_scene.deployment(Path(tmp), dagster_url, ledger_url, code))
        dep.start()
        workers = [worker_kill(dep, limit_s) for _ in range(trials)]
        hosts = [host_crash(dep, limit_s) for _ in range(trials)]
        left = sorted(r.run_id for r in dep.instance.get_runs() if r.status.value not in ENDED)
        return {
            "worker_kill": crash_scene.summary(workers, limit_s),
            "host_crash": crash_scene.summary([t for t, _ in hosts], limit_s),
            "restart_s": crash_scene.summary([r for _, r in hosts], limit_s),
            "worker_kill_s": [None if s is None else round(s, 2) for s in workers],
            "host_crash_s": [None if t is None else round(t, 2) for t, _ in hosts],
            "runs_left_unended": len(left),
        }


def extract(rev: str, into: Path) -> Path:
    """The repository as of git `rev`, unpacked under `into`."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True)
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def branch_point() -> str:
    """Where this branch left `main` (HEAD when there is no `main`)."""
    done = subprocess.run(["git", "-C", str(REPO), "merge-base", "HEAD", "main"], capture_output=True, text=True)
    return done.stdout.strip() or "HEAD"


def main() -> None:
    """Parse the options, run the trials on this tree and on the baseline, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--limit-s", type=float, default=120.0, help="a trial gives up after this many seconds")
    parser.add_argument("--baseline-rev", default=None, help="default: the branch point with main")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--postgres", default=os.environ.get("XIRANG_TEST_POSTGRES_URL", DEFAULT_PG))
    args = parser.parse_args()
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    report: dict[str, Any] = {
        "trials": args.trials,
        "limit_s": args.limit_s,
        "load_average_at_start": os.getloadavg(),
        "this_tree": {"rev": head.stdout.strip(), **measure(REPO, args.trials, args.limit_s, args.postgres)},
    }
    if not args.no_baseline:
        rev = args.baseline_rev or branch_point()
        with tempfile.TemporaryDirectory(prefix="xirang-baseline-") as tmp:
            tree = extract(rev, Path(tmp) / "tree")
            report["baseline"] = {"rev": rev[:12], **measure(tree, args.trials, args.limit_s, args.postgres)}
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
