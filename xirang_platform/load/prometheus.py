"""Live inference load from the Prometheus HTTP API (`GET /api/v1/query`, an instant query).

Each service names its own PromQL query (for example
`sum(rate(http_requests_total{service="sd"}[1m]))`). The response is the API's JSON envelope
(`{"status": "success", "data": {"resultType": ..., "result": ...}}`):
- `vector`: the samples' values are summed (a query without `sum()` over several pods still gives
  the service's total); an empty vector is no reading (None): the series is absent, not zero;
- `scalar`: its value;
- a `NaN` or infinite sample is no reading; `matrix` and `string` results are errors that say to
  write an instant query that returns a number.
An HTTP error, a non-JSON body or `"status": "error"` is a `LoadError` that names the service, the
query and Prometheus's own `errorType`/`error`. Only the standard library is used (urllib).
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from xirang_platform.load.traces import LoadError


@dataclass(frozen=True)
class PrometheusQuery:
    """Where a service's load comes from: the server's base URL (`http://host:9090`) and a PromQL query."""

    base_url: str
    query: str
    service: str = ""
    timeout_s: float = 5.0

    def url(self, at: float | None = None) -> str:
        """The `/api/v1/query` URL of this query, evaluated at unix time `at` (None: the server's now)."""
        params = {"query": self.query}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return f"{self.base_url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode(params)}"

    def read(self, at: float | None = None) -> float | None:
        """The service's QPS now (or at unix time `at`); None when Prometheus has no sample for it."""
        url = self.url(at)
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as response:  # noqa: S310 (http(s) base URL)
                body = response.read()
        except urllib.error.HTTPError as e:
            body = e.read()
            raise LoadError(f"{self._who()}: Prometheus answered HTTP {e.code}: {_error_text(body)}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise LoadError(
                f"{self._who()}: cannot reach Prometheus at {self.base_url} ({reason}); check the URL and that it runs"
            ) from None
        return parse_query_response(body, self._who())

    def _who(self) -> str:
        name = f"service {self.service} " if self.service else ""
        return f"{name}query {self.query!r}"


def parse_query_response(body: bytes | str, who: str = "query") -> float | None:
    """The number an instant-query response body holds (see the module docstring); None for no reading."""
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise LoadError(f"{who}: the response is not JSON; point the URL at the Prometheus server itself") from None
    if not isinstance(doc, dict) or "status" not in doc:
        raise LoadError(f"{who}: the response has no `status`; is the URL a Prometheus /api/v1 endpoint?")
    if doc["status"] != "success":
        raise LoadError(f"{who}: Prometheus says {_error_text(doc)}; fix the query")
    data = doc.get("data")
    if not isinstance(data, dict) or "resultType" not in data:
        raise LoadError(f"{who}: the response has no data.resultType; is this an /api/v1/query response?")
    kind, result = data["resultType"], data.get("result")
    if kind == "vector":
        if not isinstance(result, list):
            raise LoadError(f"{who}: a vector result must be a list of samples")
        if not result:
            return None
        values = [_sample(who, s.get("value") if isinstance(s, dict) else None) for s in result]
        return None if any(v is None for v in values) else sum(v for v in values if v is not None)
    if kind == "scalar":
        return _sample(who, result)
    raise LoadError(
        f"{who}: the query returns a {kind}, not a number; write an instant query that returns one, "
        'e.g. sum(rate(http_requests_total{service="..."}[1m]))'
    )


def _sample(who: str, pair: object) -> float | None:
    if not isinstance(pair, list) or len(pair) != 2:
        raise LoadError(f'{who}: a sample must be [<unix_time>, "<value>"], got {pair!r}')
    try:
        value = float(pair[1])
    except (TypeError, ValueError):
        raise LoadError(f"{who}: sample value {pair[1]!r} is not a number") from None
    return value if math.isfinite(value) else None


def _error_text(body: bytes | dict) -> str:
    """Prometheus's own `errorType: error` when the body carries them, else the start of the body."""
    doc: object = body
    if isinstance(body, bytes):
        try:
            doc = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return repr(body[:200])
    if isinstance(doc, dict) and "error" in doc:
        return f"{doc.get('errorType', 'error')}: {doc['error']}"
    return repr(doc)[:200]
