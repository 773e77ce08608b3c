"""The event log's schema (DESIGN.md section 8) and the invariant checker (section 6, invariants 1-3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.simulate.sim_builders import (
    TWO_GPU_LOG,
    admit,
    book,
    finish,
    job,
    node,
    pool,
    preempt,
    reject,
    returned,
    submit,
)
from xirang_platform.scheduling.model import Allocation, GpuSlice, NodeShare, Placement
from xirang_platform.scheduling.quota import OvercommitPolicy
from xirang_platform.simulate.events import EventLog, check_events, read_events, write_events

DESIGN_FIELDS = {
    "submit": {"job", "tenant", "project", "tier", "gpu_milli", "cpu_milli", "memory_mib"},
    "admit": {"job", "alloc", "borrowed"},
    "preempt": {"job", "by", "reason"},
    "finish": {"job"},
    "return": {"job"},
    "reject": {"job", "reason"},
}


def _log() -> EventLog:
    j = job("a", gpus=1, milli=500, cpu=2000, mem=4096, tier="inference")
    placement = Placement((GpuSlice("n0", 1, 500),), (NodeShare("n0", 2000, 4096),))
    log = EventLog()
    log.submit(0.0, j.request, j.duration_s)
    log.admit(1.0, Allocation(j.request, placement, start=1.0, borrowed=True))
    log.returned(2.0, "a", 500)
    log.preempt(3.0, "a", "b", "priority", 1.0)
    log.reject(4.0, "z", "never-fits", "too big")
    log.finish(5.0, "a")
    return log


def test_every_event_carries_t_its_kind_and_the_design_fields() -> None:
    events = _log().events
    assert [e["event"] for e in events] == ["submit", "admit", "return", "preempt", "reject", "finish"]
    for e in events:
        assert {"t", "event"} | DESIGN_FIELDS[e["event"]] <= set(e), e["event"]
    assert events[0] | {} == {
        "t": 0.0,
        "event": "submit",
        "job": "a",
        "tenant": "default",
        "project": "default",
        "tier": "inference",
        "gpu_milli": 500,
        "cpu_milli": 2000,
        "memory_mib": 4096,
        "gpus": 1,
        "milli_per_gpu": 500,
        "duration_s": 100.0,
    }
    assert events[1]["alloc"] == [{"node": "n0", "gpu": 1, "milli": 500, "gpu_memory_mib": 0}]
    assert (events[1]["borrowed"], events[1]["shares"]) == (
        True,
        [{"node": "n0", "cpu_milli": 2000, "memory_mib": 4096}],
    )


def test_the_log_refuses_to_go_back_in_time() -> None:
    log = _log()
    with pytest.raises(ValueError, match="time order"):
        log.finish(4.0, "a")
    assert len(log.events) == 6


def test_json_lines_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    _log().write(path)
    assert read_events(path) == _log().events
    assert len(path.read_text().splitlines()) == 6


@pytest.mark.parametrize(
    ("line", "message"),
    [
        pytest.param("not json", ":2: not a JSON object", id="not json"),
        pytest.param('{"t": 1, "event": "explode", "job": "a"}', ":2: an event needs", id="unknown kind"),
        pytest.param('{"event": "finish", "job": "a"}', ":2: an event needs", id="no time"),
    ],
)
def test_reading_a_bad_line_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"t": 0, "event": "finish", "job": "a"}\n' + line + "\n")
    with pytest.raises(ValueError, match=message):
        read_events(path)


# --- the invariant checker --------------------------------------------------------------------------

TWO_T4 = pool(node("n0", gpus=2, cpu=8000, mem=16384))


def test_a_consistent_log_passes_also_after_a_round_trip(tmp_path: Path) -> None:
    assert check_events(TWO_GPU_LOG, TWO_T4, book(default=2)) == []
    write_events(TWO_GPU_LOG, tmp_path / "log.jsonl")
    assert check_events(read_events(tmp_path / "log.jsonl"), TWO_T4, book(default=2)) == []


GANG_POOL = pool(
    node("n0", gpus=2, cpu=8000, mem=16384, domain="d0"),
    node("n1", gpus=2, domain="d1"),
    node("n2", model="A100", gpus=2, domain="d0"),
)

BROKEN = [
    pytest.param(
        [
            submit(0, "a", milli_per_gpu=600),
            submit(0, "b", milli_per_gpu=600),
            admit(0, "a", [("n0", 0, 600)]),
            admit(0, "b", [("n0", 0, 600)]),
        ],
        "GPU 0 of n0 holds 1200 milli > 1000",
        id="GPU over 1000 milli",
    ),
    pytest.param(
        [
            submit(0, "a", cpu=6000),
            submit(0, "b", cpu=6000),
            admit(0, "a", [("n0", 0, 1000)], cpu=6000),
            admit(0, "b", [("n0", 1, 1000)], cpu=6000),
        ],
        "n0 holds 12000 milli-CPU",
        id="node CPU over capacity",
    ),
    pytest.param(
        [
            submit(0, "a", mem=10000),
            submit(0, "b", mem=10000),
            admit(0, "a", [("n0", 0, 1000)], mem=10000),
            admit(0, "b", [("n0", 1, 1000)], mem=10000),
        ],
        "20000 MiB",
        id="node memory over capacity",
    ),
    pytest.param(
        [submit(0, "a", tier="inference"), admit(0, "a", [("n0", 0, 1000)]), preempt(700, "a", by="x")],
        "P0 (inference) preempted",
        id="P0 preempted",
    ),
    pytest.param(
        [submit(0, "a", tier="online-training"), admit(0, "a", [("n0", 0, 1000)]), preempt(700, "a", by="x")],
        "P1 preempted while in quota",
        id="P1 preempted in quota",
    ),
    pytest.param(
        [submit(0, "a", tier="online-training"), admit(0, "a", [("n0", 0, 500)])],
        "P1 allocation holds a fraction",
        id="P1 fraction of a GPU",
    ),
    pytest.param(
        [submit(0, "a", tier="online-training", gpus=2), admit(0, "a", [("n0", 0, 1000), ("n1", 0, 1000)])],
        "spans GPU models or domains",
        id="P1 gang across domains",
    ),
    pytest.param(
        [submit(0, "a", tier="online-training", gpus=2), admit(0, "a", [("n0", 0, 1000), ("n2", 0, 1000)])],
        "spans GPU models or domains",
        id="P1 gang across models",
    ),
    pytest.param(
        [submit(0, "a", tier="inference", gpus=2, tenant="small"), admit(0, "a", [("n0", 0, 1000), ("n0", 1, 1000)])],
        "small in-quota 0 + 2000 milli exceeds its cap 1200",
        id="in-quota admit past the cap",
    ),
    pytest.param(
        [submit(0, "a", tier="inference"), admit(0, "a", [("n0", 0, 1000)], borrowed=True)],
        "P0 (inference) admitted as borrowed",
        id="P0 borrowing",
    ),
    pytest.param(
        [
            submit(0, "a", gpus=2, tenant="small"),
            admit(0, "a", [("n0", 0, 1000), ("n0", 1, 1000)], borrowed=True),
            returned(10, "a", 2000),
        ],
        "exceeds its cap",
        id="return past the cap",
    ),
    pytest.param([admit(0, "a", [("n0", 0, 1000)])], "admitted while not waiting", id="admit without submit"),
    pytest.param([submit(0, "a", gpus=2), admit(0, "a", [("n0", 0, 1000)])], "does not give 2 GPUs", id="too few GPUs"),
    pytest.param(
        [submit(0, "a"), admit(0, "a", [("n0", 5, 1000)])], "no GPU 5 on node n0", id="GPU that does not exist"
    ),
    pytest.param([submit(0, "a"), finish(5, "a")], "job is not running", id="finish before admit"),
    pytest.param([submit(5, "a"), reject(1, "a")], "time goes back", id="time goes back"),
]


@pytest.mark.parametrize(("events", "problem"), BROKEN)
def test_the_checker_catches_a_broken_log(events: list[dict], problem: str) -> None:
    problems = check_events(events, GANG_POOL, book(default=6, small=1), OvercommitPolicy())
    assert any(problem in p for p in problems), problems


def test_the_checker_uses_the_cap_ratio_at_the_cluster_allocation_before_each_admit() -> None:
    # Quota 1 GPU of a 6-GPU pool: at 0% allocated the cap is 1.2 GPUs, so 1 GPU + 200 milli fit.
    events = [
        submit(0, "a"),
        submit(0, "b", milli_per_gpu=200),
        admit(0, "a", [("n0", 0, 1000)]),
        admit(0, "b", [("n0", 1, 200)]),
    ]
    assert check_events(events, GANG_POOL, book(default=1)) == []
    events[-1] = admit(0, "b", [("n0", 1, 300)])
    events[1] = submit(0, "b", milli_per_gpu=300)
    assert len(check_events(events, GANG_POOL, book(default=1))) == 1
