"""Inference load over time (QPS), read from real traces, as a step function the autoscaler samples.

Three formats, recognised by their header (DESIGN.md section 8, `--inference-load`):
- the Alibaba SD serving `qps.csv` (`timestamp_anon,value,container_ip,request_type`): per-container
  QPS samples. Per window, each container's samples are averaged (a container reports about every
  six minutes, sometimes twice in one window) and the averages are summed over containers; the rows
  of the `API Requests` type carry no container, so they count as one container per request type.
  A window without any sample has no reading (None): the monitoring lost it, the load was not zero.
- the Azure LLM request traces (`TIMESTAMP,ContextTokens,GeneratedTokens`): one row per request,
  counted per window; QPS = count / window (an empty window is zero load: no request arrived).
- plain `t,qps`: each row's QPS holds from its `t` to the next row's (the last row for the median step).
Times are rebased so the series starts at 0. `looped(span)` repeats a series end to end to cover a
longer span (cut at its end); the loop count travels with it and `describe()` states it.
Every broken row is a `LoadError` naming the file, the line (the header is line 1), the field and the fix.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

SD_COLUMNS = ("timestamp_anon", "value", "container_ip", "request_type")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
PLAIN_COLUMNS = ("t", "qps")
DEFAULT_WINDOW_S = 600.0


class LoadError(ValueError):
    """A load file or reading that cannot be used; the message names where and the fix."""


@dataclass(frozen=True)
class LoadSeries:
    """QPS over time: `qps[i]` holds from `times[i]` until `times[i + 1]` (the last until `end`).
    NaN means no reading for that step. `loops` > 1 when the series was repeated to cover a span."""

    times: np.ndarray
    qps: np.ndarray
    end: float
    source: str
    window_s: float | None = None
    loops: int = 1

    def __post_init__(self) -> None:
        if len(self.times) == 0 or len(self.times) != len(self.qps):
            raise LoadError(f"{self.source}: a load series needs at least one (time, qps) step")
        if self.end <= self.times[-1]:
            raise LoadError(f"{self.source}: the series ends at {self.end}, before its last step {self.times[-1]}")

    @property
    def start(self) -> float:
        """When the first step begins."""
        return float(self.times[0])

    @property
    def span_s(self) -> float:
        """Seconds the series covers."""
        return self.end - self.start

    def at(self, t: float) -> float | None:
        """The QPS at time `t`: None before the start, at or past the end, or on a step without a reading."""
        if t < self.start or t >= self.end:
            return None
        value = float(self.qps[int(np.searchsorted(self.times, t, side="right")) - 1])
        return None if math.isnan(value) else value

    def peak(self) -> float:
        """The highest QPS of the series (0 when it has no reading at all)."""
        values = self.qps[~np.isnan(self.qps)]
        return float(values.max()) if len(values) else 0.0

    def looped(self, span_s: float) -> LoadSeries:
        """The series repeated end to end until it covers `span_s` seconds from its start, cut there."""
        loops = max(1, math.ceil(span_s / self.span_s - 1e-9))
        period = self.span_s
        times = np.concatenate([self.times + k * period for k in range(loops)])
        qps = np.tile(self.qps, loops)
        end = self.start + span_s
        keep = times < end
        return LoadSeries(times[keep], qps[keep], end, self.source, self.window_s, loops * self.loops)

    def describe(self) -> str:
        """One line for people: source, steps, span, and the loop when there is one."""
        step = f"{len(self.times)} steps" + (f" of {self.window_s:g} s" if self.window_s else "")
        loop = f", the trace looped {self.loops}x" if self.loops > 1 else ""
        return f"{self.source}: {step} over {self.span_s / 3600:.1f} h{loop}, peak {self.peak():.4g} QPS"


def read_load(path: str | Path, window_s: float = DEFAULT_WINDOW_S) -> LoadSeries:
    """The load series of an SD serving `qps.csv`, an Azure LLM trace or a plain `t,qps` file."""
    path = Path(path)
    if window_s <= 0:
        raise LoadError(f"window must be > 0 seconds, got {window_s}")
    if not path.is_file():
        raise LoadError(f"{path}: no such load file; give an SD serving qps.csv, an Azure LLM trace or a t,qps CSV")
    header = _header(path)
    if set(SD_COLUMNS) <= set(header):
        return read_sd_qps(path, window_s)
    if set(AZURE_COLUMNS[:1]) <= set(header) and len(header) >= 1 and header[0] == "TIMESTAMP":
        return read_azure_requests(path, window_s)
    if set(PLAIN_COLUMNS) <= set(header):
        return read_plain_qps(path)
    raise LoadError(
        f"{path}:1: header {','.join(header)!r} is not an SD serving qps.csv ({','.join(SD_COLUMNS)}), "
        f"an Azure LLM trace ({','.join(AZURE_COLUMNS)}) or a plain load file (t,qps); fix the header"
    )


def read_sd_qps(path: str | Path, window_s: float = DEFAULT_WINDOW_S) -> LoadSeries:
    """The SD serving QPS trace: per window, each container's mean QPS, summed over containers."""
    path = Path(path)
    samples: dict[tuple[int, str, str], list[float]] = defaultdict(list)
    t0: float | None = None
    last = -math.inf
    for line, row in _rows(path, SD_COLUMNS):
        t = _number(path, line, row, "timestamp_anon", minimum=None)
        if t < last:
            raise LoadError(
                f"{path}:{line}: field timestamp_anon is {row['timestamp_anon']!r}: rows must be in time order"
            )
        last = t
        t0 = t if t0 is None else t0
        value = _number(path, line, row, "value", minimum=0.0)
        window = int((t - t0) // window_s)
        samples[(window, row["container_ip"].strip(), row["request_type"].strip())].append(value)
    if t0 is None:
        raise LoadError(f"{path}: no samples; the file has a header and nothing else")
    windows = int((last - t0) // window_s) + 1
    qps = np.full(windows, np.nan)
    for (w, _, _), values in samples.items():
        mean = sum(values) / len(values)
        qps[w] = mean if math.isnan(qps[w]) else qps[w] + mean
    return _windowed(qps, window_s, f"{path.name} (SD serving, per-container QPS summed per window)")


def read_azure_requests(path: str | Path, window_s: float = DEFAULT_WINDOW_S) -> LoadSeries:
    """An Azure LLM request trace: requests counted per window, divided by the window."""
    path = Path(path)
    stamps: list[float] = []
    for line, row in _rows(path, AZURE_COLUMNS[:1]):
        raw = row["TIMESTAMP"].strip()
        try:
            t = datetime.fromisoformat(raw).timestamp()
        except ValueError:
            raise LoadError(
                f"{path}:{line}: field TIMESTAMP is {raw!r}: write a date and time like 2023-11-16 18:17:03.9799600"
            ) from None
        if stamps and t < stamps[-1]:
            raise LoadError(f"{path}:{line}: field TIMESTAMP is {raw!r}: rows must be in time order")
        stamps.append(t)
    if not stamps:
        raise LoadError(f"{path}: no requests; the file has a header and nothing else")
    offsets = np.asarray(stamps) - stamps[0]
    counts = np.bincount((offsets // window_s).astype(np.int64))
    return _windowed(counts / window_s, window_s, f"{path.name} (Azure LLM requests counted per window)")


def read_plain_qps(path: str | Path) -> LoadSeries:
    """A plain `t,qps` file: each row's QPS holds until the next row's time."""
    path = Path(path)
    times: list[float] = []
    qps: list[float] = []
    for line, row in _rows(path, PLAIN_COLUMNS):
        t = _number(path, line, row, "t", minimum=None)
        if times and t <= times[-1]:
            raise LoadError(f"{path}:{line}: field t is {row['t']!r}: times must increase from row to row")
        times.append(t)
        qps.append(_number(path, line, row, "qps", minimum=0.0))
    if not times:
        raise LoadError(f"{path}: no rows; write a header t,qps and one row per step")
    starts = np.asarray(times) - times[0]
    step = float(np.median(np.diff(starts))) if len(starts) > 1 else DEFAULT_WINDOW_S
    return LoadSeries(starts, np.asarray(qps), float(starts[-1] + step), f"{path.name} (t,qps)")


def _windowed(qps: np.ndarray, window_s: float, source: str) -> LoadSeries:
    times = np.arange(len(qps), dtype=float) * window_s
    return LoadSeries(times, qps.astype(float), len(qps) * window_s, source, window_s)


def _header(path: Path) -> list[str]:
    with path.open(encoding="utf-8", newline="") as f:
        first = f.readline()
    if not first.strip():
        raise LoadError(f"{path}:1: the file is empty; give a header line")
    return [c.strip() for c in next(csv.reader([first]))]


def _rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) of every data row; a short row or a missing column is a LoadError."""
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header = [c.strip() for c in next(reader)]
        missing = [c for c in required if c not in header]
        if missing:
            raise LoadError(f"{path}:1: header lacks {', '.join(missing)}; the header must name {','.join(required)}")
        for row in reader:
            line = reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) < len(header):
                raise LoadError(f"{path}:{line}: {len(row)} fields, the header names {len(header)}; complete the row")
            yield line, dict(zip(header, row, strict=False))


def _number(path: Path, line: int, row: dict[str, str], field: str, *, minimum: float | None) -> float:
    raw = row[field].strip()
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (minimum is not None and value < minimum):
        bound = f" >= {minimum:g}" if minimum is not None else ""
        raise LoadError(f"{path}:{line}: field {field} is {raw!r}: give a number{bound}")
    return value
