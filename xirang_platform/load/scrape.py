"""Live inference load by scraping the replicas' own `/metrics`: the embedded default, no Prometheus server.

Each reading scrapes every replica the registry lists for the service (`xirang_platform/serving/registry.py`)
and sums its `xirang_serving_requests_total{service=...}` over statuses. The QPS is the increase
between this scrape and the previous one (the caller carries it: the autoscaling sensor keeps it in its
cursor) over the seconds between them, as Prometheus's `rate()` computes it:
- a replica in both scrapes adds (count now - count before) / seconds; a count that went down was a
  restarted counter, so its whole count is the increase (a counter reset);
- a replica new since the previous scrape adds nothing yet (its counter started before we saw it);
- a replica that does not answer is left out and named in `failed` (the others still count);
- the first scrape has nothing to compare with: no reading (None), and so has a scrape in which
  replicas are registered but none answers. No replica registered at all is a reading of 0 QPS: no
  request can have been served.
Only the standard library (urllib) and prometheus_client's own text parser are used.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from xirang_platform.serving.registry import endpoints, registry_dir

REQUESTS_METRIC = "xirang_serving_requests_total"


@dataclass(frozen=True)
class Scrape:
    """One scrape of a service's replicas: when, each answering replica's request count, who failed."""

    at: float
    counts: dict[str, float]
    failed: tuple[str, ...] = ()
    targets: int = 0

    def to_json(self) -> dict[str, Any]:
        """The scrape as the sensor's cursor keeps it."""
        return {"at": self.at, "counts": dict(sorted(self.counts.items()))}

    @classmethod
    def from_json(cls, doc: Any) -> Scrape | None:
        """A scrape back from the cursor (None for anything else)."""
        if not isinstance(doc, dict) or not isinstance(doc.get("counts"), dict):
            return None
        return cls(float(doc["at"]), {str(k): float(v) for k, v in doc["counts"].items()})


def requests_served(text: str, service: str) -> float:
    """The total of `xirang_serving_requests_total` for `service` in one exposition text."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == REQUESTS_METRIC and sample.labels.get("service") == service:
                total += sample.value
    return total


def scrape(service: str, targets: Sequence[tuple[str, str]], at: float, timeout_s: float = 2.0) -> Scrape:
    """Scrape `targets` ((key, metrics URL) pairs) for `service`'s request counts at time `at`."""
    counts: dict[str, float] = {}
    failed: list[str] = []
    for key, url in sorted(targets):
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (the registry's http URLs)
                counts[key] = requests_served(response.read().decode("utf-8"), service)
        except (urllib.error.URLError, TimeoutError, OSError, ValueError):
            failed.append(key)
    return Scrape(at, counts, tuple(failed), len(targets))


def rate(before: Scrape | None, now: Scrape) -> float | None:
    """Requests per second between two scrapes (module docstring); None when there is no reading."""
    if now.targets == 0:
        return 0.0
    if before is None or not now.counts or now.at <= before.at:
        return None
    increase = 0.0
    for key, count in now.counts.items():
        if key in before.counts:
            previous = before.counts[key]
            increase += count - previous if count >= previous else count
    return increase / (now.at - before.at)


@dataclass(frozen=True)
class ScrapeLoad:
    """A service's load from its replicas' `/metrics`, found in the registry folder `directory`."""

    service: str
    directory: Path | None = None
    timeout_s: float = 2.0

    def targets(self) -> list[tuple[str, str]]:
        """(key, metrics URL) of every registered replica of the service."""
        found = endpoints(self.directory or registry_dir(), self.service)
        return [(f"{e.run_id}@{e.target}", f"{e.url}/metrics") for e in found]

    def read_since(self, previous: Any, at: float) -> tuple[float | None, Scrape]:
        """The QPS since the `previous` scrape (its cursor form, or None) and this scrape."""
        now = scrape(self.service, self.targets(), at, self.timeout_s)
        return rate(Scrape.from_json(previous), now), now
