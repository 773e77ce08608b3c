"""The simulator's inputs: the pool, the quota book and the jobs, from files or the bundled traces.

`xirang simulate` (`cli/simulate.py`), the Dagster replay asset (`definitions.py`) and the placement
bench read their inputs here. Every reader names the file and the fix when an input is unusable.
"""

from __future__ import annotations

from pathlib import Path

import xirang_platform
from xirang_platform.base.user_input import print_error, shown
from xirang_platform.pool.catalog import Catalog, default_catalog
from xirang_platform.pool.model import Pool
from xirang_platform.scheduling.model import Request
from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.simulate.traces import TraceJob, merge_traces, parse_jobs_spec, read_jobs

OPENB = Path("data/traces/alibaba_openb_gpu_2023")
DEFAULT_NODES = OPENB / "openb_node_list_gpu_node.csv"
DEFAULT_JOBS = OPENB / "openb_pod_list_default.csv"


class SimulateError(ValueError):
    """Simulator input that cannot be used; the message names it and the fix."""


def repo_root() -> Path:
    """The repository root, found from the package's location (the bundled traces live under it)."""
    return Path(xirang_platform.__file__).resolve().parents[1]


def bundled(relative: Path) -> Path:
    """A bundled trace file, or a clear error when the checkout lacks it."""
    path = repo_root() / relative
    if not path.is_file():
        raise SimulateError(
            f"the bundled trace {relative} is not at {path}; run from a repository checkout "
            "or give --nodes and --jobs explicitly"
        )
    return path


def load_pool(nodes: Path | None, domain_size: int) -> Pool:
    """The pool of `--nodes` (YAML inventory or openb node CSV), or the bundled openb GPU nodes."""
    from xirang_platform.pool.openb_csv import read_openb_nodes
    from xirang_platform.pool.readers import read_pool

    if nodes is None:
        return read_openb_nodes(bundled(DEFAULT_NODES), domain_size=domain_size, unit_milli=1)
    return read_pool(nodes, domain_size=domain_size, unit_milli=1)


def load_book(tenants: Path | None, pool: Pool) -> QuotaBook:
    """The quota book of `--tenants`, or one tenant owning the whole pool."""
    from xirang_platform.control.tenants import default_book, read_tenants

    return default_book(pool.gpu_milli) if tenants is None else read_tenants(tenants, pool.gpu_milli)


def load_jobs(
    specs: list[str],
    book: QuotaBook,
    *,
    tenants_given: bool,
    catalog: Catalog | None = None,
    keep_times: bool = False,
    times: bool = True,
) -> list[TraceJob]:
    """The jobs of every `--jobs` spec (the bundled openb pods when none), merged in submit order;
    `catalog` names the GPU models a pod may ask for; `keep_times` keeps each file's own clock;
    `times=False` (fill mode) accepts openb lists without times. A file without jobs is a warning."""
    if not specs:
        specs = [str(bundled(DEFAULT_JOBS))]
    accounts = sorted(book.projects)
    traces = []
    for raw in specs:
        spec = parse_jobs_spec(raw)
        if spec.tenant is None:
            if tenants_given and len(accounts) != 1:
                known = ", ".join(f"{t}/{p}" for t, p in accounts)
                raise SimulateError(
                    f"--jobs {shown(raw)}: the tenants file has several accounts ({known}); "
                    "say whose jobs these are with FILE:TIER:TENANT/PROJECT (TIER may be empty: FILE::t/p)"
                )
            tenant, project = accounts[0]
        else:
            if not tenants_given:
                raise SimulateError(
                    f"--jobs {shown(raw)} names tenant {spec.tenant}; give their quotas with --tenants FILE"
                )
            if not book.knows(spec.tenant, spec.project or ""):
                known = ", ".join(f"{t}/{p}" for t, p in accounts)
                raise SimulateError(
                    f"--jobs {shown(raw)}: no account {spec.tenant}/{spec.project} in --tenants; known: {known}"
                )
            tenant, project = spec.tenant, spec.project or ""
        found = read_jobs(
            spec, default_tenant=tenant, default_project=project, catalog=catalog, keep_times=keep_times, times=times
        )
        if not found:
            print_error(f"{spec.path}: no jobs in it (a header only); it adds nothing to the replay", prefix="warning")
        traces.append((spec.path.stem, found))
    return merge_traces(traces)


def pool_catalog(pool: Pool) -> Catalog:
    """The GPU catalog with the pool's own models (a YAML inventory's `models:`) added."""
    catalog = default_catalog()
    extra = {n.model.name: n.model for n in pool.nodes if n.model is not None and catalog.find(n.model.name) is None}
    return catalog.extended((m, []) for m in extra.values()) if extra else catalog


def load_openb(nodes_csv: str | Path, pods_csv: str | Path) -> tuple[Pool, list[Request]]:
    """The openb pool of fill mode (any milli of a GPU may be taken) and its pods as requests, sorted by name."""
    from xirang_platform.pool.openb_csv import read_openb_nodes
    from xirang_platform.simulate.traces import read_openb_pods

    pool = read_openb_nodes(nodes_csv, domain_size=8, unit_milli=1)
    pods = sorted((job.request for job in read_openb_pods(pods_csv, times=False)), key=lambda r: r.id)
    return pool, pods
