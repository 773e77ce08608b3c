"""Trace-driven load against a service: real HTTP requests spread over its ready replicas.

`run_load` replays a real inference trace (the loaders of `load/traces.py`: the SD serving
`qps.csv`, an Azure LLM trace, a plain `t,qps` file) against the replicas the registry lists:

- Time is compressed by `speed`: at wall second `w` the rate is the trace's QPS at trace time
  `start + w * speed`, times `rate_scale`. A step without a reading (lost monitoring) keeps the
  previous step's rate; a run longer than the compressed trace loops it.
- Arrivals are open-loop and deterministic: request `k` is sent when the integral of the rate reaches
  `k + 0.5`, whether or not earlier requests were answered. Latency counts from that planned send
  time, so a client or server falling behind shows in the figures instead of slowing the load.
- `Router` spreads requests over the service's ready endpoints, least requests in flight first
  (ties in turn). It rereads the registry and probes each endpoint's `/ready` every `refresh_s`;
  a request whose connection is refused, reset or closed before an answer (a replica stopping, or
  closing a kept-alive connection as the request arrives) is sent once more to another ready
  endpoint, and that endpoint is left out until it answers `/ready` again. Predictions have no side
  effects, so the resend is safe even when the replica had read the request.
- Kept-alive connections expire at the router after `KEEPALIVE_EXPIRY_S`, before the replica's
  `registry.KEEP_ALIVE_S`, so the router never reuses a connection the replica is closing for idleness.

Bad input is a `ServingLoadError` naming the problem and the fix. No Dagster here.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from xirang_platform.load.traces import DEFAULT_WINDOW_S, LoadSeries, read_load
from xirang_platform.serving import registry
from xirang_platform.serving.registry import Endpoint

DEFAULT_SPEED = 60.0
PERCENTILES = (50, 90, 99)
KEEPALIVE_EXPIRY_S = registry.KEEP_ALIVE_S / 4  # the client gives up an idle connection well before the server


class ServingLoadError(ValueError):
    """Load that cannot be sent; the message names the problem and the fix."""


@dataclass(frozen=True)
class LoadPlan:
    """A trace replayed at `speed`, scaled by `rate_scale`, for `duration_s` wall seconds."""

    series: LoadSeries
    speed: float
    rate_scale: float
    duration_s: float

    def steps(self) -> tuple[np.ndarray, np.ndarray]:
        """(wall start of each step, its request rate in QPS), missing readings filled forward."""
        series = self.series
        span = self.duration_s * self.speed
        if span > series.span_s:
            series = series.looped(span)
        qps = np.array(series.qps, dtype=float)
        for i in range(len(qps)):
            if math.isnan(qps[i]):
                qps[i] = qps[i - 1] if i else 0.0
        return (series.times - series.start) / self.speed, qps * self.rate_scale

    def arrivals(self) -> np.ndarray:
        """The planned send times (wall seconds from the start), in order."""
        starts, rates = self.steps()
        ends = np.append(starts[1:], self.duration_s)
        out: list[np.ndarray] = []
        done = 0.0  # the rate's integral up to the current step
        for begin, end, rate in zip(starts, np.minimum(ends, self.duration_s), rates, strict=True):
            if begin >= self.duration_s:
                break
            total = done + rate * (end - begin)
            if rate > 0:
                first = math.ceil(done - 0.5)
                k = np.arange(first, math.ceil(total - 0.5), dtype=float)
                out.append(begin + (k + 0.5 - done) / rate)
            done = total
        return np.concatenate(out) if out else np.zeros(0)


def plan_load(
    trace: str | Path,
    *,
    speed: float = DEFAULT_SPEED,
    rate_scale: float = 1.0,
    duration_s: float | None = None,
    window_s: float = DEFAULT_WINDOW_S,
) -> LoadPlan:
    """The plan of a trace file (its `LoadError` names a broken row); `duration_s` None: the whole
    trace once at `speed`."""
    if not (math.isfinite(speed) and speed > 0):
        raise ServingLoadError(f"--speed {speed}: give a time compression factor > 0 (60: a trace minute a second)")
    if not (math.isfinite(rate_scale) and rate_scale >= 0):
        raise ServingLoadError(f"--rate-scale {rate_scale}: give a factor >= 0 for the trace's QPS")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise ServingLoadError(f"--duration {duration_s}: give the wall seconds to send load for (> 0)")
    series = read_load(trace, window_s)
    return LoadPlan(series, speed, rate_scale, duration_s if duration_s is not None else series.span_s / speed)


def digits_bodies(count: int = 64) -> list[dict[str, Any]]:
    """Prediction bodies for the platform's digit models: one 8x8 image (64 values in [0, 1]) each."""
    from sklearn.datasets import load_digits

    images = load_digits().data[:count] / 16.0
    return [{"instances": [row.tolist()]} for row in images]


@dataclass
class Router:
    """The ready endpoints of one service and the requests in flight to each."""

    service: str
    directory: Path
    client: httpx.AsyncClient
    probe_timeout_s: float = 1.0
    ready: list[Endpoint] = field(default_factory=list)
    in_flight: Counter[Endpoint] = field(default_factory=Counter)
    seen: set[Endpoint] = field(default_factory=set)
    _turn: itertools.count = field(default_factory=itertools.count)

    async def refresh(self) -> None:
        """Reread the registry and keep the endpoints whose `/ready` answers 200."""
        listed = registry.endpoints(self.directory, self.service)
        answers = await asyncio.gather(*(self._probe(e) for e in listed))
        self.ready = [e for e, ok in zip(listed, answers, strict=True) if ok]
        self.seen.update(self.ready)

    async def _probe(self, endpoint: Endpoint) -> bool:
        try:
            response = await self.client.get(f"{endpoint.url}/ready", timeout=self.probe_timeout_s)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def pick(self, avoid: Endpoint | None = None) -> Endpoint | None:
        """The ready endpoint with the fewest requests in flight (ties in turn), or None."""
        choices = [e for e in self.ready if e != avoid]
        if not choices:
            return None
        turn = next(self._turn) % len(choices)
        rotated = choices[turn:] + choices[:turn]
        return min(rotated, key=lambda e: self.in_flight[e])

    def drop(self, endpoint: Endpoint) -> None:
        """Leave `endpoint` out until a later refresh finds it ready."""
        self.ready = [e for e in self.ready if e != endpoint]


@dataclass(frozen=True)
class Outcome:
    """One request: when it was planned (wall seconds from the start), its latency (None when it
    failed), the replica that answered or failed it, why it failed."""

    at_s: float
    latency_s: float | None
    target: str | None
    error: str | None = None


@dataclass(frozen=True)
class LoadReport:
    """What a load run sent and what came back."""

    service: str
    trace: str
    speed: float
    rate_scale: float
    duration_s: float
    planned: int
    outcomes: tuple[Outcome, ...]
    wall_s: float
    replicas_seen: int

    @property
    def ok(self) -> int:
        """Requests answered 200."""
        return sum(1 for o in self.outcomes if o.error is None)

    @property
    def errors(self) -> int:
        """Requests that failed (any status but 200, a timeout, no replica reachable)."""
        return len(self.outcomes) - self.ok

    def errors_by_reason(self) -> dict[str, int]:
        """Failed requests by reason, sorted by reason."""
        return dict(sorted(Counter(o.error for o in self.outcomes if o.error is not None).items()))

    def by_endpoint(self) -> dict[str, int]:
        """Answered requests per replica (`host:port`), sorted by target."""
        return dict(sorted(Counter(o.target for o in self.outcomes if o.error is None and o.target).items()))

    def latency_ms(self) -> dict[str, float | None]:
        """p50, p90 and p99 latency of the answered requests, in milliseconds (None without any)."""
        values = np.array([o.latency_s for o in self.outcomes if o.latency_s is not None]) * 1000.0
        return {f"p{p}": (round(float(np.percentile(values, p)), 3) if len(values) else None) for p in PERCENTILES}

    def to_dict(self) -> dict[str, Any]:
        """The figures as one JSON-ready object."""
        latency = self.latency_ms()
        return {
            "service": self.service,
            "trace": self.trace,
            "speed": self.speed,
            "rate_scale": self.rate_scale,
            "duration_s": round(self.duration_s, 3),
            "wall_s": round(self.wall_s, 3),
            "requests": len(self.outcomes),
            "requests_ok": self.ok,
            "requests_failed": self.errors,
            "errors_by_reason": self.errors_by_reason(),
            "achieved_qps": round(len(self.outcomes) / self.wall_s, 3) if self.wall_s > 0 else 0.0,
            "latency_p50_ms": latency["p50"],
            "latency_p90_ms": latency["p90"],
            "latency_p99_ms": latency["p99"],
            "replicas_seen": self.replicas_seen,
            "requests_by_replica": self.by_endpoint(),
        }


def run_load(
    service: str,
    plan: LoadPlan,
    *,
    directory: str | Path | None = None,
    bodies: Sequence[dict[str, Any]] | None = None,
    wait_ready_s: float = 10.0,
    timeout_s: float = 10.0,
    refresh_s: float = 0.5,
    max_connections: int = 100,
) -> LoadReport:
    """Send `plan`'s requests to `service`'s ready replicas and gather what came back.

    ServingLoadError when the registry has no such service, or no replica is ready within `wait_ready_s`.
    """
    where = Path(directory) if directory is not None else registry.registry_dir()
    known = registry.services(where)
    if service not in known:
        listed = ", ".join(known) if known else "none"
        raise ServingLoadError(
            f"service {service!r} has no registry file in {where} (services there: {listed}); start one of its "
            f"replicas (the inference_replica job), or point {registry.REGISTRY_ENV} at the platform's registry"
        )
    return asyncio.run(
        _run(service, plan, where, list(bodies or digits_bodies()), wait_ready_s, timeout_s, refresh_s, max_connections)
    )


async def _run(
    service: str,
    plan: LoadPlan,
    directory: Path,
    bodies: list[dict[str, Any]],
    wait_ready_s: float,
    timeout_s: float,
    refresh_s: float,
    max_connections: int,
) -> LoadReport:
    limits = httpx.Limits(
        max_connections=max_connections, max_keepalive_connections=max_connections, keepalive_expiry=KEEPALIVE_EXPIRY_S
    )
    async with httpx.AsyncClient(limits=limits, timeout=timeout_s) as client:
        router = Router(service, directory, client)
        deadline = time.monotonic() + wait_ready_s
        await router.refresh()
        while not router.ready and time.monotonic() < deadline:
            await asyncio.sleep(min(refresh_s, 0.2))
            await router.refresh()
        if not router.ready:
            raise ServingLoadError(
                f"service {service!r} has no ready replica in {directory} after {wait_ready_s:g} s; scale it up "
                "(submit an inference_replica run) and try again"
            )
        arrivals = plan.arrivals()
        loop = asyncio.get_running_loop()
        start = loop.time()
        refresher = asyncio.create_task(_keep_refreshing(router, refresh_s))
        tasks = []
        try:
            for i, at in enumerate(arrivals):
                delay = start + at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(_send(router, bodies[i % len(bodies)], start, float(at))))
            outcomes = await asyncio.gather(*tasks)
        finally:
            refresher.cancel()
        wall = loop.time() - start
    return LoadReport(
        service,
        plan.series.describe(),
        plan.speed,
        plan.rate_scale,
        plan.duration_s,
        len(arrivals),
        tuple(outcomes),
        wall,
        len(router.seen),
    )


async def _keep_refreshing(router: Router, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        await router.refresh()


async def _send(router: Router, body: dict[str, Any], start: float, at: float) -> Outcome:
    loop = asyncio.get_running_loop()
    endpoint = router.pick()
    retried = False
    while endpoint is not None:
        router.in_flight[endpoint] += 1
        try:
            response = await router.client.post(f"{endpoint.url}/predict", json=body)
        except (httpx.NetworkError, httpx.RemoteProtocolError) as e:  # refused, reset or closed: no answer came
            # a prediction changes nothing on the replica, so sending it again cannot do it twice
            router.drop(endpoint)
            if retried:
                return Outcome(at, None, endpoint.target, f"unreachable ({type(e).__name__})")
            retried = True
        except httpx.TimeoutException:
            return Outcome(at, None, endpoint.target, "timeout")
        except httpx.HTTPError as e:
            return Outcome(at, None, endpoint.target, f"transport ({type(e).__name__})")
        else:
            if response.status_code != 200:
                return Outcome(at, None, endpoint.target, f"http {response.status_code}")
            return Outcome(at, loop.time() - start - at, endpoint.target)
        finally:
            router.in_flight[endpoint] -= 1
        endpoint = router.pick(avoid=endpoint)
    return Outcome(at, None, None, "no ready replica")
