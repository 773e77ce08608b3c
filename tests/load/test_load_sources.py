"""Load sources: the real inference traces (SD serving, Azure LLM), plain t,qps, looping, broken
rows with file:line errors; and the Prometheus HTTP API against recorded real response bodies served
by a local HTTP server on loopback."""

from __future__ import annotations

import http.server
import threading
import urllib.parse
from pathlib import Path

import numpy as np
import pytest

from xirang_platform.load.prometheus import PrometheusQuery, parse_query_response
from xirang_platform.load.traces import LoadError, read_load

ROOT = Path(__file__).resolve().parents[2]
SD = ROOT / "data/traces/alibaba_genai_sd_serving_2026/qps.csv"
AZURE_CODE = ROOT / "data/traces/azure_llm_inference_2023/AzureLLMInferenceTrace_code.csv"
AZURE_CONV = ROOT / "data/traces/azure_llm_inference_2023/AzureLLMInferenceTrace_conv.csv"
BODIES = Path(__file__).resolve().parent / "prometheus_bodies"


def write(tmp_path: Path, text: str, name: str = "load.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --- real traces -------------------------------------------------------------------------------


def test_sd_serving_trace_sums_container_means_per_window():
    s = read_load(SD, window_s=600)
    assert len(s.times) == 134  # 80,313 s of samples in 600 s windows
    assert s.span_s == pytest.approx(134 * 600)
    assert np.isnan(s.qps).sum() == 12  # windows without any sample: no reading, not zero load
    # A container reports every ~114 s; averaging its samples per window keeps the sum a QPS, not a count
    # of samples: the per-window total stays within the range of its containers' reports.
    assert 10.0 < s.peak() < 11.0
    assert s.at(-1) is None
    assert s.at(s.end) is None


def test_sd_serving_first_window_by_hand(tmp_path):
    rows = [
        "0,0.09,a,Generative Requests",
        "100,0.27,a,Generative Requests",  # container a twice in window 0: mean 0.18
        "50,0.09,b,Generative Requests",
        "60,0.5,,API Requests",
        "700,1.0,a,Generative Requests",  # window 1
    ]
    rows[2], rows[1] = rows[1], rows[2]
    rows = sorted(rows, key=lambda r: float(r.split(",")[0]))
    s = read_load(write(tmp_path, "timestamp_anon,value,container_ip,request_type\n" + "\n".join(rows) + "\n"))
    assert s.qps.tolist() == pytest.approx([0.18 + 0.09 + 0.5, 1.0])


@pytest.mark.parametrize(
    ("path", "requests"),
    [pytest.param(AZURE_CODE, 8819, id="code"), pytest.param(AZURE_CONV, 19366, id="conv")],
)
def test_azure_llm_trace_counts_requests_per_window(path, requests):
    s = read_load(path, window_s=60)
    assert (s.qps * 60).sum() == pytest.approx(requests)
    assert s.window_s == 60
    assert not np.isnan(s.qps).any()


def test_plain_t_qps_steps_hold_until_the_next_row(tmp_path):
    s = read_load(write(tmp_path, "t,qps\n100,5\n160,7.5\n220,0\n"))
    assert (s.start, s.end) == (0.0, 180.0)
    assert [s.at(t) for t in (0, 59, 60, 119, 120, 179)] == [5, 5, 7.5, 7.5, 0, 0]


def test_loop_repeats_the_series_and_says_so(tmp_path):
    s = read_load(write(tmp_path, "t,qps\n0,1\n60,2\n")).looped(250)
    assert s.loops == 3
    assert s.end == 250  # cut at the span asked for
    assert [s.at(t) for t in (0, 60, 120, 180, 240, 250)] == [1, 2, 1, 2, 1, None]
    assert "looped 3x" in s.describe()
    assert read_load(SD).looped(3 * 86400).loops == 4


@pytest.mark.parametrize(
    ("text", "where"),
    [
        pytest.param("t,qps\n0,1\n60,abc\n", ":3: field qps is 'abc'", id="not-a-number"),
        pytest.param("t,qps\n0,1\n60,-2\n", ":3: field qps is '-2': give a number >= 0", id="negative-qps"),
        pytest.param("t,qps\n0,1\n0,2\n", ":3: field t is '0': times must increase", id="time-repeats"),
        pytest.param("t,qps\n0,1\n60\n", ":3: 1 fields", id="short-row"),
        pytest.param("time,load\n0,1\n", ":1: header 'time,load' is not", id="unknown-header"),
        pytest.param("t,qps\n", "no rows", id="header-only"),
        pytest.param(
            "timestamp_anon,value,container_ip,request_type\n10,0.1,a,G\n5,0.1,a,G\n",
            ":3: field timestamp_anon is '5': rows must be in time order",
            id="sd-out-of-order",
        ),
        pytest.param(
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,1,1\nyesterday,1,1\n",
            ":3: field TIMESTAMP is 'yesterday'",
            id="azure-bad-time",
        ),
    ],
)
def test_broken_rows_name_file_line_and_fix(tmp_path, text, where):
    path = write(tmp_path, text)
    with pytest.raises(LoadError) as e:
        read_load(path)
    assert str(path) in str(e.value)
    assert where in str(e.value)


def test_missing_file_names_the_formats(tmp_path):
    with pytest.raises(LoadError, match="no such load file"):
        read_load(tmp_path / "nope.csv")


# --- Prometheus ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param("docs_up_vector.json", 1.0, id="vector-summed-over-series"),
        pytest.param("sum_rate_vector.json", 0.04, id="sum-rate-one-series"),
        pytest.param("count_vector.json", 2.0, id="count-one-series"),
        pytest.param("empty_vector.json", None, id="no-series-no-reading"),
    ],
)
def test_parse_recorded_bodies(body, expected):
    value = parse_query_response((BODIES / body).read_bytes())
    assert value == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(b"<html>", "not JSON", id="not-json"),
        pytest.param((BODIES / "docs_up_matrix.json").read_bytes(), "returns a matrix", id="matrix"),
        pytest.param((BODIES / "bad_data_400.json").read_bytes(), "bad_data: invalid parameter", id="error-status"),
        pytest.param(b'{"status":"success","data":{"resultType":"scalar","result":[1,"NaN"]}}', None, id="nan"),
    ],
)
def test_parse_errors_name_the_problem(body, message):
    if message is None:
        assert parse_query_response(body) is None
        return
    with pytest.raises(LoadError, match=message):
        parse_query_response(body, "service sd query 'q'")


class _Recorded(http.server.BaseHTTPRequestHandler):
    """Serves the recorded bodies: /api/v1/query?query=<file stem> answers with that file;
    bad_data_400 comes with HTTP 400, as Prometheus sends it."""

    seen: list[dict[str, list[str]]] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        parsed = urllib.parse.urlparse(self.path)
        params = urllib.parse.parse_qs(parsed.query)
        type(self).seen.append(params)
        name = params.get("query", [""])[0]
        path = BODIES / f"{name}.json"
        if parsed.path != "/api/v1/query" or not path.is_file():
            self.send_response(404)
            self.end_headers()
            return
        body = path.read_bytes()
        self.send_response(400 if name == "bad_data_400" else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # keep the test output quiet
        pass


@pytest.fixture
def prometheus():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorded)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Recorded.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def test_prometheus_query_over_http(prometheus):
    q = PrometheusQuery(prometheus, "sum_rate_vector", service="sd")
    assert q.read(at=1783762258.028) == pytest.approx(0.04)
    assert _Recorded.seen[-1] == {"query": ["sum_rate_vector"], "time": ["1783762258.028"]}
    assert PrometheusQuery(prometheus, "docs_up_vector").read() == pytest.approx(1.0)
    assert PrometheusQuery(prometheus, "empty_vector").read() is None


def test_prometheus_http_400_carries_prometheus_error(prometheus):
    with pytest.raises(LoadError, match=r"service sd query 'bad_data_400': Prometheus answered HTTP 400: bad_data"):
        PrometheusQuery(prometheus, "bad_data_400", service="sd").read()


def test_prometheus_unreachable_says_so():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Recorded)
    port = server.server_address[1]
    server.server_close()  # nothing listens on this port any more
    with pytest.raises(LoadError, match="cannot reach Prometheus"):
        PrometheusQuery(f"http://127.0.0.1:{port}", "up", timeout_s=2).read()
