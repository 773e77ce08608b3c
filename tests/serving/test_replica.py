"""A replica served by real uvicorn on a free port: predictions, readiness, metrics, draining."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.operations.ops_helpers import parse
from tests.serving.serving_helpers import SlowModel, body, digits, digits_model, endpoint_of, get, post, running
from xirang_platform.serving import registry
from xirang_platform.serving.replica import Replica


def test_a_replica_answers_the_deployed_models_predictions(tmp_path: Path) -> None:
    x, _ = digits()
    with running(tmp_path, model_version=3) as replica:
        response = post(replica, body(rows=5, offset=1000))
    assert response.status_code == 200
    assert response.json() == {
        "predictions": digits_model().predict(x[1000:1005]).tolist(),
        "model_version": "3",
    }


def test_a_ready_replica_is_registered_under_its_service_and_says_so(tmp_path: Path) -> None:
    with running(tmp_path, run_id="run-7", service="digits", model_version=2) as replica:
        ready = get(replica, "/ready")
        assert registry.endpoints(tmp_path, "digits") == [endpoint_of(replica)]
    assert ready.status_code == 200
    assert ready.json() == {"ready": True, "service": "digits", "model_version": "2", "run_id": "run-7"}
    assert endpoint_of(replica).port != 0


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        pytest.param(b"{not json", "the body is not JSON", id="a body that is not JSON is refused"),
        pytest.param([1, 2], '"instances"', id="a body that is not an object names the expected shape"),
        pytest.param({"rows": [[0.0] * 64]}, '"instances"', id="a body without instances names the key"),
        pytest.param({"instances": []}, "non-empty list", id="no instances at all is refused"),
        pytest.param({"instances": [[0.0] * 63]}, "instances[0] has 63 values; the model takes 64", id="a short row"),
        pytest.param({"instances": [[0.0] * 64, "x"]}, "instances[1] is not a list", id="a row that is not a list"),
        pytest.param({"instances": [[0.0] * 63 + ["7"]]}, "finite numbers", id="a string among the numbers"),
        pytest.param({"instances": [[0.0] * 63 + [True]]}, "finite numbers", id="a boolean is not a number"),
        pytest.param({"instances": [[0.0] * 64] * 1025}, "at most 1024", id="too many rows in one request"),
    ],
)
def test_bad_input_is_a_400_that_names_the_problem(tmp_path: Path, payload: Any, message: str) -> None:
    with running(tmp_path) as replica:
        response = post(replica, payload)
        metrics = parse(get(replica, "/metrics").text)
    assert response.status_code == 400
    assert message in response.json()["error"]
    assert metrics["xirang_serving_requests_total"] == {(("service", "digits"), ("status", "400")): 1.0}


def test_metrics_count_requests_by_status_and_time_them(tmp_path: Path) -> None:
    with running(tmp_path, model_version=4) as replica:
        for i in range(5):
            assert post(replica, body(offset=i)).status_code == 200
        post(replica, {"instances": []})
        get(replica, "/ready")  # probes and scrapes are not traffic
        get(replica, "/metrics")
        metrics = parse(get(replica, "/metrics").text)
    service = (("service", "digits"),)
    assert metrics["xirang_serving_requests_total"] == {
        (("service", "digits"), ("status", "200")): 5.0,
        (("service", "digits"), ("status", "400")): 1.0,
    }
    assert metrics["xirang_serving_request_duration_seconds_count"] == {service: 6.0}
    assert metrics["xirang_serving_request_duration_seconds_sum"][service] > 0
    assert metrics["xirang_serving_in_flight"] == {service: 0.0}
    assert metrics["xirang_serving_model_info"] == {(("service", "digits"), ("version", "4")): 1.0}
    assert replica.answered() == 6


def test_two_replicas_in_one_process_keep_their_own_counts(tmp_path: Path) -> None:
    with running(tmp_path, run_id="a") as first, running(tmp_path, run_id="b") as second:
        post(first, body())
        post(first, body())
        post(second, body())
        assert (first.answered(), second.answered()) == (2, 1)
        assert endpoint_of(first).port != endpoint_of(second).port


def test_a_replica_drains_on_cancel_deregisters_first_and_answers_what_is_in_flight(tmp_path: Path) -> None:
    model = SlowModel(delay_s=3.0)
    with running(tmp_path, model=model, drain_grace_s=1.5) as replica:
        answer: dict[str, httpx.Response] = {}
        slow = threading.Thread(target=lambda: answer.setdefault("r", post(replica, body())))
        slow.start()
        assert model.started.wait(10)
        assert replica.in_flight() == 1
        draining = threading.Thread(target=replica.drain)
        draining.start()
        during = [get(replica, "/ready") for _ in range(2)]  # within the grace: still listening
        listed = registry.endpoints(tmp_path, "digits")
        in_flight_metric = parse(get(replica, "/metrics").text)["xirang_serving_in_flight"]
        slow.join(30)
        draining.join(60)
    assert [r.status_code for r in during] == [503, 503]
    assert during[0].json() == {"ready": False, "reason": "draining"}
    assert listed == []
    assert in_flight_metric == {(("service", "digits"),): 1.0}
    assert answer["r"].status_code == 200
    assert len(answer["r"].json()["predictions"]) == 1
    assert not replica.serving()
    with pytest.raises(httpx.ConnectError):
        get(replica, "/ready")


def test_a_taken_port_is_a_clear_error_and_registers_nothing(tmp_path: Path) -> None:
    with running(tmp_path, run_id="a") as first:
        taken = endpoint_of(first).port
        second = Replica("digits", digits_model(), 1, "b", tmp_path, port=taken)
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{taken}.*give another port, or 0"):
            second.start()
        assert [e.run_id for e in registry.endpoints(tmp_path, "digits")] == ["a"]
