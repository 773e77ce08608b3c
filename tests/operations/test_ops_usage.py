"""Usage and chargeback rebuilt from the ledger's entries, against the ledger's own history (the
allocation rows' reserve, return and release times) to the GPU-second."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from dagster import materialize
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from typer.testing import CliRunner

from resources.gpu_pool import GpuPoolResource
from tests.ledger.ledger_helpers import SetClock as Clock
from tests.ledger.ledger_helpers import alloc
from xirang_platform.cli import app
from xirang_platform.cli.operations import usage_days
from xirang_platform.dagster_defs.assets.usage import gpu_usage
from xirang_platform.ledger import Ledger
from xirang_platform.ledger.tables import ALLOCATIONS
from xirang_platform.operations.usage import POOL, UsageRow, usage
from xirang_platform.scheduling.model import PreemptReason

DAY1 = date(2026, 11, 30)
T0 = datetime(2026, 11, 30, 22, 0, tzinfo=UTC).timestamp()  # two hours before midnight
HOUR = 3600.0
POOL_FILE = Path(__file__).resolve().parents[1] / "dagster" / "pool.yaml"


@pytest.fixture
def clock() -> Clock:
    return Clock(T0 - HOUR)


@pytest.fixture
def ledger(tmp_path: Path, clock: Clock) -> Iterator[Ledger]:
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}", clock=clock)
    ledger.add_tenant("acme", 4000)
    ledger.add_project("acme", "vision")
    ledger.add_tenant("beta", 4000)
    ledger.add_project("beta", "ranking")
    yield ledger
    ledger.close()


def history(ledger: Ledger, until: float) -> dict[tuple[str, str], tuple[float, float]]:
    """(tenant, project) -> (in-quota, borrowed) GPU-seconds from the allocation rows alone."""
    out: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    with ledger.engine.connect() as conn:
        for r in conn.execute(select(ALLOCATIONS)):
            end = r.released_at if r.released_at is not None else until
            gpus = r.milli / 1000
            if r.returned_at is not None:  # borrowed until its return, in quota after
                out[(r.tenant, r.project)][1] += gpus * (r.returned_at - r.reserved_at)
                out[(r.tenant, r.project)][0] += gpus * (end - r.returned_at)
            else:
                out[(r.tenant, r.project)][1 if r.borrowed else 0] += gpus * (end - r.reserved_at)
    return {k: (v[0], v[1]) for k, v in out.items()}


def summed(rows: list[UsageRow]) -> dict[tuple[str, str], tuple[float, float]]:
    out: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in rows:
        if r.project:
            out[(r.tenant, r.project)][0] += r.in_quota_s
            out[(r.tenant, r.project)][1] += r.borrowed_s
    return {k: (v[0], v[1]) for k, v in out.items()}


def test_a_scripted_day_across_midnight_charges_in_quota_borrowed_lent_and_preempted(
    ledger: Ledger, clock: Clock
) -> None:
    # 22:00 acme takes its 4 GPUs in quota; 23:00 2 more, past its 4.8-GPU cap: borrowed out of beta's
    # idle quota; 00:00 beta takes its 4 GPUs (no idle quota left: the borrow is the pool's); 01:00
    # beta reclaims the borrowed 2 GPUs; 02:00 acme's in-quota run ends; beta's runs on.
    clock.t = T0
    ledger.reserve(alloc("a1", "acme", "vision", gpus=4))
    clock.t = T0 + HOUR
    ledger.reserve(alloc("a2", "acme", "vision", gpus=2, node="n1"))
    clock.t = T0 + 2 * HOUR
    ledger.reserve(alloc("b1", "beta", "ranking", gpus=4, node="n2"))
    clock.t = T0 + 3 * HOUR
    ledger.preempt("a2", by="b2", reason=PreemptReason.RECLAIM)
    clock.t = T0 + 4 * HOUR
    ledger.release("a1")
    until = T0 + 6 * HOUR

    rows = usage(ledger.entries(), DAY1, date(2026, 12, 1), until, checkpoint_interval_s=1800)

    got = {(r.day.isoformat(), r.tenant, r.project): r.as_dict() for r in rows}
    assert sorted(got) == [
        ("2026-11-30", "acme", "vision"),
        ("2026-11-30", "beta", ""),
        ("2026-12-01", "acme", "vision"),
        ("2026-12-01", "beta", "ranking"),
    ]
    day1, day2 = got[("2026-11-30", "acme", "vision")], got[("2026-12-01", "acme", "vision")]
    assert (day1["in_quota_gpu_h"], day1["borrowed_gpu_h"], day1["borrowed_from_gpu_h"]) == (8.0, 2.0, {"beta": 2.0})
    assert got[("2026-11-30", "beta", "")]["lent_gpu_h"] == 2.0
    assert (day2["in_quota_gpu_h"], day2["borrowed_gpu_h"], day2["borrowed_from_gpu_h"]) == (8.0, 2.0, {POOL: 2.0})
    # a2 held 2 GPUs for 2 h when it was reclaimed; with a checkpoint every 30 min nothing since its last
    # checkpoint was lost (it ran exactly 4 intervals).
    assert (day2["preempted_gpu_h"], day2["lost_gpu_h"]) == (4.0, 0.0)
    assert got[("2026-12-01", "beta", "ranking")]["in_quota_gpu_h"] == 16.0
    for key, (in_quota, borrowed) in history(ledger, until).items():
        assert summed(rows)[key] == pytest.approx((in_quota, borrowed), abs=1.0)  # to the GPU-second


def test_without_checkpoints_a_preempted_run_loses_all_it_ran(ledger: Ledger, clock: Clock) -> None:
    clock.t = T0
    ledger.reserve(alloc("b1", "beta", "ranking", gpus=1))
    clock.t = T0 + 1.5 * HOUR
    ledger.preempt("b1", by="x", reason=PreemptReason.PRIORITY)
    rows = usage(ledger.entries(), DAY1, DAY1, T0 + 2 * HOUR)
    assert [(r.preempted_s, r.lost_s) for r in rows] == [(1.5 * HOUR, 1.5 * HOUR)]


def test_a_day_with_no_usage_gives_an_empty_labelled_report(ledger: Ledger, tmp_path: Path) -> None:
    assert usage(ledger.entries(), DAY1, DAY1, T0) == []
    result = CliRunner().invoke(
        app, ["usage", "--from", "2026-11-30", "--to", "2026-11-30", "--ledger-url", ledger.url, "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {
        "from": "2026-11-30",
        "to": "2026-11-30",
        "rows": [],
        "totals": {
            "in_quota_gpu_h": 0.0,
            "borrowed_gpu_h": 0.0,
            "lent_gpu_h": 0.0,
            "preempted_gpu_h": 0.0,
            "lost_gpu_h": 0.0,
            "resizes": 0.0,
        },
    }
    text = CliRunner().invoke(app, ["usage", "--from", "2026-11-30", "--to", "2026-11-30", "--ledger-url", ledger.url])
    assert "no GPU usage recorded from 2026-11-30 to 2026-11-30" in text.output


def test_usage_refuses_days_in_the_wrong_order_and_bad_dates(ledger: Ledger) -> None:
    runner = CliRunner()
    wrong = runner.invoke(app, ["usage", "--from", "2026-12-02", "--to", "2026-12-01", "--ledger-url", ledger.url])
    assert wrong.exit_code == 1
    assert "before the first" in wrong.output
    bad = runner.invoke(app, ["usage", "--from", "yesterday", "--to", "2026-12-01", "--ledger-url", ledger.url])
    assert bad.exit_code != 0
    assert "YYYY-MM-DD" in bad.output


OPS = st.lists(
    st.tuples(
        st.sampled_from(["reserve", "release", "preempt", "return"]),
        st.sampled_from(["acme", "beta"]),
        st.integers(1, 4),
        st.floats(60, 20 * HOUR),
    ),
    max_size=12,
)


@settings(max_examples=30, deadline=None)
@given(OPS)
def test_usage_equals_the_ledgers_history_and_lenders_lend_only_what_they_have(tmp_path_factory, ops) -> None:
    clock = Clock(T0)
    ledger = Ledger(f"sqlite:///{tmp_path_factory.mktemp('u') / 'ledger.sqlite'}", clock=clock)
    ledger.add_tenant("acme", 4000)
    ledger.add_project("acme", "vision")
    ledger.add_tenant("beta", 4000)
    ledger.add_project("beta", "ranking")
    live: list[str] = []
    for i, (op, tenant, gpus, gap) in enumerate(ops):
        clock.t += gap
        project = "vision" if tenant == "acme" else "ranking"
        if op == "reserve":
            r = ledger.reserve(alloc(f"r{i}", tenant, project, gpus=gpus, node=f"n{i}"))
            if r.admitted:
                live.append(f"r{i}")
        elif live and op in ("release", "preempt"):
            rid = live.pop(gpus % len(live))
            if op == "release":
                ledger.release(rid)
            else:
                ledger.preempt(rid, by="x", reason=PreemptReason.RECLAIM)
        elif op == "return":
            ledger.return_borrowed(tenant)
    until = clock.t + HOUR
    first = datetime.fromtimestamp(T0, UTC).date()
    rows = usage(ledger.entries(), first, datetime.fromtimestamp(until, UTC).date(), until)
    want = history(ledger, until)
    got = summed(rows)
    for key in set(want) | set(got):
        assert got.get(key, (0.0, 0.0)) == pytest.approx(want.get(key, (0.0, 0.0)), abs=1.0)
    lent = sum(r.lent_s for r in rows)
    from_tenants = sum(v for r in rows for k, v in r.borrowed_from_s.items() if k != POOL)
    assert lent == pytest.approx(from_tenants, abs=1e-6)
    for r in rows:
        assert sum(r.borrowed_from_s.values()) == pytest.approx(r.borrowed_s, abs=1e-6)
        # A tenant lends at most its whole quota's worth over a day.
        assert r.lent_s <= 4 * 86_400 + 1e-6
    ledger.close()


# -- the asset ------------------------------------------------------------------------------------------


def test_the_gpu_usage_asset_of_a_day_holds_the_days_rows_and_an_empty_day_says_so(
    ledger: Ledger, clock: Clock, tmp_path: Path
) -> None:
    clock.t = T0
    ledger.reserve(alloc("a1", "acme", "vision", gpus=2))
    clock.t = T0 + HOUR
    ledger.release("a1")
    config = tmp_path / "xirang.yaml"
    config.write_text(
        f"pool: {POOL_FILE}\nledger_url: {ledger.url}\n"
        "tenants:\n  acme: {quota_gpus: 4, projects: {vision: {}}}\n  beta: {quota_gpus: 4, projects: {ranking: {}}}\n",
        encoding="utf-8",
    )
    resources = {"gpu_pool": GpuPoolResource(config_path=str(config))}

    busy = materialize([gpu_usage], partition_key=DAY1.isoformat(), resources=resources)
    quiet = materialize([gpu_usage], partition_key="2026-11-29", resources=resources)

    meta = busy.asset_materializations_for_node("gpu_usage")[0].metadata
    assert meta["rows"].value == 1
    assert meta["acme in_quota_gpu_h"].value == 2.0
    assert meta["total in_quota_gpu_h"].value == 2.0
    assert "| 2026-11-30 | acme | vision | 2 |" in meta["usage"].value
    empty = quiet.asset_materializations_for_node("gpu_usage")[0].metadata
    assert (empty["day"].value, empty["rows"].value) == ("2026-11-29", 0)
    assert empty["usage"].value == "no GPU usage recorded on 2026-11-29 (UTC)"


@pytest.mark.parametrize(
    ("first", "last", "want"),
    [
        pytest.param(None, None, (date(2026, 11, 24), DAY1), id="neither day given: the last 7 days up to today"),
        pytest.param(date(2026, 11, 28), None, (date(2026, 11, 28), DAY1), id="only --from: from it to today"),
        pytest.param(None, date(2026, 11, 10), (date(2026, 11, 4), date(2026, 11, 10)), id="only --to: 7 days to it"),
        pytest.param(date(2026, 11, 1), date(2026, 11, 2), (date(2026, 11, 1), date(2026, 11, 2)), id="both: as given"),
    ],
)
def test_usage_covers_the_last_7_days_unless_told(first: date | None, last: date | None, want: tuple) -> None:
    assert usage_days(first, last, today=DAY1) == want


def test_usage_without_days_reports_the_week_up_to_today(ledger: Ledger) -> None:
    before = datetime.now(UTC).date()
    result = CliRunner().invoke(app, ["usage", "--ledger-url", ledger.url, "--json"])
    after = datetime.now(UTC).date()
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    today = date.fromisoformat(report["to"])
    assert today in (before, after)  # the day the command ran (UTC)
    assert date.fromisoformat(report["from"]) == today - timedelta(days=6)
