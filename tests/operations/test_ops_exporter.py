"""The exporter's figures against the ledger's and the instance's own, after scripted scenarios:
one driven through the platform (coordinator, tick) and one written straight into a ledger."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import instance_for_test
from sqlalchemy import text
from typer.testing import CliRunner

from tests.dagster.engine_harness import Engine, engine, request
from tests.ledger.ledger_helpers import Ticker, alloc
from tests.operations.ops_helpers import Labels, free_port, labels, scraped
from xirang_platform.cli import app
from xirang_platform.control import run_tags as rt
from xirang_platform.ledger import Ledger
from xirang_platform.ledger.read_only import LedgerUnavailable, open_for_reading
from xirang_platform.operations.exporter import XirangCollector
from xirang_platform.pool.model import Pool
from xirang_platform.pool.readers import read_pool
from xirang_platform.scheduling.model import PreemptReason, Tier
from xirang_platform.scheduling.quota import OvercommitPolicy, cap

POOL_FILE = Path(__file__).resolve().parents[1] / "dagster" / "pool.yaml"
NOW = 1_900_000_000.0
ACCOUNT_FAMILIES = {
    "xirang_used_gpus": lambda v: v.used,
    "xirang_reserved_gpus": lambda v: v.reserved,
    "xirang_borrowed_gpus": lambda v: v.balance.borrowed,
}


def account_labels(key: object) -> Labels:
    tenant, project = key.tenant, key.project or ""  # type: ignore[attr-defined]
    return labels(tenant=tenant, project=project)


def expected_accounts(ledger: Ledger, policy: OvercommitPolicy, pool: Pool) -> dict[str, dict[Labels, float]]:
    """The account families as the ledger's own `accounts()` and `allocations()` give them."""
    held = sum(a.milli for a in ledger.allocations())
    ratio = policy.ratio(held / pool.gpu_milli)
    out: dict[str, dict[Labels, float]] = {
        name: {} for name in [*ACCOUNT_FAMILIES, "xirang_quota_gpus", "xirang_cap_gpus", "xirang_cap_ceiling_gpus"]
    }
    for v in ledger.accounts():
        for name, field in ACCOUNT_FAMILIES.items():
            out[name][account_labels(v.key)] = field(v) / 1000
        if v.quota is not None:
            out["xirang_quota_gpus"][account_labels(v.key)] = v.quota / 1000
            out["xirang_cap_gpus"][account_labels(v.key)] = cap(v.quota, ratio) / 1000
            out["xirang_cap_ceiling_gpus"][account_labels(v.key)] = cap(v.quota, policy.max_ratio) / 1000
    return out


def expected_allocated(ledger: Ledger) -> dict[Labels, float]:
    got: Counter[Labels] = Counter()
    for a in ledger.allocations():
        r = a.request
        got[labels(tenant=r.tenant, project=r.project, tier=r.tier.value)] += a.milli
    return {k: v / 1000 for k, v in got.items()}


def expected_events(ledger: Ledger, kinds: set[str], cause: str | None = None) -> Counter[tuple[str, ...]]:
    """(tenant, project, tier, kind, cause) of the tenant-account entries of `kinds`, counted."""
    by_request = {a.id: a.request for a in ledger.allocations(live=False)}
    got: Counter[tuple[str, ...]] = Counter()
    for e in ledger.entries():
        if e.kind in kinds and "/" not in e.account and (cause is None or e.cause == cause):
            if e.kind == "return" and e.bucket != "borrowed":
                continue
            r = by_request[str(e.request_id)]
            got[(r.tenant, r.project, r.tier.value, e.kind, e.cause)] += 1
    return got


# -- through the platform ------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def e(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    with engine(tmp_path, request.param) as platform:
        yield platform


def test_a_scrape_after_a_tick_matches_the_ledger_and_the_queue(e: Engine) -> None:
    # The pool: 16 H100s (two 8-GPU servers), 4 L40S. Two 8-GPU gangs fill the H100s; a third waits
    # (no room for 8 GPUs); a 1-GPU inference replica lands on an L40S.
    llm = e.submit("research", "gpu_job", request("offline-training", 8, project="llm"))
    serving = e.submit("product", "gpu_job", request("online-training", 8))
    waiting = e.submit("research", "gpu_job", request("offline-training", 8, project="vision"))
    replica = e.submit("product", "gpu_job", request("inference", 1))
    report = e.tick(NOW - 30)
    assert sorted(report.admitted) == sorted([llm, serving, replica])
    e.ledger.commit(llm)
    platform = e.gpu_pool.platform()
    collector = XirangCollector(e.ledger, e.instance, platform.pool, platform.overcommit, clock=lambda: NOW)

    got = scraped(collector)

    assert got["xirang_up"] == {(): 1.0}
    assert got["xirang_pool_gpus"] == {labels(gpu_model="H100-SXM"): 16.0, labels(gpu_model="L40S"): 4.0}
    assert got["xirang_allocated_gpus"] == expected_allocated(e.ledger)
    assert got["xirang_idle_gpus"] == {(): 20.0 - sum(expected_allocated(e.ledger).values())}
    for name, want in expected_accounts(e.ledger, platform.overcommit, platform.pool).items():
        assert got[name] == want, name
    reason = e.tag(waiting, rt.HOLD_REASON)
    assert reason is not None
    assert reason.startswith("capacity:")
    queue = labels(tenant="research", project="vision", tier="offline-training")
    assert got["xirang_pending_runs"] == {labels(**dict(queue), reason="capacity"): 1.0}
    assert got["xirang_oldest_pending_seconds"] == {queue: NOW - float(e.tag(waiting, rt.SUBMIT_TIME) or 0)}
    admissions = expected_events(e.ledger, {"reserve", "borrow"})
    assert got["xirang_admissions_total"] == {
        labels(tenant=t, project=p, tier=tier, kind="borrowed" if k == "borrow" else "in-quota"): float(n)
        for (t, p, tier, k, _), n in admissions.items()
    }
    assert sum(admissions.values()) == 3
    # One tick: one observation per step, its sum the step's logged duration.
    for step, ms in report.steps_ms.items():
        assert got["xirang_tick_duration_seconds_count"][labels(step=step)] == 1.0
        assert got["xirang_tick_duration_seconds_sum"][labels(step=step)] == pytest.approx(ms / 1000)
        assert got["xirang_tick_duration_seconds_bucket"][(("le", "+Inf"), ("step", step))] == 1.0
    assert set(report.steps_ms) == {"read", "reconcile", "plan", "ledger", "runs", "queue", "gates", "hold events"}


# -- straight into a ledger --------------------------------------------------------------------------------


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}", clock=Ticker())
    ledger.add_tenant("acme", 4000)
    ledger.add_project("acme", "vision", 4000)
    ledger.add_tenant("beta", 4000)
    ledger.add_project("beta", "ranking")
    yield ledger
    ledger.close()


def test_the_counters_count_the_ledgers_entries_by_tenant_project_tier_and_reason(ledger: Ledger) -> None:
    # acme takes 4 GPUs in quota, beta 4 in quota and 2 borrowed; then a priority preemption, a
    # reclaim (after which beta's borrowed 2 GPUs fit its cap and return) and a reconcile release.
    for rid, tier, node in [("a1", Tier.OFFLINE_TRAINING, "n0"), ("a2", Tier.ONLINE_TRAINING, "n1")]:
        ledger.reserve(alloc(rid, "acme", "vision", tier, gpus=2, node=node))
    ledger.reserve(alloc("b1", "beta", "ranking", Tier.OFFLINE_TRAINING, gpus=4, node="n2"))
    ledger.reserve(alloc("b2", "beta", "ranking", Tier.OFFLINE_TRAINING, gpus=2, node="n3"))  # past beta's 4.8-GPU cap
    ledger.commit("a1")
    ledger.preempt("a1", by="b9", reason=PreemptReason.PRIORITY, auto_return=False)
    ledger.preempt("b1", by="a9", reason=PreemptReason.RECLAIM, auto_return=False)
    ledger.return_borrowed("beta")  # b2 fits under beta's cap now
    ledger.release("a2", cause="reconcile")
    with instance_for_test() as instance:
        pool = read_pool(str(POOL_FILE))
        got = scraped(XirangCollector(ledger, instance, pool, OvercommitPolicy(), clock=lambda: NOW))

    preempts = expected_events(ledger, {"preempt"})
    assert got["xirang_preemptions_total"] == {
        labels(tenant=t, project=p, tier=tier, reason=cause): float(n) for (t, p, tier, _, cause), n in preempts.items()
    }
    assert got["xirang_preemptions_total"] == {
        labels(tenant="acme", project="vision", tier="offline-training", reason="priority"): 1.0,
        labels(tenant="beta", project="ranking", tier="offline-training", reason="reclaim"): 1.0,
    }
    returns = expected_events(ledger, {"return"})
    assert got["xirang_returns_total"] == {
        labels(tenant=t, project=p, tier=tier): float(n) for (t, p, tier, _, _), n in returns.items()
    }
    assert sum(returns.values()) == 1
    repairs = expected_events(ledger, {"release"}, cause="reconcile")
    assert (
        got["xirang_reconcile_repairs_total"]
        == {labels(tenant="acme", project="vision", tier="online-training"): 1.0}
        == {labels(tenant=t, project=p, tier=tier): float(n) for (t, p, tier, _, _), n in repairs.items()}
    )
    kinds = {dict(k)["kind"] for k in got["xirang_admissions_total"]}
    assert kinds == {"in-quota", "borrowed"}
    for name, want in expected_accounts(ledger, OvercommitPolicy(), pool).items():
        assert got[name] == want, name
    # Nothing waits and no tick ran: the queue and tick families are there, with no samples.
    assert "xirang_pending_runs" not in got
    assert "xirang_tick_duration_seconds_count" not in got


@pytest.mark.parametrize(
    ("held_gpus", "cap_gpus"),
    [
        pytest.param(0, 4.8, id="an idle pool: the cap is the ceiling, quota x 1.2"),
        pytest.param(16, 4.4, id="80% of the pool allocated: the ratio has fallen halfway to 1.0"),
        pytest.param(20, 4.0, id="a full pool: the cap is the quota"),
    ],
)
def test_quota_show_and_the_exporter_show_one_cap_and_its_ceiling(
    ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held_gpus: int, cap_gpus: float
) -> None:
    # issue 31: `quota show` said 76.8 (quota x 1.2) where /metrics said 73.1 (the ratio now).
    config = tmp_path / "xirang.yaml"
    config.write_text(
        f"pool: {POOL_FILE}\nledger_url: {ledger.url}\ntenants:\n"
        "  acme: {quota_gpus: 4, projects: {vision: {quota_gpus: 4}}}\n"
        "  beta: {quota_gpus: 4, projects: {ranking: {}}}\n",
        encoding="utf-8",
    )
    for i in range(held_gpus // 4):  # 4-GPU gangs of acme, in quota then borrowed
        ledger.reserve(alloc(f"a{i}", "acme", "vision", gpus=4, node=f"n{i}"))
    monkeypatch.setenv("XIRANG_CONFIG", str(config))
    monkeypatch.delenv("XIRANG_LEDGER_URL", raising=False)
    shown = CliRunner().invoke(app, ["quota", "show", "--json"])
    assert shown.exit_code == 0, shown.output
    with instance_for_test() as instance:
        pool = read_pool(str(POOL_FILE))
        got = scraped(XirangCollector(ledger, instance, pool, OvercommitPolicy(), clock=lambda: NOW))

    limited = [a for a in json.loads(shown.stdout)["accounts"] if a["quota"] is not None]
    assert {(a["tenant"], a["project"] or ""): a["cap"] / 1000 for a in limited} == {
        ("acme", ""): cap_gpus,
        ("acme", "vision"): cap_gpus,
        ("beta", ""): cap_gpus,
    }
    assert got["xirang_cap_gpus"] == {
        labels(tenant=a["tenant"], project=a["project"] or ""): a["cap"] / 1000 for a in limited
    }
    assert [a["ceiling"] for a in limited] == [4800, 4800, 4800]  # quota x 1.2 whatever the load
    assert got["xirang_cap_ceiling_gpus"] == {
        labels(tenant=a["tenant"], project=a["project"] or ""): 4.8 for a in limited
    }


def test_the_counters_survive_a_new_exporter_process(ledger: Ledger) -> None:
    ledger.reserve(alloc("a1", "acme", "vision", gpus=1))
    ledger.preempt("a1", by="x", reason=PreemptReason.PRIORITY)
    with instance_for_test() as instance:
        pool = read_pool(str(POOL_FILE))
        first = scraped(XirangCollector(ledger, instance, pool, OvercommitPolicy()))
        again = scraped(XirangCollector(open_for_reading(ledger.url), instance, pool, OvercommitPolicy()))
    assert first["xirang_preemptions_total"] == again["xirang_preemptions_total"] != {}


# -- bad input ----------------------------------------------------------------------------------------------


def test_an_unreachable_ledger_is_refused_with_the_fix() -> None:
    with pytest.raises(LedgerUnavailable, match=r"cannot reach the quota ledger at .*:1/nowhere .*--ledger-url"):
        open_for_reading("postgresql+psycopg2://postgres:secret@127.0.0.1:1/nowhere")


def test_a_ledger_from_a_newer_schema_is_refused_and_left_unchanged(ledger: Ledger) -> None:
    with ledger.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'f0f0f0f0'"))
    with pytest.raises(LedgerUnavailable, match="newer than this release knows .*upgrade xirang"):
        open_for_reading(ledger.url)
    with ledger.engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "f0f0f0f0"


def test_a_missing_sqlite_file_is_refused_and_not_created(tmp_path: Path) -> None:
    with pytest.raises(LedgerUnavailable, match="no quota ledger at .*no such file"):
        open_for_reading(f"sqlite:///{tmp_path / 'missing.sqlite'}")
    assert not (tmp_path / "missing.sqlite").exists()


def test_a_database_without_the_ledger_schema_is_not_taken_for_a_ledger(tmp_path: Path) -> None:
    other = Ledger(f"sqlite:///{tmp_path / 'other.sqlite'}", migrate=False)
    with other.engine.begin() as conn:
        conn.execute(text("CREATE TABLE unrelated (x INTEGER)"))
    other.close()
    with pytest.raises(LedgerUnavailable, match="no quota ledger at .*no ledger schema"):
        open_for_reading(other.url)


def test_metrics_serve_exits_with_the_reason_for_an_unreachable_ledger(tmp_path: Path) -> None:
    config = tmp_path / "xirang.yaml"
    config.write_text(f"pool: {POOL_FILE}\ntenants: {{acme: {{quota_gpus: 4}}}}\n", encoding="utf-8")
    result = CliRunner().invoke(
        app,
        ["metrics", "serve", "--config", str(config), "--ledger-url", "postgresql+psycopg2://postgres@127.0.0.1:1/x"],
    )
    assert result.exit_code == 1
    assert "cannot reach the quota ledger" in result.output
    assert "Traceback" not in result.output


def test_a_scrape_whose_ledger_went_away_serves_up_0(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(f"sqlite:///{path}")
    ledger.add_tenant("acme", 1000)
    with instance_for_test() as instance:
        collector = XirangCollector(ledger, instance, read_pool(str(POOL_FILE)), OvercommitPolicy())
        assert scraped(collector)["xirang_up"] == {(): 1.0}
        ledger.close()
        path.unlink()
        path.mkdir()  # SQLite cannot open a folder: the next scrape cannot read the ledger
        assert scraped(collector) == {"xirang_up": {(): 0.0}}


# -- where it listens ----------------------------------------------------------------------------------------


def listening(port: int) -> list[str]:
    """The IPv4 addresses with a socket listening on `port`, from the kernel's own table."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: TCP_LISTEN
            found.append(".".join(str(b) for b in reversed(bytes.fromhex(address))))
    return found


@pytest.mark.parametrize(
    ("options", "address"),
    [
        pytest.param([], "127.0.0.1", id="without --host it listens on this machine only"),
        pytest.param(["--host", "0.0.0.0"], "0.0.0.0", id="--host 0.0.0.0 opens it to other machines"),
    ],
)
def test_metrics_serve_listens_where_host_says(tmp_path: Path, options: list[str], address: str) -> None:
    config = tmp_path / "xirang.yaml"
    config.write_text(f"pool: {POOL_FILE}\ntenants: {{acme: {{quota_gpus: 4}}}}\n", encoding="utf-8")
    Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}").close()
    (tmp_path / "dagster").mkdir()
    port = free_port()
    command = [sys.executable, "-m", "xirang_platform.cli", "metrics", "serve", "--config", str(config)]
    command += ["--ledger-url", f"sqlite:///{tmp_path / 'ledger.sqlite'}", "--port", str(port), *options]
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster")}
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as exporter:
        try:
            deadline = time.monotonic() + 120
            while not listening(port):
                assert exporter.poll() is None, exporter.stdout.read().decode() if exporter.stdout else ""
                assert time.monotonic() < deadline, "the exporter did not listen within 120 s"
                time.sleep(0.2)
            assert listening(port) == [address]
        finally:
            exporter.terminate()
            exporter.wait(timeout=60)
