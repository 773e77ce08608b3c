"""Builders of the serving tests: a real digits model, a model that answers slowly, a running replica."""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression

from xirang_platform.serving.registry import Endpoint
from xirang_platform.serving.replica import Replica


@functools.cache
def digits() -> tuple[np.ndarray, np.ndarray]:
    """The digits images (scaled to [0, 1]) and labels."""
    data = load_digits()
    return (data.data / 16.0).astype(np.float32), data.target


@functools.cache
def digits_model() -> LogisticRegression:
    """A real classifier of the platform's kind, trained on the first 600 digits."""
    x, y = digits()
    return LogisticRegression(max_iter=300).fit(x[:600], y[:600])


class SlowModel:
    """`digits_model()` that takes `delay_s` per prediction and says when one started."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.n_features_in_ = digits_model().n_features_in_
        self.started = threading.Event()

    def predict(self, rows: np.ndarray) -> Any:
        self.started.set()
        time.sleep(self.delay_s)
        return digits_model().predict(rows)


def body(rows: int = 1, offset: int = 0) -> dict[str, Any]:
    """A /predict body of `rows` digit images."""
    x, _ = digits()
    return {"instances": x[offset : offset + rows].tolist()}


@contextlib.contextmanager
def running(directory: Path, run_id: str = "run-1", service: str = "digits", **kw: Any) -> Iterator[Replica]:
    """A started replica (real uvicorn on a free port), drained on exit if still serving."""
    kw.setdefault("model", digits_model())
    kw.setdefault("model_version", 1)
    kw.setdefault("drain_grace_s", 0.2)
    replica = Replica(service, kw.pop("model"), kw.pop("model_version"), run_id, directory, **kw)
    replica.start()
    try:
        yield replica
    finally:
        if replica.serving():
            replica.drain()


def endpoint_of(replica: Replica) -> Endpoint:
    """The endpoint a started replica registered."""
    assert replica.endpoint is not None
    return replica.endpoint


def get(replica: Replica, path: str) -> httpx.Response:
    """GET `path` of the replica."""
    return httpx.get(endpoint_of(replica).url + path, timeout=10)


def post(replica: Replica, payload: Any, path: str = "/predict") -> httpx.Response:
    """POST `payload` (JSON; bytes as they are) to the replica."""
    url = endpoint_of(replica).url + path
    if isinstance(payload, bytes):
        return httpx.post(url, content=payload, timeout=10)
    return httpx.post(url, json=payload, timeout=10)
