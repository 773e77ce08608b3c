"""Trace readers: the openb pod list and the ITP job list, turned into requests with durations.

Both formats are recognised by their header. Every broken row is a `TraceError` naming the file, the
line (the header is line 1), the field and the fix; nothing is returned for a file with a broken row.

Choices the simulator documents (DESIGN.md section 8):
- Times are rebased per file so that its first submit is 0, so traces from different clusters
  overlap when several `--jobs` are given; `rebase=False` (`--keep-times`) keeps the file's own clock,
  so hand-written scenarios and clusters of one collection keep their relative times.
- openb: tier from `qos` (LS -> inference, Burstable/Guaranteed -> online-training, BE ->
  offline-training) unless the `--jobs` spec names a tier. Every pod is one single-node request.
  The short header `name,cpu_milli,memory_mib,num_gpu,gpu_milli` (FGD's `multigpu*` lists) is read
  too, where no times are needed (fill mode): no `gpu_spec` means any GPU model, no `qos` means the
  `--jobs` spec's tier (default offline-training); the replay refuses it (it needs times).
  Duration is `deletion_time - creation_time`; a row without a deletion time was still running when
  the trace was cut, so it runs until the file's latest time. `pod_phase` and `scheduled_time` are
  not used: a pod that stayed Pending in the real cluster still asks for its capacity here.
- ITP: each GPU of a job brings `ITP_CPU_MILLI_PER_GPU` CPU and `ITP_MEMORY_MIB_PER_GPU` memory
  (4 cores and 16 GiB: the smallest GPU node of the openb inventory has 8 cores and 32 GiB for one
  GPU, so these fit every node). A job of more than one GPU is a gang (`single_node=False`).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from xirang_platform.base.user_input import not_utf8, shown
from xirang_platform.pool.catalog import Catalog, default_catalog
from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.model import Request, Tier

ITP_CPU_MILLI_PER_GPU = 4000
ITP_MEMORY_MIB_PER_GPU = 16384

OPENB_COLUMNS = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
OPENB_SHORT_COLUMNS = OPENB_COLUMNS[:5]
OPENB_TIMES = ("creation_time", "deletion_time")
ITP_COLUMNS = ("job_id", "submission_time", "duration", "num_gpu")

QOS_TIER = {
    "LS": Tier.INFERENCE,
    "Burstable": Tier.ONLINE_TRAINING,
    "Guaranteed": Tier.ONLINE_TRAINING,
    "BE": Tier.OFFLINE_TRAINING,
}


class TraceError(ValueError):
    """A trace file, row or `--jobs` spec that cannot be read; the message names where and the fix."""


@dataclass(frozen=True)
class TraceJob:
    """A request of a trace and how long it runs once admitted (seconds of uninterrupted work).
    `trace_gpus`: the GPUs the trace ran it on, when its request may take another size (an elastic
    replay: `duration_s` is its work at that size, `simulate/elastic.py`)."""

    request: Request
    duration_s: float
    trace_gpus: int | None = None


@dataclass(frozen=True)
class JobsSpec:
    """A parsed `--jobs FILE[:TIER[:TENANT/PROJECT]]`: tier, tenant and project are None when not given."""

    path: Path
    tier: Tier | None = None
    tenant: str | None = None
    project: str | None = None


def parse_jobs_spec(spec: str) -> JobsSpec:
    """Parse `FILE[:TIER[:TENANT/PROJECT]]`; an empty TIER (`FILE::t/p`) keeps the trace's own tier."""
    fmt = "FILE[:TIER[:TENANT/PROJECT]], e.g. cluster01.csv:online-training:research/llm"
    parts = spec.split(":")
    if len(parts) > 3:
        raise TraceError(f"--jobs {shown(spec)}: too many ':'; write {fmt}")
    path = parts[0].strip()
    if not path:
        raise TraceError(f"--jobs {shown(spec)}: no file; write {fmt}")
    tier: Tier | None = None
    if len(parts) >= 2 and parts[1].strip():
        try:
            tier = Tier(parts[1].strip())
        except ValueError:
            tiers = ", ".join(t.value for t in Tier)
            raise TraceError(f"--jobs {shown(spec)}: {shown(parts[1])} is not a tier ({tiers}); write {fmt}") from None
    tenant = project = None
    if len(parts) == 3:
        tenant, slash, project = (x.strip() for x in parts[2].partition("/"))
        if not slash or not tenant or not project or "/" in project:
            raise TraceError(f"--jobs {shown(spec)}: {shown(parts[2])} is not TENANT/PROJECT; write {fmt}")
    return JobsSpec(Path(path), tier, tenant, project)


def read_jobs(
    spec: JobsSpec,
    *,
    default_tenant: str = "default",
    default_project: str = "default",
    catalog: Catalog | None = None,
    keep_times: bool = False,
    times: bool = True,
) -> list[TraceJob]:
    """The jobs of one `--jobs` spec, in submit order, format recognised from the header
    (`catalog` names the GPU models an openb `gpu_spec` may ask for; default the bundled catalog;
    `keep_times`: the file's own clock, not rebased to its first submit). `times=False` (fill mode)
    also accepts an openb list without creation/deletion times."""
    path = spec.path
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file; give an openb pod list or an ITP job list")
    try:
        with path.open(encoding="utf-8-sig") as f:
            header = [h.strip() for h in f.readline().strip().split(",")]
    except UnicodeDecodeError as e:
        raise TraceError(not_utf8(path, e)) from None
    tenant = spec.tenant or default_tenant
    project = spec.project or default_project
    if set(ITP_COLUMNS) <= set(header):
        tier = spec.tier or Tier.OFFLINE_TRAINING
        return read_itp_jobs(path, tier=tier, tenant=tenant, project=project, rebase=not keep_times)
    if set(OPENB_SHORT_COLUMNS) <= set(header):
        return read_openb_pods(
            path, tier=spec.tier, tenant=tenant, project=project, catalog=catalog, times=times, rebase=not keep_times
        )
    raise TraceError(
        f"{path}:1: header {shown(','.join(header))} is neither an openb pod list ({','.join(OPENB_COLUMNS)}, "
        f"or {','.join(OPENB_SHORT_COLUMNS)} for fill mode) nor an ITP job list ({','.join(ITP_COLUMNS)}); "
        "fix the header"
    )


def read_openb_pods(
    path: str | Path,
    *,
    tier: Tier | None = None,
    tenant: str = "default",
    project: str = "default",
    catalog: Catalog | None = None,
    times: bool = True,
    rebase: bool = True,
) -> list[TraceJob]:
    """The pods of an openb pod list as single-node requests (tier from `qos` unless `tier` is given).

    `gpu_spec` models (`V100M16|V100M32`) become catalog names, as node models do; an unknown one is
    an error naming the line. Without a `gpu_spec` column every pod takes any model; without `qos`
    the tier is `tier` (default offline-training). `times=False` accepts a list without
    creation/deletion times (the short header of FGD's `multigpu*` lists): every pod is submitted at
    0 with no duration, which only fill mode can use; with `times=True` such a list is an error."""
    path = Path(path)
    df = _read_csv(path, OPENB_COLUMNS, required=OPENB_SHORT_COLUMNS)
    missing_times = [c for c in OPENB_TIMES if c not in df.columns]
    if missing_times and times:
        raise TraceError(
            f"{path}:1: header lacks {', '.join(missing_times)}: a replay needs each pod's creation and deletion "
            f"times; run it with --mode fill (which needs no times), or give a pod list with the header "
            f"{','.join(OPENB_COLUMNS)}"
        )
    if missing_times and len(missing_times) < len(OPENB_TIMES):
        raise TraceError(f"{path}:1: header lacks {missing_times[0]}; give both creation_time and deletion_time")
    if df.empty:
        return []
    name = _text(path, df, "name", "give every pod a name")
    _unique(path, df, name, "name")
    cpu = _integers(path, df, "cpu_milli", minimum=0)
    mem = _integers(path, df, "memory_mib", minimum=0)
    num_gpu = _integers(path, df, "num_gpu", minimum=0)
    gpu_milli = _integers(path, df, "gpu_milli", minimum=0, maximum=MILLI_PER_GPU)
    sharing = (num_gpu == 1) & (gpu_milli == 0)
    if sharing.any():
        _fail(path, df, sharing, "gpu_milli", "a one-GPU pod must ask for 1..1000 milli of it")
    tiers = _tiers(path, df, tier)
    if missing_times:
        created = deleted = np.zeros(len(df))
    else:
        created = _numbers(path, df, "creation_time", minimum=0.0)
        end_of_trace = max(float(created.max()), float(pd.to_numeric(df["deletion_time"], errors="coerce").max()))
        deleted = _numbers(path, df, "deletion_time", minimum=0.0, missing=end_of_trace)
        early = deleted < created
        if early.any():
            _fail(path, df, early, "deletion_time", "a pod is deleted at or after its creation_time")
    if "gpu_spec" in df.columns:
        models_of = _gpu_specs(path, df, catalog or default_catalog())
    else:
        models_of = [frozenset()] * len(df)
    t0 = float(created.min()) if rebase and len(created) else 0.0
    jobs: list[TraceJob] = []
    for i in range(len(df)):
        gpus = int(num_gpu[i])
        models = models_of[i]
        request = Request(
            id=name.iat[i],
            tenant=tenant,
            project=project,
            tier=tiers[i],
            submit_time=float(created[i]) - t0,
            gpus=gpus,
            milli_per_gpu=int(gpu_milli[i]) if gpus == 1 else MILLI_PER_GPU,
            cpu_milli=int(cpu[i]),
            memory_mib=int(mem[i]),
            gpu_models=models if gpus else frozenset(),
            single_node=True,
        )
        jobs.append(TraceJob(request, float(deleted[i] - created[i])))
    return _in_submit_order(jobs)


def read_itp_jobs(
    path: str | Path,
    *,
    tier: Tier = Tier.OFFLINE_TRAINING,
    tenant: str = "default",
    project: str = "default",
    cpu_milli_per_gpu: int = ITP_CPU_MILLI_PER_GPU,
    memory_mib_per_gpu: int = ITP_MEMORY_MIB_PER_GPU,
    rebase: bool = True,
) -> list[TraceJob]:
    """The jobs of an ITP job list; a job of more than one GPU is a gang over nodes of one domain."""
    path = Path(path)
    df = _read_csv(path, ITP_COLUMNS, required=ITP_COLUMNS)
    ids = _text(path, df, "job_id", "give every job an id")
    _unique(path, df, ids, "job_id")
    submit = _numbers(path, df, "submission_time", minimum=0.0)
    duration = _numbers(path, df, "duration", minimum=0.0)
    gpus = _integers(path, df, "num_gpu", minimum=0)
    t0 = float(submit.min()) if rebase and len(submit) else 0.0
    jobs = [
        TraceJob(
            Request(
                id=ids.iat[i],
                tenant=tenant,
                project=project,
                tier=tier,
                submit_time=float(submit[i]) - t0,
                gpus=int(gpus[i]),
                cpu_milli=int(gpus[i]) * cpu_milli_per_gpu or cpu_milli_per_gpu,
                memory_mib=int(gpus[i]) * memory_mib_per_gpu or memory_mib_per_gpu,
                single_node=False,
            ),
            float(duration[i]),
        )
        for i in range(len(df))
    ]
    return _in_submit_order(jobs)


def merge_traces(traces: Sequence[tuple[str, Sequence[TraceJob]]]) -> list[TraceJob]:
    """One submit-ordered job list from several (label, jobs) traces.

    With more than one trace, each job id is prefixed with its trace's label (`label/id`) so ids of
    different files cannot clash; a label used twice gets `#2`, `#3`, ...
    """
    if len(traces) == 1:
        return _in_submit_order(list(traces[0][1]))
    seen: dict[str, int] = {}
    merged: list[TraceJob] = []
    for label, jobs in traces:
        seen[label] = seen.get(label, 0) + 1
        prefix = label if seen[label] == 1 else f"{label}#{seen[label]}"
        merged.extend(replace(j, request=replace(j.request, id=f"{prefix}/{j.request.id}")) for j in jobs)
    return _in_submit_order(merged)


def limit_jobs(jobs: Iterable[TraceJob], limit: int | None) -> list[TraceJob]:
    """The first `limit` jobs in submit order (all of them when `limit` is None)."""
    ordered = _in_submit_order(list(jobs))
    return ordered if limit is None else ordered[:limit]


def _in_submit_order(jobs: list[TraceJob]) -> list[TraceJob]:
    return sorted(jobs, key=lambda j: (j.request.submit_time, j.request.id))


# --- reading helpers: every check reports the first broken row with its line number -------------


def _read_csv(path: Path, columns: Sequence[str], required: Sequence[str]) -> pd.DataFrame:
    """The rows of a trace CSV as text columns; row i is line i + 2 (a blank line is a row of empty fields).

    Every row must have exactly one field per header column: an extra or a missing field would shift
    the columns silently, so it is an error naming the line."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            reader = csv.reader(handle)
            header = [h.strip() for h in next(reader, [])]
            if not any(header):
                raise TraceError(f"{path}: the file is empty; give a header line {','.join(columns)}")
            rows = []
            for row in reader:
                if not row:
                    row = [""] * len(header)
                elif len(row) != len(header):
                    fix = "remove the extra fields" if len(row) > len(header) else "give every column a field"
                    raise TraceError(
                        f"{path}:{reader.line_num}: {len(row)} fields for {len(header)} columns "
                        f"({','.join(header)}); {fix}"
                    )
                rows.append(row)
    except UnicodeDecodeError as e:
        raise TraceError(not_utf8(path, e)) from None
    except csv.Error as e:
        raise TraceError(f"{path}: not a readable CSV ({e}); fix the file (the header is line 1)") from None
    missing = [c for c in required if c not in header]
    if missing:
        raise TraceError(f"{path}:1: header lacks {', '.join(missing)}; the header must name {','.join(columns)}")
    return pd.DataFrame(rows, columns=header, dtype=str)


def _fail(path: Path, df: pd.DataFrame, bad: np.ndarray | pd.Series, field: str, fix: str) -> None:
    rows = np.flatnonzero(np.asarray(bad))
    i = int(rows[0])
    more = f" ({len(rows) - 1} more rows like it)" if len(rows) > 1 else ""
    raise TraceError(f"{path}:{i + 2}: field {field} is {shown(df[field].iat[i])}: {fix}{more}")


def _tiers(path: Path, df: pd.DataFrame, tier: Tier | None) -> list[Tier]:
    """Each row's tier: `tier` when given, else from `qos`; without a `qos` column, offline-training."""
    if "qos" not in df.columns:
        return [tier or Tier.OFFLINE_TRAINING] * len(df)
    qos = df["qos"].str.strip()
    bad_qos = ~qos.isin(list(QOS_TIER))
    if bad_qos.any():
        _fail(path, df, bad_qos, "qos", f"write one of {', '.join(QOS_TIER)}")
    return [tier or QOS_TIER[q] for q in qos]


def _gpu_specs(path: Path, df: pd.DataFrame, catalog: Catalog) -> list[frozenset[str]]:
    """Each row's `gpu_spec` as a set of catalog model names (empty: any model)."""
    specs = df["gpu_spec"].str.strip()
    names: dict[str, frozenset[str]] = {}
    for spec in specs.unique():
        models = set()
        for part in (p.strip() for p in spec.split("|")):
            if not part:
                continue
            model = catalog.find(part)
            if model is None:
                close = catalog.suggest(part)
                hint = f"did you mean {', '.join(close)}? " if close else ""
                _fail(
                    path,
                    df,
                    specs == spec,
                    "gpu_spec",
                    f"unknown GPU model {shown(part)}; {hint}write catalog models or their aliases "
                    f"({', '.join(catalog.names)}) separated by '|', or leave it empty for any model",
                )
            else:
                models.add(model.name)
        names[spec] = frozenset(models)
    return [names[spec] for spec in specs]


def _text(path: Path, df: pd.DataFrame, field: str, fix: str) -> pd.Series:
    col = df[field].str.strip()
    empty = col == ""
    if empty.any():
        _fail(path, df, empty, field, fix)
    return col


def _unique(path: Path, df: pd.DataFrame, col: pd.Series, field: str) -> None:
    dup = col.duplicated()
    if dup.any():
        _fail(path, df, dup, field, f"the {field} appears on an earlier line; make each {field} unique")


def _numbers(path: Path, df: pd.DataFrame, field: str, *, minimum: float, missing: float | None = None) -> np.ndarray:
    raw = df[field].str.strip()
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
    blank = (raw == "").to_numpy()
    if missing is not None:
        values = np.where(blank, missing, values)
    elif blank.any():
        _fail(path, df, blank, field, f"give a number of seconds >= {minimum:g}")
    bad = ~np.isfinite(values) | (values < minimum)
    if bad.any():
        _fail(path, df, bad, field, f"give a number >= {minimum:g}")
    return values


def _integers(path: Path, df: pd.DataFrame, field: str, *, minimum: int, maximum: int | None = None) -> np.ndarray:
    values = pd.to_numeric(df[field].str.strip(), errors="coerce").to_numpy(dtype=float)
    ok = np.isfinite(values) & (values == np.round(values)) & (values >= minimum)
    if maximum is not None:
        ok &= values <= maximum
    if not ok.all():
        bound = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        _fail(path, df, ~ok, field, f"give a whole number {bound}")
    return values.astype(np.int64)
