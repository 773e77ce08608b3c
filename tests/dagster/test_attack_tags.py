"""Hostile submissions through the public path (DESIGN.md section 7, trust boundary): runs created as
the webserver creates them, submitted through the real coordinator, planned by the real tick.

Every row is a run a tenant's user could submit: forged platform tags, overflowing and non-ASCII
numbers, empty and padded values, another tenant's name, a claim on another tenant's preempted run,
and Dagster re-executions (which copy their parent's tags). After each: the run is refused with a
message naming the tag and nothing is reserved for it, or the forged tags are reset and the run is
read with what the platform says (no inherited lineage, the tier's priority). After all of them,
on SQLite and on PostgreSQL: no tenant over its cap, no GPU over capacity, balances equal their
entries, and each tenant's victim still resumes with what the ledger recorded.

The second closing test runs the rows beside the daemons: the UI's "Test sensor" on the tick
(`sensorDryRun`) after every row writes nothing; every fourth row, a normal run of each tenant is
admitted by the sensor daemon's own tick and ended by the queue daemon (succeeding, failing, or a
waiting run told to end), and every ended run's release sensor frees its units. No GPU or node is
over capacity after any tick; at the end every run has ended, the ledger holds nothing, quotas are
as before, no account passed its cap in any state of the ledger's replay, and a normal run of each
tenant is admitted by the next tick and succeeds.

On PostgreSQL, Dagster's own storage refuses a run whose tag value does not fit the `run_tags`
index (about 2,700 bytes after compression, e.g. 1,000 distinct '|'-separated names): the run is
never created, so the platform never sees it; the long rows here are ones both storages create.

The scene: research and product each have one preempted victim, recorded in the ledger and tagged
pending as the tick leaves them (`preempted_victim`); research's victim was resumed by `resumed`,
a run the coordinator accepted as its resumption.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterRunStatus, RunsFilter
from dagster_graphql.test.utils import execute_dagster_graphql

from sensors.resume import RESUME_SENSOR_NAME
from sensors.scheduling_tick import DRY_RUN, TICK_SENSOR_NAME
from tests.dagster.engine_defs import OUTCOME_TAG
from tests.dagster.engine_harness import DRY_RUN_MUTATION, Engine, engine, request
from xirang_platform.control import run_tags as rt
from xirang_platform.control.tick_plan import GatedRun, parse_gated
from xirang_platform.dagster_compat import ReexecutionStrategy
from xirang_platform.dagster_defs.coordinator import run_location
from xirang_platform.ledger.rebuild import cap_violations
from xirang_platform.scheduling import quota
from xirang_platform.scheduling.model import Request
from xirang_platform.scheduling.quota import AccountKey
from xirang_platform.scheduling.snapshot import Snapshot

RESEARCH_GPU = request("offline-training", 1, project="llm")
PRODUCT_GPU = request("offline-training", 1)
FORGED_ENV = json.dumps({"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"})


@dataclass(frozen=True)
class Scene:
    """An engine with one preempted victim per tenant; research's already resumed by `resumed`."""

    e: Engine
    victims: dict[str, str]  # tenant -> its preempted run
    resumed: str

    def value(self, text: str) -> str:
        """`text` with `{research}` / `{product}` (the victims) and `{resumed}` filled in."""
        for name, run_id in {**self.victims, "resumed": self.resumed}.items():
            text = text.replace(f"{{{name}}}", run_id)
        return text


@dataclass(frozen=True)
class Attack:
    """One hostile submission: in `location`, of `job`, with `tags` (`{product}` names product's
    victim); `reexecute` re-executes that scene run instead, as the UI does, `tags` added. Either
    `refused` (the tag, and what its message says) or `want` (tags the run carries afterwards)."""

    location: str
    tags: dict[str, str]
    job: str = "gpu_job"
    reexecute: str | None = None
    refused: tuple[str, str] | None = None
    want: dict[str, str] = field(default_factory=dict)
    run_config: dict[str, Any] = field(default_factory=dict)


def refused(location: str, tags: dict[str, str], tag: str, says: str, job: str = "gpu_job") -> Attack:
    return Attack(location, tags, job, refused=(tag, says))


def reset(location: str, tags: dict[str, str], want: dict[str, str], job: str = "gpu_job") -> Attack:
    return Attack(location, tags, job, want=want)


def pool_config(location: str, tags: dict[str, str], **fields: str) -> Attack:
    """A run whose run config points `gpu_pool` elsewhere: refused at submission, naming the field."""
    config = {"resources": {rt.POOL_RESOURCE: {"config": fields}}}
    first = sorted(fields)[0]
    return Attack(
        location, tags, refused=(f"resources.gpu_pool.config.{first}", "from the deployment"), run_config=config
    )


GATED = {rt.GATE: "queued", rt.HOLD_REASON: "queued: waiting for the next scheduling tick"}
P2 = {rt.PRIORITY: "0"}
NOT_A_RESUMPTION = {rt.PARENT_RUN: "", rt.PREEMPTED: ""}

ATTACKS = [
    # -- run config that would point the pool resource at another platform or ledger --------------------
    pytest.param(
        pool_config("product", PRODUCT_GPU, config_path="/tmp/other-tenants.yaml"),
        id="run config names another platform config",
    ),
    pytest.param(
        pool_config("research", RESEARCH_GPU, ledger_url="sqlite:////tmp/other-ledger.sqlite"),
        id="run config names another ledger",
    ),
    pytest.param(
        pool_config("product", {}, config_path="/tmp/x.yaml", ledger_url="sqlite:////tmp/y.sqlite"),
        id="run config names both, on a run without GPUs",
    ),
    # -- forged platform tags: reset, never trusted ---------------------------------------------------
    pytest.param(
        reset("research", RESEARCH_GPU | {rt.PREEMPTED: "3000000000"}, {rt.PREEMPTED: "", **GATED}),
        id="a preemption count past a 32-bit column",
    ),
    pytest.param(
        reset("research", RESEARCH_GPU | {rt.PREEMPTED: "1"}, {rt.PREEMPTED: ""}), id="a preempted mark to go first"
    ),
    pytest.param(reset("product", PRODUCT_GPU | {rt.SUBMIT_TIME: "1"}, {}), id="a submit time of 1 to starve at once"),
    pytest.param(
        reset(
            "research",
            RESEARCH_GPU | {rt.RECLAIMS: "3000000000", rt.RECLAIMED_AT: "1"},
            {rt.RECLAIMS: "", rt.RECLAIMED_AT: ""},
        ),
        id="forged reclaims",
    ),
    pytest.param(
        reset("research", RESEARCH_GPU | {rt.PARENT_RUN: "{product}"}, NOT_A_RESUMPTION),
        id="a claim on another tenant's victim, with GPUs",
    ),
    pytest.param(
        reset("research", {rt.PARENT_RUN: "{product}"}, {rt.PARENT_RUN: "", rt.GATE: rt.GATE_NONE, **P2}),
        id="a claim on another tenant's victim, without GPUs",
    ),
    pytest.param(
        reset("research", RESEARCH_GPU | {rt.PARENT_RUN: "{research}"}, NOT_A_RESUMPTION),
        id="a second claim on a victim already resumed",
    ),
    pytest.param(
        reset("research", RESEARCH_GPU | {rt.PARENT_RUN: "no-such-run"}, NOT_A_RESUMPTION),
        id="a claim on a run that does not exist",
    ),
    pytest.param(reset("product", PRODUCT_GPU | {rt.GATE: rt.GATE_OPEN}, GATED), id="an open gate"),
    pytest.param(
        reset(
            "product",
            PRODUCT_GPU | {rt.ALLOCATION: '{"gpus": []}', rt.ENV: FORGED_ENV},
            {rt.ALLOCATION: "", rt.ENV: ""},
        ),
        id="a forged allocation and CUDA_VISIBLE_DEVICES",
    ),
    pytest.param(
        reset("product", {rt.ENV: FORGED_ENV, rt.GATE: rt.GATE_OPEN}, {rt.ENV: "", rt.GATE: rt.GATE_NONE}),
        id="a forged environment on a run without GPUs",
    ),
    pytest.param(
        reset(
            "research",
            RESEARCH_GPU | {rt.RESUME: "pending", rt.PREEMPTED_BY: "x"},
            {rt.RESUME: "", rt.PREEMPTED_BY: ""},
        ),
        id="posing as a victim",
    ),
    pytest.param(reset("research", RESEARCH_GPU | {rt.PRIORITY: "1000"}, P2), id="a Dagster priority of 1000"),
    pytest.param(reset("research", {rt.PRIORITY: "1000"}, {rt.GATE: rt.GATE_NONE, **P2}), id="priority, no GPU"),
    pytest.param(
        reset("product", PRODUCT_GPU | {rt.K8S_CONFIG: '{"container_config": {}}'}, {rt.K8S_CONFIG: "{}"}),
        id="a user's dagster-k8s/config",
    ),
    pytest.param(
        reset(
            "research",
            {rt.TIER: "batch-inference"},
            {rt.GPUS: "8", rt.TIER: "batch-inference", **GATED},
            job="train_job",
        ),
        id="a tier tag keeps the declared GPUs",
    ),
    # -- a declared need cannot be dropped --------------------------------------------------------------
    pytest.param(
        refused("research", {rt.GPUS: "0"}, rt.GPUS, "cannot drop a declared need", job="train_job"),
        id="no GPU on an asset that declares 8",
    ),
    pytest.param(
        refused("research", {rt.GPUS: "2"}, rt.GPUS, "(xirang/gpus=8)", job="train_job"),
        id="fewer GPUs than declared",
    ),
    pytest.param(
        refused("research", {rt.GPU_MILLI: "250"}, rt.GPU_MILLI, "less than the run's assets declare", job="train_job"),
        id="a fraction on an asset that declares 8 GPUs",
    ),
    pytest.param(
        refused("research", {rt.GPU_MILLI: ""}, rt.GPU_MILLI, "is empty", job="train_job"),
        id="an empty milli on a declared asset",
    ),
    pytest.param(refused("research", {rt.GPUS: ""}, rt.GPUS, "is empty", job="train_job"), id="empty GPUs"),
    # -- numbers: ASCII digits within bounds --------------------------------------------------------------
    pytest.param(refused("research", RESEARCH_GPU | {rt.GPUS: "inf"}, rt.GPUS, "0..100000"), id="GPUs inf"),
    pytest.param(refused("research", RESEARCH_GPU | {rt.GPUS: "nan"}, rt.GPUS, "0..100000"), id="GPUs nan"),
    pytest.param(refused("research", RESEARCH_GPU | {rt.GPUS: "+2"}, rt.GPUS, "ASCII digits"), id="GPUs +2"),
    pytest.param(refused("research", RESEARCH_GPU | {rt.GPUS: "1_0"}, rt.GPUS, "ASCII digits"), id="GPUs 1_0"),
    pytest.param(refused("research", RESEARCH_GPU | {rt.GPUS: "\uff14"}, rt.GPUS, "ASCII"), id="full-width GPUs"),
    pytest.param(
        refused("research", RESEARCH_GPU | {rt.GPUS: "\u0661\u0662"}, rt.GPUS, "ASCII"), id="Arabic-Indic GPUs"
    ),
    pytest.param(refused("research", RESEARCH_GPU | {rt.GPUS: "100001"}, rt.GPUS, "out of range"), id="GPUs 100001"),
    pytest.param(refused("research", RESEARCH_GPU | {rt.GPUS: " 1"}, rt.GPUS, "write '1'"), id="padded GPUs"),
    pytest.param(
        refused("research", RESEARCH_GPU | {rt.GPU_MEMORY_GB: "1e308"}, rt.GPU_MEMORY_GB, "0..10000"),
        id="GPU memory 1e308",
    ),
    pytest.param(
        refused("research", request("inference", milli=0, project="llm"), rt.GPU_MILLI, "1..999"), id="milli 0"
    ),
    pytest.param(
        refused("research", request("inference", milli=1000, project="llm"), rt.GPU_MILLI, "1..999"),
        id="milli 1000",
    ),
    # -- empty and padded values, other tenants -----------------------------------------------------------
    pytest.param(refused("research", RESEARCH_GPU | {rt.TIER: ""}, rt.TIER, "is empty"), id="an empty tier"),
    pytest.param(refused("research", RESEARCH_GPU | {rt.PROJECT: "   "}, rt.PROJECT, "is empty"), id="blank project"),
    pytest.param(
        refused("research", RESEARCH_GPU | {rt.TIER: " inference"}, rt.TIER, "write 'inference'"), id="padded tier"
    ),
    pytest.param(
        refused("product", PRODUCT_GPU | {rt.TENANT: "research"}, rt.TENANT, "charged to 'product'"),
        id="another tenant, with GPUs",
    ),
    pytest.param(
        refused("product", {rt.TENANT: "research"}, rt.TENANT, "charged to 'product'"),
        id="another tenant, without GPUs",
    ),
    # -- re-executions (Dagster copies the parent's tags) ------------------------------------------------
    pytest.param(
        Attack("product", {}, reexecute="{product}", want={rt.RESUME: "", rt.PREEMPTED_BY: "", **GATED}),
        id="a re-execution of another tenant's victim",
    ),
    pytest.param(
        Attack("research", {}, reexecute="{resumed}", want=NOT_A_RESUMPTION),
        id="a re-execution of a resumption does not inherit its lineage",
    ),
    pytest.param(
        Attack("product", {rt.PARENT_RUN: "{research}"}, reexecute="{product}", want=NOT_A_RESUMPTION),
        id="a re-execution claiming another tenant's victim",
    ),
    pytest.param(
        Attack("product", {}, reexecute="{research}", refused=(rt.TENANT, "charged to 'product'")),
        id="a re-execution in one's own location of another tenant's run",
    ),
    pytest.param(
        Attack(
            "research", {rt.GATE: rt.GATE_OPEN}, reexecute="{resumed}", want={rt.ALLOCATION: "", rt.ENV: "", **GATED}
        ),
        id="an open gate on a re-execution of an admitted run",
    ),
    pytest.param(
        Attack("research", {rt.PRIORITY: "1000"}, reexecute="{resumed}", want=P2),
        id="a Dagster priority of 1000 on a re-execution of a resumption",
    ),
    # -- sizes and separators -----------------------------------------------------------------------------
    pytest.param(
        refused("research", RESEARCH_GPU | {rt.TIER: "inference\n"}, rt.TIER, "write 'inference'"),
        id="a tier with a newline",
    ),
    pytest.param(refused("research", RESEARCH_GPU | {rt.GPUS: "1\n"}, rt.GPUS, "write '1'"), id="GPUs with a newline"),
    pytest.param(
        refused("research", RESEARCH_GPU | {"xirang/preempted\n": "1"}, "xirang/preempted\n", "unknown tag"),
        id="a platform tag's name with a newline",
    ),
    pytest.param(
        refused("research", RESEARCH_GPU | {rt.PROJECT: "x" * 10_000}, rt.PROJECT, "is not a project"),
        id="a 10,000-character project",
    ),
    pytest.param(
        reset("research", RESEARCH_GPU | {rt.GPU_MODEL: "|".join(["H100-SXM"] * 1000)}, {}),
        id="one GPU model named 1,000 times",
    ),
    pytest.param(
        refused(
            "research",
            RESEARCH_GPU | {rt.GPU_MODEL: "|".join(["H100-SXM"] * 999 + ["B300"])},
            rt.GPU_MODEL,
            "unknown GPU model 'B300'",
        ),
        id="an unknown GPU model after 999 known ones",
    ),
]


def preempted_victim(e: Engine, location: str, tags: dict[str, str]) -> str:
    """A run the tick admitted and then preempted: the ledger's `preempt` entries, the victim's tags
    and its end, as the tick leaves them."""
    run_id = e.submit(location, "gpu_job", tags)
    assert run_id in e.tick().admitted
    e.ledger.preempt(run_id, "attack-suite", "priority")
    e.instance.add_run_tags(
        run_id, {rt.PREEMPTED_BY: "preempted by run attack-suite (priority)", rt.RESUME: rt.RESUME_PENDING}
    )
    e.instance.report_run_canceled(e.run(run_id))
    return run_id


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    """One SQLite platform for the rows (each row submits one run and checks it alone)."""
    with engine(tmp_path_factory.mktemp("attacks"), "sqlite") as e:
        yield build_scene(e)


def build_scene(e: Engine) -> Scene:
    """Each tenant's preempted victim, and research's accepted resumption (it inherits from the ledger)."""
    victims = {
        "research": preempted_victim(e, "research", request("offline-training", 2, project="llm")),
        "product": preempted_victim(e, "product", request("offline-training", 2)),
    }
    resumed = e.submit(
        "research", "gpu_job", request("offline-training", 2, project="llm", parent_run=victims["research"])
    )
    assert e.tag(resumed, rt.PARENT_RUN) == victims["research"]
    assert e.tag(resumed, rt.PREEMPTED) == "1"
    assert e.tag(resumed, rt.SUBMIT_TIME) == e.tag(victims["research"], rt.SUBMIT_TIME)
    assert e.tag(victims["research"], rt.RESUME) == rt.RESUME_REQUESTED
    return Scene(e, victims, resumed)


def submit(scene: Scene, attack: Attack) -> str:
    """Submit the row's run through the coordinator, as the webserver or the UI's re-execution does."""
    e = scene.e
    tags = {k: scene.value(v) for k, v in attack.tags.items()}
    if attack.reexecute is None:
        return e.submit(attack.location, attack.job, tags, run_config=attack.run_config)
    parent = e.run(scene.value(attack.reexecute))
    context = e.workspace.create_request_context()
    location = context.get_code_location(attack.location)
    remote_job = location.get_repository("__repository__").get_full_job(parent.job_name)
    run = e.instance.create_reexecuted_run(
        request_context=context,
        parent_run=parent,
        code_location=location,
        remote_job=remote_job,
        strategy=ReexecutionStrategy.ALL_STEPS,
        extra_tags=tags,
        use_parent_run_tags=True,
    )
    e.instance.submit_run(run.run_id, context)
    return run.run_id


def read_by_the_tick(scene: Scene, run_id: str) -> Request | str | None:
    """The request the tick reads from the run's tags (the failure message if they do not parse)."""
    run = scene.e.run(run_id)
    requests, failures = parse_gated([GatedRun(run_id, dict(run.tags), run_location(run))], scene.e.gpu_pool.platform())
    return failures[run_id] if failures else (requests[0] if requests else None)


def check(scene: Scene, attack: Attack, run_id: str, submitted: float) -> None:
    """What must hold after the row's submission at `submitted` (and a tick)."""
    e = scene.e
    if attack.refused is not None:
        tag, says = attack.refused
        assert e.status(run_id) == DagsterRunStatus.FAILURE
        refusal = [m for m in e.messages(run_id) if m.startswith("run not admitted: ")]
        assert refusal, e.messages(run_id)
        assert tag in refusal[0]
        assert says in refusal[0]
    else:
        tags = e.run(run_id).tags
        # A platform tag blanked or never written reads the same (Dagster tags cannot be deleted).
        assert {k: tags.get(k, "") for k in attack.want} == {k: scene.value(v) for k, v in attack.want.items()}
        read = read_by_the_tick(scene, run_id)
        if tags.get(rt.GATE) == rt.GATE_NONE:
            assert read is None
        else:
            assert isinstance(read, Request), read
            assert (read.preempted, read.reclaims, read.reclaimed_at) == (0, 0, None)
            # Its own submit time (written to the millisecond), not a parent's or a forged one.
            assert read.submit_time >= submitted - 0.001
            assert tags[rt.PRIORITY] == str(rt.priority_for(read.tier))
    # A claim on a victim never marks it resumed: product's victim still waits for its own resumption.
    assert e.tag(scene.victims["product"], rt.RESUME) == rt.RESUME_PENDING
    e.tick()
    if attack.refused is not None:
        assert [x for x in e.ledger.entries() if x.request_id == run_id] == []
        assert run_id not in e.held()


@pytest.mark.parametrize("attack", ATTACKS)
def test_a_hostile_submission_is_refused_or_reset(scene: Scene, attack: Attack) -> None:
    submitted = time.time()
    check(scene, attack, submit(scene, attack), submitted)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_after_every_hostile_submission_the_ledger_holds_and_each_victim_resumes(tmp_path: Path, backend: str) -> None:
    with engine(tmp_path, backend) as e:
        scene = build_scene(e)
        for param in ATTACKS:
            [attack] = param.values
            submitted = time.time()
            check(scene, attack, submit(scene, attack), submitted)

        live = e.ledger.allocations()
        assert e.ledger.rebuild().ok
        snapshot = Snapshot.build(e.gpu_pool.pool(), live, e.ledger.quota_book())
        assert snapshot.state.check() == []  # no GPU or node past its capacity
        ratio = e.gpu_pool.platform().overcommit.max_ratio
        for key, balance in quota.balances_from(snapshot.book, live).items():
            assert balance.in_quota <= quota.cap(balance.quota, ratio), key
        assert all(a.request.preempted == 0 or a.id == scene.resumed for a in live)

        resumed_by_its_sensor(scene, "product")


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_of_two_runs_claiming_one_victim_at_once_only_the_first_inherits(tmp_path: Path, backend: str) -> None:
    with engine(tmp_path, backend) as e:
        victim = preempted_victim(e, "research", request("offline-training", 2, project="llm"))
        claim = request("offline-training", 2, project="llm", parent_run=victim)
        first = e.submit("research", "gpu_job", claim)
        # The race: the second submission reads the victim's tag before the first one's write lands.
        e.instance.add_run_tags(victim, {rt.RESUME: rt.RESUME_PENDING})
        submitted = time.time()
        second = e.submit("research", "gpu_job", claim)
        assert (e.tag(first, rt.PARENT_RUN), e.tag(first, rt.PREEMPTED)) == (victim, "1")
        assert (e.tag(second, rt.PARENT_RUN) or "", e.tag(second, rt.PREEMPTED) or "") == ("", "")
        read = read_by_the_tick(Scene(e, {"research": victim}, first), second)
        assert isinstance(read, Request)
        assert (read.preempted, read.submit_time >= submitted - 0.001) == (0, True)


def resumed_by_its_sensor(scene: Scene, tenant: str) -> Any:
    """The one resumption of `tenant`'s victim, requested by its own location's sensor under the
    sensor daemon, with what the ledger recorded (one more preemption, the original submit time)."""
    e, victim = scene.e, scene.victims[tenant]

    def resumptions() -> list[Any]:
        e.sensors()
        return list(e.instance.get_runs(RunsFilter(tags={rt.PARENT_RUN: victim})))

    e.wait_for(f"{tenant}'s resumption", lambda: len(resumptions()) == 1)
    [resumption] = resumptions()
    assert resumption.tags[rt.PREEMPTED] == "1"
    assert resumption.tags[rt.SUBMIT_TIME] == e.tag(victim, rt.SUBMIT_TIME)
    assert e.tag(victim, rt.RESUME) == rt.RESUME_REQUESTED
    return resumption


# -- beside the daemons: dry-run ticks, the sensor daemon's ticks, the queue daemon, runs that end --------

ENDED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
TICK_SELECTOR = {
    "repositoryLocationName": "research",
    "repositoryName": "__repository__",
    "sensorName": TICK_SENSOR_NAME,
}
# A normal run of each tenant; the daemon rounds end them differently (success, failure, a waiting run told to end).
NORMAL = {"research": RESEARCH_GPU, "product": PRODUCT_GPU}
OUTCOMES = [{}, {OUTCOME_TAG: "fail"}, {OUTCOME_TAG: "wait"}]


def within_capacity(e: Engine) -> None:
    """The state the ledger's live allocations hold has no GPU or node past its capacity."""
    snapshot = Snapshot.build(e.gpu_pool.pool(), e.ledger.allocations(), e.ledger.quota_book())
    assert snapshot.state.check() == []


def dry_run(e: Engine) -> None:
    """The UI's "Test sensor" on the tick (GraphQL `sensorDryRun`): it reports the dry run and
    writes nothing, neither a ledger entry nor a gate."""
    before = (e.ledger.entries(), gates(e))
    result = execute_dagster_graphql(
        e.workspace.create_request_context(), DRY_RUN_MUTATION, {"selector": TICK_SELECTOR}
    )
    assert result.errors is None
    assert result.data["sensorDryRun"]["evaluationResult"] == {"skipReason": DRY_RUN, "error": None}
    assert (e.ledger.entries(), gates(e)) == before


def gates(e: Engine) -> dict[str, str | None]:
    """Every run's gate tag, by run id."""
    return {r.run_id: r.tags.get(rt.GATE) for r in e.instance.get_runs()}


def end_launched(e: Engine) -> None:
    """The queue daemon launches what may run (executed to its end at launch), and each ended run's
    release sensor frees its units."""
    e.dequeue()
    for run_id in sorted(e.held()):
        if e.status(run_id) in ENDED:
            e.release_sensors(run_id)
    within_capacity(e)
    assert not {a for a in e.held() if e.status(a) in ENDED}


def daemon_round(e: Engine, outcome: dict[str, str]) -> None:
    """A normal run of each tenant, admitted by the sensor daemon's own tick with dry runs beside it,
    then launched and ended by the queue daemon."""
    runs = {tenant: e.submit(tenant, "gpu_job", tags | outcome) for tenant, tags in NORMAL.items()}
    dry_run(e)

    def admitted() -> bool:
        e.sensors()
        within_capacity(e)
        return all(e.tag(r, rt.GATE) == rt.GATE_OPEN for r in runs.values())

    e.wait_for("the sensor daemon's tick to admit a run of each tenant", admitted)
    dry_run(e)
    if outcome.get(OUTCOME_TAG) == "wait":
        for run_id in runs.values():
            e.finish(run_id)  # told to end before launch: the launcher runs it to its end in this process
    end_launched(e)
    want = DagsterRunStatus.FAILURE if outcome.get(OUTCOME_TAG) == "fail" else DagsterRunStatus.SUCCESS
    assert {e.status(r) for r in runs.values()} == {want}


def resume_sensors(e: Engine, location: str, running: bool) -> None:
    """Stop or start `location`'s resumption sensors, as the UI's sensor toggle does."""
    repo = e.workspace.create_request_context().get_code_location(location).get_repository("__repository__")
    for name in (RESUME_SENSOR_NAME, f"{RESUME_SENSOR_NAME}_jobs"):
        remote = repo.get_sensor(name)
        if running:
            e.instance.start_sensor(remote)
        else:
            e.instance.stop_sensor(remote.get_remote_origin_id(), remote.selector_id, remote)


def drive_to_the_end(e: Engine) -> None:
    """Ticks and the queue daemon until every run has ended."""

    def all_ended() -> bool:
        e.tick()
        within_capacity(e)
        end_launched(e)
        return all(r.status in ENDED for r in e.instance.get_runs())

    e.wait_for("every run to end", all_ended)


def quotas(e: Engine) -> dict[AccountKey, int | None]:
    """Every ledger account's quota (None: a project without one of its own)."""
    return {a.key: a.quota for a in e.ledger.accounts()}


def no_account_over_its_cap(e: Engine) -> None:
    """In the ledger's replay of its entries (every state, at the largest ratio, and each admission
    at the ratio it recorded) and in the balances the rebuild computes."""
    ratio = e.gpu_pool.platform().overcommit.max_ratio
    entries = e.ledger.entries()
    assert cap_violations(entries, ratio=ratio) == []
    assert cap_violations(entries) == []
    report = e.ledger.rebuild(e.gpu_pool.pool())
    assert report.ok, (report.differences, report.over_capacity)
    for key, (quota_milli, used, reserved, _) in report.balances.items():
        if quota_milli is not None:
            assert used + reserved <= quota.cap(quota_milli, ratio), key


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_hostile_submissions_beside_dry_runs_and_the_daemons_leave_every_run_ended_and_each_tenant_served(
    tmp_path: Path, backend: str
) -> None:
    with engine(tmp_path, backend) as e:
        scene = build_scene(e)
        before = quotas(e)
        resume_sensors(e, "product", running=False)  # product's victim waits for its resumption until the end
        for i, param in enumerate(ATTACKS):
            [attack] = param.values
            submitted = time.time()
            check(scene, attack, submit(scene, attack), submitted)
            within_capacity(e)
            dry_run(e)
            if i % 4 == 0:
                daemon_round(e, OUTCOMES[(i // 4) % len(OUTCOMES)])
            end_launched(e)
            dry_run(e)

        resume_sensors(e, "product", running=True)
        resumption = resumed_by_its_sensor(scene, "product")
        drive_to_the_end(e)
        assert e.status(resumption.run_id) == DagsterRunStatus.SUCCESS

        # A normal run of each tenant is admitted by the next tick and succeeds.
        normal = {tenant: e.submit(tenant, "gpu_job", tags) for tenant, tags in NORMAL.items()}
        assert sorted(e.tick().admitted) == sorted(normal.values())
        within_capacity(e)
        end_launched(e)
        assert {e.status(r) for r in normal.values()} == {DagsterRunStatus.SUCCESS}

        assert all(r.status in ENDED for r in e.instance.get_runs())
        assert e.held() == set()
        assert quotas(e) == before
        no_account_over_its_cap(e)
