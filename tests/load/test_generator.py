"""`xirang load` and `run_load`: a trace replayed as real HTTP requests over the ready replicas."""

from __future__ import annotations

import json
import math
import socket
import struct
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.serving.serving_helpers import running
from tests.waiting import wait_for
from xirang_platform.cli import app
from xirang_platform.load.generator import LoadReport, ServingLoadError, plan_load, run_load
from xirang_platform.load.traces import LoadError
from xirang_platform.serving import registry
from xirang_platform.serving.registry import Endpoint

REPO = Path(__file__).resolve().parents[2]
SD_TRACE = REPO / "data" / "traces" / "alibaba_genai_sd_serving_2026" / "qps.csv"
AZURE_TRACE = REPO / "data" / "traces" / "azure_llm_inference_2023" / "AzureLLMInferenceTrace_conv.csv"


def plain_trace(tmp_path: Path, rows: list[tuple[float, float]], name: str = "load.csv") -> Path:
    path = tmp_path / name
    path.write_text("t,qps\n" + "".join(f"{t},{q}\n" for t, q in rows))
    return path


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["load", *args])
    return result.exit_code, result.output


@settings(max_examples=60, deadline=None)
@given(
    rates=st.lists(st.floats(0, 50), min_size=1, max_size=8),
    speed=st.floats(0.5, 20),
    duration=st.floats(0.5, 30),
    scale=st.floats(0, 3),
)
def test_arrivals_follow_the_rate_s_integral_in_order_within_the_run(
    tmp_path_factory: pytest.TempPathFactory, rates: list[float], speed: float, duration: float, scale: float
) -> None:
    trace = plain_trace(tmp_path_factory.mktemp("t"), [(10.0 * i, q) for i, q in enumerate(rates)])
    plan = plan_load(trace, speed=speed, rate_scale=scale, duration_s=duration)
    starts, qps = plan.steps()
    ends = np.append(starts[1:], math.inf)
    expected = sum(q * max(0.0, min(e, duration) - s) for s, e, q in zip(starts, ends, qps, strict=True))
    sent = plan.arrivals()
    assert abs(len(sent) - expected) <= 1.0
    assert np.all(np.diff(sent) >= 0)
    assert len(sent) == 0 or (sent[0] >= 0 and sent[-1] < duration)


def test_time_compression_maps_trace_seconds_to_wall_seconds(tmp_path: Path) -> None:
    plan = plan_load(plain_trace(tmp_path, [(0, 1.0), (600, 3.0)]), speed=60, rate_scale=2.0, duration_s=20)
    starts, qps = plan.steps()
    assert starts.tolist() == [0.0, 10.0]
    assert qps.tolist() == [2.0, 6.0]
    assert len(plan.arrivals()) == 2 * 10 + 6 * 10


def test_a_longer_run_loops_the_trace_and_a_step_without_reading_keeps_the_last_rate(tmp_path: Path) -> None:
    sd = tmp_path / "qps.csv"  # windows of 10 s: 2 QPS, no sample at all, 4 QPS
    sd.write_text("timestamp_anon,value,container_ip,request_type\n100,2,c1,t\n125,4,c1,t\n")
    plan = plan_load(sd, speed=10, duration_s=6, window_s=10)
    starts, qps = plan.steps()
    assert starts.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert qps.tolist() == [2.0, 2.0, 4.0, 2.0, 2.0, 4.0]


def test_the_whole_trace_once_is_the_default_duration() -> None:
    plan = plan_load(AZURE_TRACE, speed=600)
    assert plan.duration_s == pytest.approx(plan.series.span_s / 600)


def test_load_over_two_replicas_spreads_requests_and_reports_percentiles(tmp_path: Path) -> None:
    plan = plan_load(plain_trace(tmp_path, [(0, 40.0), (60, 40.0)]), speed=1, duration_s=3)
    with running(tmp_path / "reg", run_id="a") as a, running(tmp_path / "reg", run_id="b") as b:
        report = run_load("digits", plan, directory=tmp_path / "reg")
        answered = (a.answered(), b.answered())
    doc = report.to_dict()
    assert (doc["requests"], doc["requests_ok"], doc["requests_failed"]) == (120, 120, 0)
    assert sum(answered) == 120
    assert min(answered) >= 40, answered
    assert sorted(doc["requests_by_replica"].values()) == sorted(answered)
    assert 0 < doc["latency_p50_ms"] <= doc["latency_p90_ms"] <= doc["latency_p99_ms"]
    assert doc["replicas_seen"] == 2
    assert [o.at_s for o in report.outcomes] == plan.arrivals().tolist()


def test_requests_the_replica_refuses_are_counted_as_errors_by_status(tmp_path: Path) -> None:
    plan = plan_load(plain_trace(tmp_path, [(0, 20.0), (60, 20.0)]), speed=1, duration_s=1)
    with running(tmp_path):
        report = run_load("digits", plan, directory=tmp_path, bodies=[{"instances": []}])
    doc = report.to_dict()
    keys = ("requests", "requests_ok", "requests_failed", "errors_by_reason", "latency_p50_ms", "requests_by_replica")
    assert {k: doc[k] for k in keys} == {
        "requests": 20,
        "requests_ok": 0,
        "requests_failed": 20,
        "errors_by_reason": {"http 400": 20},
        "latency_p50_ms": None,
        "requests_by_replica": {},
    }


def test_a_listed_replica_that_does_not_answer_gets_no_request(tmp_path: Path) -> None:
    plan = plan_load(plain_trace(tmp_path, [(0, 30.0), (60, 30.0)]), speed=1, duration_s=1)
    with running(tmp_path, run_id="alive") as alive:
        with running(tmp_path, run_id="gone") as gone:
            stale = gone.endpoint
        assert stale is not None
        registry.register(tmp_path, stale)  # a replica that died without deregistering
        report = run_load("digits", plan, directory=tmp_path)
        assert (report.ok, report.errors, alive.answered()) == (30, 0, 30)
    assert report.replicas_seen == 1


class ResettingServer:
    """A listed endpoint that answers `/ready` but resets the connection on a prediction (a replica
    that closed a kept-alive connection as the request arrived, or died while reading it)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.resets = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            while request := conn.recv(65536):
                if request.startswith(b"GET /ready"):
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                    continue
                self.resets += 1  # SO_LINGER 0: the close sends RST, so the client reads ECONNRESET
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return

    def endpoint(self) -> Endpoint:
        return Endpoint("digits", "resets", "127.0.0.1", self.port, 1)


def test_a_request_whose_connection_is_reset_is_sent_once_more_to_another_replica(tmp_path: Path) -> None:
    plan = plan_load(plain_trace(tmp_path, [(0, 30.0), (60, 30.0)]), speed=1, duration_s=1)
    resetting = ResettingServer()
    with running(tmp_path, run_id="alive") as alive:
        registry.register(tmp_path, resetting.endpoint())
        report = run_load("digits", plan, directory=tmp_path)
        answered = alive.answered()
    resetting.sock.close()
    assert resetting.resets > 0
    assert (report.ok, report.errors, answered) == (30, 0, 30), report.errors_by_reason()


def test_a_replica_draining_under_load_loses_no_request(tmp_path: Path) -> None:
    plan = plan_load(plain_trace(tmp_path, [(0, 50.0), (60, 50.0)]), speed=1, duration_s=4)
    with running(tmp_path, run_id="stays") as stays, running(tmp_path, run_id="leaves", drain_grace_s=1.0) as leaves:
        result: dict[str, LoadReport] = {}
        load = threading.Thread(target=lambda: result.setdefault("r", run_load("digits", plan, directory=tmp_path)))
        load.start()
        wait_for("the leaving replica to answer a tenth of the load", leaves.answered, done=lambda n: n >= 20)
        leaves.drain()
        load.join(60)
        served = (stays.answered(), leaves.answered())
    report = result["r"]
    assert (report.ok, report.errors) == (200, 0), report.errors_by_reason()
    assert served[1] > 0
    assert sum(served) == 200


def test_the_cli_replays_the_sd_trace_and_prints_json(tmp_path: Path) -> None:
    with running(tmp_path, run_id="a"):
        code, out = cli("digits", "--trace", str(SD_TRACE), "--speed", "3600", "--rate-scale", "4",
                        "--duration", "2", "--registry", str(tmp_path), "--json")  # fmt: skip
    assert code == 0, out
    doc = json.loads(out)
    assert doc["requests"] > 0
    assert doc["requests_failed"] == 0
    assert doc["requests"] == doc["requests_ok"]
    assert doc["trace"].startswith("qps.csv (SD serving")
    assert set(doc) >= {"latency_p50_ms", "latency_p90_ms", "latency_p99_ms", "errors_by_reason", "achieved_qps"}


def test_the_cli_prints_a_table_of_the_figures(tmp_path: Path) -> None:
    with running(tmp_path, run_id="a"):
        code, out = cli("digits", "--trace", str(AZURE_TRACE), "--speed", "600", "--duration", "1",
                        "--rate-scale", "5", "--registry", str(tmp_path))  # fmt: skip
    assert code == 0, out
    for row in ("requests", "answered (200)", "failed", "latency p50 ms", "latency p99 ms", "replicas used"):
        assert row in out


def test_a_broken_trace_row_is_a_clear_error_and_sends_nothing(tmp_path: Path) -> None:
    trace = tmp_path / "broken.csv"
    trace.write_text("t,qps\n0,5\n10,five\n")
    with running(tmp_path / "reg") as replica:
        code, out = cli("digits", "--trace", str(trace), "--registry", str(tmp_path / "reg"))
        assert replica.answered() == 0
    assert code == 2
    assert f"{trace}:3: field qps is 'five': give a number >= 0" in out
    assert "Traceback" not in out


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        pytest.param("--speed", "0", "give a time compression factor > 0", id="a speed of zero is refused"),
        pytest.param("--rate-scale", "-1", "give a factor >= 0", id="a negative rate scale is refused"),
        pytest.param("--duration", "0", "give the wall seconds to send load for", id="a zero duration is refused"),
    ],
)
def test_bad_flags_are_clear_errors(tmp_path: Path, flag: str, value: str, message: str) -> None:
    code, out = cli("digits", "--trace", str(AZURE_TRACE), flag, value, "--registry", str(tmp_path))
    assert code == 2
    assert message in out


def test_an_unknown_service_names_the_services_there(tmp_path: Path) -> None:
    registry.register(tmp_path, Endpoint("chat", "r", "127.0.0.1", 1, "1"))
    code, out = cli("digits", "--trace", str(AZURE_TRACE), "--registry", str(tmp_path))
    assert code == 2
    assert "service 'digits' has no registry file" in out
    assert "services there: chat" in out


def test_a_service_without_a_ready_replica_is_a_clear_error(tmp_path: Path) -> None:
    with running(tmp_path):
        pass  # it registered, then drained: the file stays, listing nobody
    plan = plan_load(plain_trace(tmp_path, [(0, 1.0), (1, 1.0)]), duration_s=1)
    with pytest.raises(ServingLoadError, match="has no ready replica .* after 0.5 s; scale it up"):
        run_load("digits", plan, directory=tmp_path, wait_ready_s=0.5)


def test_a_missing_trace_file_is_a_load_error(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match="no such load file"):
        plan_load(tmp_path / "nope.csv")
