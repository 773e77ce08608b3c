"""GPU model preference per tier (DESIGN.md section 4, `scheduling/preference.py`): placement tries
the first model in the tier's order that can host the request now and packs within it; a request's
own model, compute-level and memory needs narrow the nodes first; without an order it places exactly
as before.

`NODES`: two 8 x H100 servers in one domain (`h`), two 4 x A10 cards each in its own domain, cut in
eighths; `WITH_L40S` adds one 4 x L40S card. One tenant owns the pool unless a case names a book.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.scheduling.cycle_builders import MODELS, Case, expected, job, node, outcome, quotas, running
from xirang_platform.control import run_tags as rt
from xirang_platform.control.platform_config import PlatformConfigError, config_from_dict, load_config
from xirang_platform.control.tick_plan import GatedRun, plan_tick
from xirang_platform.pool.model import MILLI_PER_GPU, Node, Pool
from xirang_platform.scheduling.config import SchedulerConfig
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.model import Placement, Request, Tier
from xirang_platform.scheduling.placement import as_placed, is_single_node, place
from xirang_platform.scheduling.preference import TIER_KEYS, GpuModelOrder
from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.scheduling.scorers import make_scorer
from xirang_platform.scheduling.snapshot import Snapshot
from xirang_platform.scheduling.state import ClusterState

REPO = Path(__file__).resolve().parents[2]
NODES = [
    node("h0").domain("h"),
    node("h1").domain("h"),
    node("a0").model("A10").gpus(4).domain("a0").unit(125),
    node("a1").model("A10").gpus(4).domain("a1").unit(125),
]
WITH_L40S = [*NODES, node("l0").model("L40S").gpus(4).domain("l0").unit(125)]
ALL_BUT_ONE_BUSY = [
    running(job("busy-h0").gpus(7), on={"h0": list(range(7))}),
    running(job("busy-h1").gpus(7), on={"h1": list(range(7))}),
]


def ordered(**orders: list[str]) -> SchedulerConfig:
    """The tables' config with a GPU model order (`ordered()`: none); keyword `_` reads as `-`."""
    order = GpuModelOrder.of({tier.replace("_", "-"): models for tier, models in orders.items()})
    return SchedulerConfig(min_runtime_s=600, gpu_model_order=order)


CASES = [
    pytest.param(
        Case(
            NODES, [job("t").tier("online-training").gpus(4)], config=ordered(), want_admit={"t": {"a0": [0, 1, 2, 3]}}
        ),
        id="no order: a 4-GPU P1 fills an A10 card (best fit), as before",
    ),
    pytest.param(
        Case(
            NODES,
            [job("t").tier("online-training").gpus(4)],
            config=ordered(P1=["H100"]),
            want_admit={"t": {"h0": [0, 1, 2, 3]}},
        ),
        id="training first: the 4-GPU P1 lands on H100",
    ),
    pytest.param(
        Case(NODES, [job("p").gpus(1)], config=ordered(P2=["H100"]), want_admit={"p": {"h0": [0]}}),
        id="training first: a 1-GPU P2 probe lands on H100",
    ),
    pytest.param(
        Case(
            NODES,
            [job("r").tier("inference").gpus(1)],
            running=[running(job("v").gpus(7), on={"h0": list(range(7))})],
            config=ordered(),
            want_admit={"r": {"h0": [7]}},
        ),
        id="no order: a 1-GPU P0 replica packs onto the H100 server's last free GPU",
    ),
    pytest.param(
        Case(
            NODES,
            [job("r").tier("inference").gpus(1)],
            running=[running(job("v").gpus(7), on={"h0": list(range(7))})],
            config=ordered(P0=["A10"]),
            want_admit={"r": {"a0": [0]}},
        ),
        id="inference first: the same replica lands on A10",
    ),
    pytest.param(
        Case(
            WITH_L40S,
            [job("t").tier("online-training").gpus(4)],
            running=ALL_BUT_ONE_BUSY,
            config=ordered(),
            want_admit={"t": {"a0": [0, 1, 2, 3]}},
        ),
        id="no order, H100 busy: the 4-GPU P1 takes the lowest group, an A10 card",
    ),
    pytest.param(
        Case(
            WITH_L40S,
            [job("t").tier("online-training").gpus(4)],
            running=ALL_BUT_ONE_BUSY,
            config=ordered(P1=["H100", "L40S"]),
            want_admit={"t": {"l0": [0, 1, 2, 3]}},
        ),
        id="the first model cannot host it now: the next in the order, before the unlisted A10",
    ),
    pytest.param(
        Case(
            WITH_L40S,
            [job("t").tier("online-training").gpus(4)],
            running=ALL_BUT_ONE_BUSY,
            config=ordered(P1=["H100"]),
            want_admit={"t": {"a0": [0, 1, 2, 3]}},
        ),
        id="no listed model can host it: the unlisted models by the usual rule",
    ),
    pytest.param(
        Case(
            NODES,
            [job("t").tier("online-training").gpus(4).models("A10")],
            config=ordered(P1=["H100"]),
            want_admit={"t": {"a0": [0, 1, 2, 3]}},
        ),
        id="the request's gpu_models narrows the order: an A10-only P1 stays on A10",
    ),
    pytest.param(
        Case(
            WITH_L40S,
            [job("t").tier("online-training").gpus(4).models("A10", "L40S")],
            config=ordered(P1=["H100", "L40S"]),
            want_admit={"t": {"l0": [0, 1, 2, 3]}},
        ),
        id="among the request's own models, the order decides",
    ),
    pytest.param(
        Case(
            NODES,
            [job("r").tier("inference").gpus(1).level(300)],
            config=ordered(P0=["A10"]),
            want_admit={"r": {"h0": [0]}},
        ),
        id="a compute level the A10 lacks: an inference-first replica lands on H100",
    ),
    pytest.param(
        Case(
            NODES,
            [job("r").tier("inference").gpus(1).gpu_memory(40_000)],
            config=ordered(P0=["A10"]),
            want_admit={"r": {"h0": [0]}},
        ),
        id="more GPU memory than an A10 has: the replica lands on H100",
    ),
    pytest.param(
        Case(
            NODES,
            [job("r").tier("inference").milli(300)],
            book=quotas({"acme": 0.5}),
            config=ordered(P0=["H100", "A10"]),
            want_admit={"r": {"a0": [0]}},
            want_milli={"r": 375},
        ),
        id="H100 first, but a whole H100 is past the replica's cap: it lands on A10 (3 eighths)",
    ),
    pytest.param(
        Case(
            NODES,
            [job("b").tier("batch-inference").milli(250), job("o").gpus(2)],
            config=ordered(P2=["H100"], batch_inference=["A10"]),
            want_admit={"b": {"a0": [0]}, "o": {"h0": [0, 1]}},
        ),
        id="a tag value's order replaces its level's: batch inference on A10, offline training on H100",
    ),
    pytest.param(
        Case(
            NODES,
            [job("g").gpus(10)],
            running=ALL_BUT_ONE_BUSY,
            config=ordered(P2=["A10"]),
            want_admit={"g": {"a0": [0, 1, 2, 3], "a1": [0, 1, 2, 3], "h0": [7], "h1": [7]}},
        ),
        id="a P2 gang no single group holds takes the mix, as without an order",
    ),
    pytest.param(
        Case(
            [
                node("x0").model("A100").domain("a"),
                node("x1").model("A100").domain("a"),
                node("h0").domain("h"),
                node("h1").domain("h"),
            ],
            [job("t").tier("online-training").gpus(12)],
            config=ordered(P1=["H100"]),
            want_admit={"t": {"h0": list(range(8)), "h1": [0, 1, 2, 3]}},
        ),
        id="a two-node gang: the H100 domain, not the lower-numbered A100 one",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_placement_follows_the_tier_order(case: Case) -> None:
    assert outcome(case) == expected(case)


# -- the rule as a property: the order is the usual rule on the first model that can host it ------

POOL_MODELS = ("H100", "A100", "L40S", "A10")


@st.composite
def pools(draw: st.DrawFn) -> Pool:
    """2-6 GPU nodes of the four models, 2-8 GPUs, two domains, whole GPUs or eighths."""
    nodes = []
    for i in range(draw(st.integers(2, 6))):
        model = draw(st.sampled_from(POOL_MODELS))
        nodes.append(
            Node(
                f"n{i}",
                MODELS[model],
                draw(st.sampled_from([2, 4, 8])),
                draw(st.sampled_from([16_000, 128_000])),
                512_000,
                draw(st.sampled_from(["d0", "d1"])),
                unit_milli=draw(st.sampled_from([1000, 125])),
            )
        )
    return Pool(tuple(nodes))


@st.composite
def requests(draw: st.DrawFn, name: str) -> Request:
    """A request of any tier: a fraction, whole GPUs (one node or a gang), maybe narrowed."""
    tier = draw(st.sampled_from(list(Tier)))
    fractional = draw(st.booleans())
    return Request(
        name,
        "acme",
        "default",
        tier,
        0.0,
        gpus=1 if fractional else draw(st.integers(1, 12)),
        milli_per_gpu=draw(st.sampled_from([125, 300, 500])) if fractional else MILLI_PER_GPU,
        cpu_milli=draw(st.sampled_from([0, 8_000])),
        gpu_memory_mib=draw(st.sampled_from([0, 0, 30_000])),
        min_compute_level=draw(st.sampled_from([0, 0, 300])),
        gpu_models=frozenset(draw(st.lists(st.sampled_from(POOL_MODELS), max_size=2))),
        single_node=draw(st.booleans()),
    )


def loaded(pool: Pool, load: list[Request]) -> ClusterState:
    """The pool with `load` placed on it, without an order, as far as it fits."""
    state = ClusterState(pool)
    scorer, priority = make_scorer("bestfit"), np.arange(len(pool.nodes))
    for r in load:
        found = place(state, r, scorer, priority)
        if found is not None:
            state.apply(found)
    return state


def first_model_placement(
    state: ClusterState, request: Request, models: tuple[str, ...], place_on: dict
) -> Placement | None:
    """The reference: placement without an order of `request` narrowed to each listed model in
    turn, then to the unlisted ones (by P1's rule for a gang), the first that finds room; else what
    the usual rule gives (a P2 gang's mix)."""
    listed = [m for m in models if m in state.model_names]
    unlisted = {m for m in state.model_names if m not in models}
    single = is_single_node(as_placed(request))
    for allowed in [{m} for m in listed] + ([unlisted] if unlisted else []):
        narrowed = allowed & request.gpu_models if request.gpu_models else allowed
        if not narrowed:
            continue
        one_model = replace(request, gpu_models=frozenset(narrowed))
        if not single:
            one_model = replace(one_model, tier=Tier.ONLINE_TRAINING)  # P1's rule, no mix
        found = place(state, one_model, **place_on)
        if found is not None:
            return found
    return None if single else place(state, request, **place_on)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pool=pools(),
    load=st.lists(requests("load"), max_size=6),
    request=requests("r"),
    order=st.permutations(POOL_MODELS).flatmap(lambda p: st.integers(1, 4).map(lambda k: p[:k])),
    scorer=st.sampled_from(["xirang", "bestfit"]),
    limit=st.sampled_from([None, 400, 1000, 2000]),
    mask=st.lists(st.booleans(), min_size=6, max_size=6) | st.none(),
    partial=st.booleans(),
)
def test_an_order_places_as_the_usual_rule_on_the_first_model_that_can_host_it(
    pool: Pool,
    load: list[Request],
    request: Request,
    order: tuple[str, ...],
    scorer: str,
    limit: int | None,
    mask: list[bool] | None,
    partial: bool,
) -> None:
    state = loaded(pool, [replace(r, id=f"load-{k}") for k, r in enumerate(load)])
    if partial:  # what preemption plans on: a copy of some rows
        state = state.rows(np.arange(len(pool.nodes) - 1))
    n = len(state.names)
    allowed = None if mask is None else np.array(mask[:n])
    place_on = {
        "scorer": make_scorer(scorer),
        "priority": np.arange(n),
        "allowed": allowed,
        "max_milli": limit,
    }
    with_order = state.copy()
    with_order.gpu_model_order = GpuModelOrder.of({request.tier.value: order})
    assert place(with_order, request, **place_on) == first_model_placement(state, request, order, place_on)


# -- no order, no change -------------------------------------------------------------------------


def decisions(pool: Pool, pending: list[Request], config: SchedulerConfig) -> tuple:
    """One cycle's admits (with GPUs), preemptions and holds on an idle pool."""
    snapshot = Snapshot.build(pool, [], QuotaBook({"acme": pool.gpu_milli}, {("acme", "default"): None}))
    result = cycle(snapshot, pending, 0.0, config)
    return result.admits, result.preempts, result.holds, result.returns


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool=pools(), pending=st.lists(requests("p"), min_size=1, max_size=12), unused=st.sampled_from(TIER_KEYS))
def test_an_order_the_pool_or_the_requests_never_meet_changes_nothing(
    pool: Pool, pending: list[Request], unused: str
) -> None:
    """An order naming only models the pool lacks, for every tier, and an order for a tier no pending
    request has, decide every request as no order does."""
    pending = [replace(r, id=f"p{k}") for k, r in enumerate(pending)]
    plain = decisions(pool, pending, SchedulerConfig())
    absent = GpuModelOrder.of({tier: ["T4"] for tier in TIER_KEYS})
    assert decisions(pool, pending, SchedulerConfig(gpu_model_order=absent)) == plain
    others = [r for r in pending if unused not in (r.tier.value, r.tier.rules.level)]
    other_tier = SchedulerConfig(gpu_model_order=GpuModelOrder.of({unused: list(POOL_MODELS)}))
    assert decisions(pool, others, other_tier) == decisions(pool, others, SchedulerConfig())


# -- the platform config ---------------------------------------------------------------------------

GOOD = {
    "tenants": {"research": {"quota_gpus": 8}},
    "locations": {"research": "research"},
}


@pytest.mark.parametrize(
    ("order", "message"),
    [
        pytest.param(
            {"training": ["H100-SXM"]},
            "scheduler.gpu_model_order: unknown tier 'training'; did you mean 'online-training'?",
            id="unknown tier",
        ),
        pytest.param(
            {"P1": ["H100-SMX"]},
            "scheduler.gpu_model_order.P1 names GPU model 'H100-SMX', which the pool lacks: did you mean 'H100-SXM'?",
            id="unknown model",
        ),
        pytest.param(
            {"P1": ["A100-40"]},
            "names GPU model 'A100-40', which the pool lacks: did you mean 'A100-80'? list models of the pool "
            "(A10, A100-80, H100-SXM, L40S)",
            id="a catalog model the pool does not have",
        ),
        pytest.param(
            {"P1": ["H100", "H100-SXM"]},
            "scheduler.gpu_model_order: GPU model order for P1 names H100-SXM twice; list each model once",
            id="one model twice under two names",
        ),
        pytest.param(
            {"P1": []}, "scheduler.gpu_model_order.P1: expected a non-empty list of GPU models", id="empty list"
        ),
        pytest.param(
            ["H100-SXM"], "scheduler.gpu_model_order: expected a mapping of tier to a list of GPU models", id="a list"
        ),
    ],
)
def test_a_bad_gpu_model_order_names_the_key_and_the_fix(order: object, message: str) -> None:
    with pytest.raises(PlatformConfigError) as err:
        config_from_dict({**GOOD, "scheduler": {"gpu_model_order": order}})
    assert message in str(err.value)


def test_the_platform_config_reads_the_order_with_catalog_names() -> None:
    doc = {"gpu_model_order": {"online-training": ["H100", "A100-80GB"], "P0": "L40S"}}
    order = config_from_dict({**GOOD, "scheduler": doc}).scheduler.gpu_model_order
    assert order.by_tier == (("P0", ("L40S",)), ("online-training", ("H100-SXM", "A100-80")))
    assert order.models_for(Tier.ONLINE_TRAINING) == ("H100-SXM", "A100-80")
    assert order.models_for(Tier.BATCH_INFERENCE) == ()
    assert config_from_dict(GOOD).scheduler.gpu_model_order == GpuModelOrder()  # the default: none


# -- the bundled platform config ------------------------------------------------------------------

TRAINING_GPUS = {"H100-SXM", "A100-80"}
INFERENCE_CARDS = {"L40S", "A10"}
LIFECYCLE = [  # run id, code location, project, tier, GPU tag and value, where it belongs
    ("research-training", "research", "vision", "online-training", rt.GPUS, "4", TRAINING_GPUS),
    ("product-training", "product", "serving", "online-training", rt.GPUS, "2", TRAINING_GPUS),
    ("probe", "research", "vision", "offline-training", rt.GPUS, "1", TRAINING_GPUS),
    ("evaluation", "research", "vision", "batch-inference", rt.GPU_MILLI, "250", INFERENCE_CARDS),
    ("replica", "product", "serving", "inference", rt.GPU_MILLI, "250", INFERENCE_CARDS),
]


def landed_on(config_path: Path, drop_order: bool = False) -> dict[str, set[str]]:
    """The GPU models each lifecycle run gets on the idle bundled pool, through the tick's plan."""
    config = load_config(config_path)
    if drop_order:
        config = replace(config, scheduler=replace(config.scheduler, gpu_model_order=GpuModelOrder()))
    runs = [
        GatedRun(run_id, {rt.TIER: tier, rt.PROJECT: project, tag: value}, location)
        for run_id, location, project, tier, tag, value, _ in LIFECYCLE
    ]
    plan = plan_tick(config.pool, config.book, [], runs, 100.0, config)
    models = {n.name: n.model.name for n in config.pool.nodes if n.model}
    return {a.request_id: {models[s.node] for s in a.allocation.placement.slices} for a in plan.result.admits}


def test_the_bundled_config_puts_training_on_training_gpus_and_inference_on_inference_cards() -> None:
    landed = landed_on(REPO / "xirang.yaml")
    assert landed == {run_id: landed[run_id] for run_id, *_ in LIFECYCLE}  # every run admitted
    for run_id, *_, belongs in LIFECYCLE:
        assert landed[run_id] <= belongs, (run_id, landed[run_id])


def test_without_its_order_the_bundled_pool_packs_training_onto_inference_cards() -> None:
    """Why the bundled config sets an order: density packing alone puts training on A10s."""
    landed = landed_on(REPO / "xirang.yaml", drop_order=True)
    assert landed["research-training"] <= INFERENCE_CARDS
