"""One serving replica: a Starlette app on uvicorn that answers predictions with a loaded model.

Routes:
- `POST /predict`: `{"instances": [[x1, ..., xn], ...]}` in, `{"predictions": [...], "model_version": v}`
  out; 400 with a message naming the problem for anything else (not JSON, no `instances`, rows that
  are not lists of numbers of the model's width).
- `GET /ready`: 200 once the model is loaded and the server listens, 503 while draining.
- `GET /metrics`: the replica's own Prometheus registry (not the process's global one, so two
  replicas in one process never mix their counts).

Metrics, for `/predict` only (probes and scrapes are not traffic): `xirang_serving_requests_total
{service,status}`, `xirang_serving_request_duration_seconds{service}`, `xirang_serving_in_flight
{service}`, and `xirang_serving_model_info{service,version}` = 1.

`Replica.start()` binds the port (0: a free one from the kernel, so two replicas never race for a
port), starts uvicorn in a thread, waits until it listens and registers the endpoint. `drain()`
deregisters first, answers `/ready` with 503, keeps answering predictions for `drain_grace_s` (a
router holding the old list still gets answers), then stops accepting connections and lets
uvicorn finish the requests in flight (at most `drain_timeout_s`). No Dagster here.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from xirang_platform.serving import registry
from xirang_platform.serving.registry import Endpoint

MAX_INSTANCES = 1024
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
PREDICT_THREADS = 4
DRAIN_GRACE_S = 1.0  # answer on after deregistering, for routers that still hold the old list
DRAIN_TIMEOUT_S = 30.0  # the most the requests in flight get to finish


class BadInput(ValueError):
    """A prediction request the model cannot answer; the message names the problem and the fix."""


@dataclass
class ReplicaMetrics:
    """The replica's Prometheus metrics, in a registry of its own."""

    service: str
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.requests = Counter(
            "xirang_serving_requests",
            "Prediction requests answered, by HTTP status",
            ["service", "status"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "xirang_serving_request_duration_seconds",
            "Time to answer a prediction request",
            ["service"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "xirang_serving_in_flight", "Prediction requests being answered", ["service"], registry=self.registry
        )
        self.model_info = Gauge(
            "xirang_serving_model_info",
            "The model version this replica serves (1)",
            ["service", "version"],
            registry=self.registry,
        )


def parse_instances(body: Any, width: int | None) -> np.ndarray:
    """The rows of a `/predict` body as a float32 matrix, or BadInput naming what is wrong."""
    if not isinstance(body, dict) or "instances" not in body:
        raise BadInput('the body must be a JSON object {"instances": [[x1, ..., xn], ...]}')
    rows = body["instances"]
    if not isinstance(rows, list) or not rows:
        raise BadInput("instances must be a non-empty list of rows (lists of numbers)")
    if len(rows) > MAX_INSTANCES:
        raise BadInput(f"{len(rows)} instances in one request; send at most {MAX_INSTANCES}")
    for i, row in enumerate(rows):
        if not isinstance(row, list) or not all(
            isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in row
        ):
            raise BadInput(f"instances[{i}] is not a list of finite numbers")
        if width is not None and len(row) != width:
            raise BadInput(f"instances[{i}] has {len(row)} values; the model takes {width}")
    return np.asarray(rows, dtype=np.float32)


def _plain(values: Any) -> list:
    return [v.item() if hasattr(v, "item") else v for v in np.asarray(values).tolist()]


class Replica:
    """A model served over HTTP under `service`, registered in `directory` while it is ready."""

    def __init__(
        self,
        service: str,
        model: Any,
        model_version: str | int,
        run_id: str,
        directory: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        drain_grace_s: float = DRAIN_GRACE_S,
        drain_timeout_s: float = DRAIN_TIMEOUT_S,
    ) -> None:
        registry.service_file(directory, service)  # the name must fit a file: fail before binding
        self.service = service
        self.model = model
        self.model_version = str(model_version)
        self.run_id = run_id
        self.directory = Path(directory)
        self.host = host
        self.port = port
        self.drain_grace_s = drain_grace_s
        self.drain_timeout_s = drain_timeout_s
        self.metrics = ReplicaMetrics(service)
        self.metrics.model_info.labels(service, self.model_version).set(1)
        self.draining = False
        self.endpoint: Endpoint | None = None
        self._width: int | None = getattr(model, "n_features_in_", None)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._in_flight = 0
        # The model runs here, off the event loop; its threads end with the drain, so the process exits
        # at once (anyio's shared pool would keep it for its idle timeout, about 10 s).
        self._predictors = ThreadPoolExecutor(PREDICT_THREADS, thread_name_prefix=f"predict-{service}")

    def app(self) -> Starlette:
        """The replica's ASGI app (what uvicorn serves)."""
        return Starlette(
            routes=[
                Route("/predict", self._predict, methods=["POST"]),
                Route("/ready", self._ready, methods=["GET"]),
                Route("/metrics", self._metrics, methods=["GET"]),
            ]
        )

    async def _predict(self, request: Request) -> Response:
        m = self.metrics
        start = time.perf_counter()
        m.in_flight.labels(self.service).inc()
        self._in_flight += 1
        try:
            try:
                rows = parse_instances(await request.json(), self._width)
            except ValueError as e:  # BadInput, and the JSON decoder's own error
                message = str(e) if isinstance(e, BadInput) else f"the body is not JSON ({e})"
                response: Response = JSONResponse({"error": message}, status_code=400)
            else:
                loop = asyncio.get_running_loop()
                predictions = await loop.run_in_executor(self._predictors, self.model.predict, rows)
                response = JSONResponse({"predictions": _plain(predictions), "model_version": self.model_version})
        finally:
            self._in_flight -= 1
            m.in_flight.labels(self.service).dec()
        m.requests.labels(self.service, str(response.status_code)).inc()
        m.duration.labels(self.service).observe(time.perf_counter() - start)
        return response

    async def _ready(self, request: Request) -> Response:
        if self.draining:
            return JSONResponse({"ready": False, "reason": "draining"}, status_code=503)
        return JSONResponse(
            {"ready": True, "service": self.service, "model_version": self.model_version, "run_id": self.run_id}
        )

    async def _metrics(self, request: Request) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def start(self, timeout_s: float = 30.0) -> Endpoint:
        """Bind, serve in a thread, wait until uvicorn listens, register; the endpoint."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted sockets only then (else ~40 ms a reply)
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as e:
            sock.close()
            raise OSError(
                f"replica of {self.service}: cannot listen on {self.host}:{self.port} ({e}); "
                "give another port, or 0 for a free one"
            ) from None
        port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app(),
            log_level="warning",
            lifespan="off",
            loop="asyncio",
            http="h11",
            timeout_graceful_shutdown=max(1, math.ceil(self.drain_timeout_s)),
            timeout_keep_alive=registry.KEEP_ALIVE_S,
        )
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name=f"replica-{self.service}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                raise RuntimeError(f"replica of {self.service}: uvicorn did not start listening on port {port}")
            time.sleep(0.01)
        host = socket.gethostname() if self.host in WILDCARD_HOSTS else self.host
        self.endpoint = Endpoint(self.service, self.run_id, host, port, self.model_version)
        registry.register(self.directory, self.endpoint)
        return self.endpoint

    def answered(self) -> int:
        """Prediction requests answered so far (any status)."""
        return int(
            sum(s.value for m in self.metrics.requests.collect() for s in m.samples if s.name.endswith("_total"))
        )

    def in_flight(self) -> int:
        """Prediction requests being answered now."""
        return self._in_flight

    def serving(self) -> bool:
        """Whether the HTTP server thread still runs."""
        return self._thread is not None and self._thread.is_alive()

    def drain(self) -> None:
        """Deregister, answer /ready with 503, keep answering for the grace, then stop once requests in
        flight are answered (uvicorn waits up to `drain_timeout_s` for them)."""
        if self.endpoint is not None:
            registry.deregister(self.directory, self.run_id, self.service)
        self.draining = True
        if self._server is None or self._thread is None:
            return
        time.sleep(self.drain_grace_s)
        self._server.should_exit = True
        self._thread.join(self.drain_timeout_s + 5.0)
        if self._thread.is_alive():  # uvicorn's graceful timeout passed: cut the rest
            self._server.force_exit = True
            self._thread.join(5.0)
        self._predictors.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Replica:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.drain()


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM does what SIGINT does (a pod's or a launcher's stop drains like a
    Dagster termination or Ctrl-C); only on the main thread, where signal handlers can be set."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    on_int = signal.getsignal(signal.SIGINT)
    previous = signal.signal(signal.SIGTERM, on_int if callable(on_int) else signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def serve_for(
    replica: Replica, seconds: float | None, poll_s: float = 0.2, stop: Callable[[], str | None] | None = None
) -> str | None:
    """Serve until `seconds` have passed (None: until interrupted) or `stop` gives a reason (a
    scale-down), then drain; returns that reason (None: the time was up). An interrupt
    (KeyboardInterrupt, Dagster's termination, SIGTERM) drains too and propagates."""
    deadline = None if seconds is None else time.monotonic() + seconds
    try:
        with sigterm_interrupts():
            while deadline is None or time.monotonic() < deadline:
                time.sleep(poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic())))
                if not replica.serving():
                    raise RuntimeError(f"replica of {replica.service}: the HTTP server stopped on its own")
                if stop is not None and (reason := stop()) is not None:
                    return reason
        return None
    finally:
        replica.drain()
