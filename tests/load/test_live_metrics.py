"""The autoscaler's two live load sources against real replicas (Starlette on uvicorn, registered in
file_sd files): scraping the replicas' own `/metrics`, and Debian's Prometheus server discovering them
through the same files and answering the sensor's query."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from sklearn.dummy import DummyClassifier

from tests.operations.ops_helpers import free_port, prometheus_server, query
from tests.waiting import wait_for
from xirang_platform.control.autoscaling_config import default_query
from xirang_platform.load.prometheus import PrometheusQuery
from xirang_platform.load.scrape import Scrape, ScrapeLoad, rate
from xirang_platform.load.traces import LoadError
from xirang_platform.serving.registry import endpoints
from xirang_platform.serving.replica import Replica

WIDTH = 4


def model() -> DummyClassifier:
    """A real (trivial) scikit-learn classifier of WIDTH features."""
    return DummyClassifier(strategy="most_frequent").fit(np.zeros((2, WIDTH)), [0, 1])


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[list[Replica]]:
    """Two ready replicas of service `sd`, registered under tmp_path/registry."""
    started = [Replica("sd", model(), 3, f"run-{i}", tmp_path / "registry", drain_grace_s=0.0) for i in (0, 1)]
    for r in started:
        r.start()
    try:
        yield started
    finally:
        for r in started:
            r.drain()


def predict(replica: Replica, n: int, rows: object = None) -> list[int]:
    """Send `n` prediction requests to `replica`; their HTTP statuses."""
    assert replica.endpoint is not None
    body = json.dumps({"instances": rows if rows is not None else [[0.0] * WIDTH]}).encode()
    statuses = []
    for _ in range(n):
        request = urllib.request.Request(
            f"{replica.endpoint.url}/predict", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                statuses.append(response.status)
        except urllib.error.HTTPError as e:
            statuses.append(e.code)
    return statuses


def key(replica: Replica) -> str:
    """How a scrape names a replica: run id @ host:port."""
    assert replica.endpoint is not None
    return f"{replica.run_id}@{replica.endpoint.target}"


def scrape_of(at: float, **counts: float) -> Scrape:
    return Scrape(at, dict(counts), targets=len(counts))


@pytest.mark.parametrize(
    ("before", "now", "want"),
    [
        pytest.param(None, scrape_of(10, a=5), None, id="the first scrape has nothing to compare with"),
        pytest.param(scrape_of(0, a=5, b=1), scrape_of(10, a=25, b=11), 3.0, id="increases summed over replicas"),
        pytest.param(scrape_of(0, a=50), scrape_of(10, a=20), 2.0, id="a counter that went down was restarted"),
        pytest.param(
            scrape_of(0, a=5), scrape_of(10, a=25, b=400), 2.0, id="a new replica counts from its next scrape"
        ),
        pytest.param(scrape_of(0, a=5), Scrape(10, {}, ("a",), 1), None, id="no replica answered: no reading"),
        pytest.param(scrape_of(0, a=5), Scrape(10, {}, (), 0), 0.0, id="no replica registered: nothing was served"),
        pytest.param(scrape_of(10, a=5), scrape_of(10, a=9), None, id="two scrapes at one instant: no reading"),
    ],
)
def test_rate_between_two_scrapes(before: Scrape | None, now: Scrape, want: float | None) -> None:
    assert rate(before, now) == want


def test_scraping_the_registered_replicas_gives_the_requests_per_second(
    replicas: list[Replica], tmp_path: Path
) -> None:
    load = ScrapeLoad("sd", tmp_path / "registry")
    assert sorted(key for key, _ in load.targets()) == sorted(
        f"run-{i}@{r.endpoint.target}" for i, r in enumerate(replicas)
    )  # type: ignore[union-attr]
    assert predict(replicas[0], 3) == [200] * 3
    first, scraped = load.read_since(None, 1000.0)
    assert first is None  # one scrape is no rate yet
    assert scraped.counts == {key(replicas[0]): 3.0, key(replicas[1]): 0.0}

    assert predict(replicas[0], 6) == [200] * 6
    assert predict(replicas[1], 4, rows="not rows") == [400] * 4  # errors are load too: every status counts
    qps, later = load.read_since(scraped.to_json(), 1005.0)
    assert qps == pytest.approx((6 + 4) / 5.0)
    assert later.failed == ()


def test_a_replica_that_stopped_answering_is_named_and_the_others_still_count(
    replicas: list[Replica], tmp_path: Path
) -> None:
    load = ScrapeLoad("sd", tmp_path / "registry")
    _, scraped = load.read_since(None, 0.0)
    gone = replicas[1]
    assert gone._server is not None
    gone._server.should_exit = True  # it crashed: still listed, no answer
    wait_for("the replica to stop", lambda: not gone.serving())
    assert predict(replicas[0], 8) == [200] * 8
    qps, later = load.read_since(scraped.to_json(), 4.0)
    assert qps == pytest.approx(2.0)
    assert later.failed == (key(gone),)


def test_the_sensors_default_query_to_prometheus_returns_the_rate_of_the_discovered_replicas(
    replicas: list[Replica], tmp_path: Path
) -> None:
    registry = tmp_path / "registry"
    scrape = f"  - job_name: serving\n    file_sd_configs: [{{files: ['{registry}/*.json'], refresh_interval: 1s}}]\n"
    with prometheus_server(tmp_path, scrape) as port:
        wait_for("both replicas scraped", lambda: len(query(port, 'up{job="serving"} == 1')) == 2)
        sent = 0

        def counted() -> bool:
            nonlocal sent
            sent += len(predict(replicas[sent % 2], 5))
            got = query(port, 'sum(xirang_serving_requests_total{service="sd"})')
            return bool(got) and float(got[0]["value"][1]) > 0 and len(query(port, default_query("sd"))) == 1

        wait_for("a rate over two scrapes", counted)
        qps = PrometheusQuery(f"http://127.0.0.1:{port}", default_query("sd"), "sd").read()
        assert qps is not None
        assert qps > 0
        assert PrometheusQuery(f"http://127.0.0.1:{port}", default_query("chat"), "chat").read() is None  # no series

        with pytest.raises(LoadError, match=r"HTTP 400: bad_data: .*parse error"):
            PrometheusQuery(f"http://127.0.0.1:{port}", "sum(rate(", "sd").read()  # the server's own error body
    with pytest.raises(LoadError, match="cannot reach Prometheus"):
        PrometheusQuery(f"http://127.0.0.1:{port}", default_query("sd"), "sd").read()  # the server is down


def test_a_drained_replica_leaves_the_registry_and_the_scrape(replicas: list[Replica], tmp_path: Path) -> None:
    replicas[1].drain()
    assert [e.run_id for e in endpoints(tmp_path / "registry", "sd")] == ["run-0"]
    assert [k for k, _ in ScrapeLoad("sd", tmp_path / "registry").targets()] == [key(replicas[0])]


def test_no_prometheus_listening_is_a_load_error_naming_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(LoadError, match=f"cannot reach Prometheus at {url}"):
        PrometheusQuery(url, default_query("sd"), "sd").read()
