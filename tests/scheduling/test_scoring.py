"""Node scorers on small hand-built states: which node and which GPUs each policy picks, and why."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xirang_platform.pool.model import GpuModel, Node, Pool
from xirang_platform.scheduling.feasibility import single_node_fit, unit_rounded
from xirang_platform.scheduling.model import GpuSlice, NodeShare, Placement, Request, Tier
from xirang_platform.scheduling.scorers import FGD, BestFit, Xirang, make_scorer
from xirang_platform.scheduling.scorers.fragmentation import (
    NodeKind,
    TypicalWorkload,
    fragmentation,
    unusable_after_whole,
    weigh_shares,
)
from xirang_platform.scheduling.scorers.memo import _distinct_rows
from xirang_platform.scheduling.state import ClusterState

GPU = GpuModel("T", 16384, 10)


def pool(*nodes: tuple[int, int]) -> Pool:
    """Nodes n0, n1, ... each (GPU count, CPU milli), 1 milli compute units, plenty of memory."""
    return Pool(tuple(Node(f"n{i}", GPU, g, cpu, 1 << 20, "d0", unit_milli=1) for i, (g, cpu) in enumerate(nodes)))


def state(p: Pool, used: dict[int, tuple[list[int], int]] | None = None) -> ClusterState:
    """A state of `p` where node i has the per-GPU milli and the CPU milli of `used[i]` taken
    (taken, not free: `([1000, 0], 0)` leaves GPU 1 free)."""
    s = ClusterState(p)
    for i, (gpu_used, cpu_used) in (used or {}).items():
        name = p.nodes[i].name
        s.apply(
            Placement(tuple(GpuSlice(name, g, m) for g, m in enumerate(gpu_used) if m), (NodeShare(name, cpu_used, 0),))
        )
    return s


def pod(milli: int = 1000, gpus: int = 1, cpu: int = 1000) -> Request:
    """A single-node pod of `gpus` GPUs with `milli` of each (gpus=0: CPU-only)."""
    return Request(
        "p", "t", "p", Tier.OFFLINE_TRAINING, 0.0, gpus=gpus, milli_per_gpu=milli, cpu_milli=cpu, single_node=True
    )


def workload(*shapes: tuple[int, int, int, float]) -> TypicalWorkload:
    """A typical workload from (cpu, milli, gpus, probability) rows."""
    a = np.array(shapes, dtype=np.float64)
    return TypicalWorkload(a[:, 0].astype(np.int64), a[:, 1].astype(np.int64), a[:, 2].astype(np.int64), a[:, 3])


def pick(scorer, s: ClusterState, request: Request, priority: list[int] | None = None) -> tuple[int, tuple[int, ...]]:
    nodes = single_node_fit(s, request)
    need = unit_rounded(s, request.milli_per_gpu)[nodes] if request.gpus else np.zeros(len(nodes), np.int64)
    prio = np.array(priority if priority is not None else range(len(s.names)), dtype=np.int64)
    return scorer.pick(s, request, nodes, need, prio)


HALVES = workload((1000, 500, 1, 1.0))  # every typical pod asks half a GPU
WHOLE = workload((1000, 1000, 1, 1.0))  # every typical pod asks one whole GPU
# Whole GPUs and shares of four sizes, with CPU.
MIXED = workload(
    (8000, 1000, 1, 0.6), (2000, 810, 1, 0.15), (8000, 470, 1, 0.1), (8000, 650, 1, 0.05), (4000, 320, 1, 0.1)
)

CASES = [
    pytest.param(
        BestFit(),
        pool((4, 64000), (4, 64000)),
        {0: ([1000, 1000, 0, 0], 8000)},
        pod(),
        None,
        (0, (2,)),
        id="bestfit: the fullest node, then its lowest free GPU",
    ),
    pytest.param(
        BestFit(),
        pool((2, 64000), (2, 64000)),
        {},
        pod(),
        [1, 0],
        (1, (0,)),
        id="bestfit: identical nodes go to the lowest priority",
    ),
    pytest.param(
        BestFit(),
        pool((1, 64000)),
        {0: ([0], 0)},
        pod(300),
        None,
        (0, (0,)),
        id="bestfit: a share on an empty GPU",
    ),
    pytest.param(
        BestFit(),
        pool((3, 64000)),
        {0: ([0, 600, 500], 0)},
        pod(300),
        None,
        (0, (1,)),
        id="bestfit GPU choice 'best': the GPU with the least free milli that still fits",
    ),
    pytest.param(
        # Exact best fit takes n0 (500 left vs 540); the integer score ties them (both 96): priority.
        BestFit(integer_score=True),
        pool((8, 0), (8, 0)),
        {0: ([1000] * 7 + [0], 0), 1: ([1000] * 6 + [960, 0], 0)},
        pod(500, cpu=0),
        [1, 0],
        (1, (7,)),
        id="bestfit integer score: FGD's truncation ties close nodes, priority decides",
    ),
    pytest.param(
        FGD(HALVES),
        pool((1, 64000), (1, 64000)),
        {0: ([500], 0)},
        pod(300),
        None,
        (1, (0,)),
        id="fgd: a 300 share avoids leaving a 200 sliver no typical half can use",
    ),
    pytest.param(
        BestFit(),
        pool((1, 64000), (1, 64000)),
        {0: ([500], 0)},
        pod(300),
        None,
        (0, (0,)),
        id="bestfit on the same state: it leaves the sliver",
    ),
    pytest.param(
        FGD(HALVES),
        pool((2, 64000)),
        {0: ([0, 500], 0)},
        pod(300),
        None,
        (0, (0,)),
        id="fgd GPU choice: the GPU whose remainder still hosts a typical half",
    ),
    pytest.param(
        FGD(HALVES),
        pool((2, 64000)),
        {},
        pod(300),
        None,
        (0, (0,)),
        id="fgd GPU ties: first index",
    ),
    pytest.param(
        FGD(WHOLE),
        pool((2, 64000), (2, 64000)),
        {0: ([1000, 0], 1000)},
        pod(),
        [1, 0],
        (1, (0,)),
        id="fgd node ties: lowest priority, even onto an untouched node",
    ),
    pytest.param(
        Xirang(WHOLE),
        pool((2, 64000), (2, 64000)),
        {0: ([1000, 0], 1000)},
        pod(),
        [1, 0],
        (0, (1,)),
        id="xirang node ties: a node already in use before an untouched one",
    ),
    pytest.param(
        FGD(WHOLE),
        pool((2, 64000), (2, 64000)),
        {0: ([1000, 1000], 2000)},
        pod(gpus=0),
        [1, 0],
        (1, ()),
        id="fgd CPU-only ties: lowest priority",
    ),
    pytest.param(
        Xirang(WHOLE),
        pool((2, 64000), (2, 64000)),
        {0: ([1000, 1000], 2000)},
        pod(gpus=0),
        [1, 0],
        (0, ()),
        id="xirang CPU-only ties: the node whose GPUs are taken, its CPU is no use to GPU pods",
    ),
    pytest.param(
        Xirang(HALVES),
        pool((1, 64000), (1, 64000)),
        {0: ([500], 0)},
        pod(300),
        None,
        (1, (0,)),
        id="xirang keeps FGD's fragmentation score first",
    ),
    pytest.param(
        Xirang(MIXED),
        pool((2, 32000), (2, 32000)),
        {0: ([470, 0], 0), 1: ([470, 0], 12000)},
        pod(810, cpu=2000),
        None,
        (1, (1,)),
        id="xirang shares weighted up: an 810 takes the whole GPU whose node has less CPU left to fill it",
    ),
    pytest.param(
        Xirang(MIXED, share_weight=1.0),
        pool((2, 32000), (2, 32000)),
        {0: ([470, 0], 0), 1: ([470, 0], 12000)},
        pod(810, cpu=2000),
        None,
        (0, (1,)),
        id="xirang at FGD's weights: the whole-GPU shapes even out the two nodes' scores, priority decides",
    ),
    pytest.param(
        FGD(WHOLE),
        pool((4, 64000)),
        {0: ([1000, 0, 0, 0], 0)},
        pod(gpus=2),
        None,
        (0, (1, 2)),
        id="fgd whole GPUs: the lowest-index free ones",
    ),
]


A_GPU, B_GPU = GpuModel("A", 16384, 10), GpuModel("B", 16384, 10)


def two_models(*gpus: int) -> Pool:
    """Node n0 of model A, then nodes n1, n2, ... of model B, each with its GPU count and 64 cores."""
    return Pool(
        tuple(
            Node(f"n{i}", A_GPU if i == 0 else B_GPU, g, 64000, 1 << 20, "d0", unit_milli=1) for i, g in enumerate(gpus)
        )
    )


def constrained(*shapes: tuple[int, int, int, float, frozenset[str]]) -> TypicalWorkload:
    """A typical workload from (cpu, milli, gpus, probability, allowed models) rows."""
    wl = workload(*(s[:4] for s in shapes))
    return TypicalWorkload(wl.cpu, wl.milli, wl.gpus, wl.prob, tuple(s[4] for s in shapes))


# Half the typical pods must run on model A, half may run anywhere: whole GPUs, or halves.
HALF_ON_A = constrained((1000, 1000, 1, 0.5, frozenset({"A"})), (1000, 1000, 1, 0.5, frozenset()))
HALVES_ON_A = constrained((1000, 500, 1, 0.5, frozenset({"A"})), (1000, 500, 1, 0.5, frozenset()))

GPU_SPEC_CASES = [
    pytest.param(
        Xirang(HALF_ON_A),
        two_models(2, 2),
        {},
        pod(),
        None,
        (1, (0,)),
        id="xirang gpu_spec: an unconstrained pod takes model B on a tie, A is contended by A-only pods",
    ),
    pytest.param(
        FGD(HALF_ON_A),
        two_models(2, 2),
        {},
        pod(),
        None,
        (1, (0,)),
        id="fgd gpu_spec: the same, by counting model B's free GPUs as fragment for A-only pods",
    ),
    pytest.param(
        Xirang(WHOLE),
        two_models(2, 2),
        {},
        pod(),
        None,
        (0, (0,)),
        id="xirang without gpu_spec in the workload: identical nodes, priority decides",
    ),
    pytest.param(
        Xirang(HALVES_ON_A),
        two_models(1, 1),
        {0: ([500], 0), 1: ([500], 0)},
        pod(300),
        None,
        (1, (0,)),
        id="xirang gpu_spec: a share strands its sliver on model B, keeping A's half for the A-only pods",
    ),
]


@pytest.mark.parametrize(("scorer", "p", "used", "request_", "priority", "want"), GPU_SPEC_CASES)
def test_scorer_picks_with_gpu_spec(scorer, p, used, request_, priority, want):
    assert pick(scorer, state(p, used), request_, priority) == want


A2, B8 = NodeKind("A", 2, 64000), NodeKind("B", 8, 64000)


def test_demand_access_weighs_a_shape_by_the_gpus_it_may_use():
    # The A-only shape may use 2 of 10 GPUs: on an A node it presses 5 times harder than the free one.
    row = HALF_ON_A.access(A2, {A2: 2, B8: 8}, rule="demand")
    assert row[0].tolist() == [1.0, 1.0]
    assert row[1].round(6).tolist() == [round(5 / 6, 6), round(1 / 6, 6)]
    on_b = HALF_ON_A.access(B8, {A2: 2, B8: 8}, rule="demand")
    assert (on_b[0].tolist(), on_b[1].tolist()) == ([0.0, 1.0], [0.0, 1.0])
    fgd_rule = HALF_ON_A.access(B8, {A2: 2, B8: 8}, rule="fgd")
    assert (fgd_rule[0].tolist(), fgd_rule[1].tolist()) == ([0.0, 1.0], [0.5, 0.5])


@pytest.mark.parametrize(
    ("kind", "want_use", "want_weight"),
    [
        # The 8-GPU, 120-core shape fits only the 128-core node (8 of 16 GPUs): twice its probability there.
        pytest.param(NodeKind("T", 8, 128000), [1.0, 1.0], [0.5, 0.5], id="the big node counts both shapes"),
        pytest.param(NodeKind("T", 8, 96000), [1.0, 0.0], [1.0, 0.0], id="too little CPU for the big shape"),
        pytest.param(NodeKind("T", 2, 128000), [1.0, 0.0], [1.0, 0.0], id="too few GPUs for the big shape"),
    ],
)
def test_demand_access_counts_only_the_shapes_a_node_could_ever_host(kind, want_use, want_weight):
    wl = workload((4000, 1000, 1, 2 / 3), (120000, 1000, 8, 1 / 3))
    pool_kinds = {NodeKind("T", 8, 128000): 8, NodeKind("T", 8, 96000): 8}
    row = wl.access(kind, pool_kinds, rule="demand")
    assert (row[0].tolist(), row[1].round(6).tolist()) == (want_use, want_weight)
    fgd_rule = wl.access(kind, pool_kinds, rule="fgd")
    assert fgd_rule[1].round(6).tolist() == [round(2 / 3, 6), round(1 / 3, 6)]


def test_a_share_is_measured_with_the_share_shapes_weighted_up():
    wl = workload((1000, 1000, 1, 0.5), (1000, 500, 1, 0.3), (1000, 250, 1, 0.1), (2000, 0, 0, 0.1))
    rows = weigh_shares(wl, None, 2, 10.0)
    assert rows.shape == (2, 2, 4)
    assert rows[0, 0].tolist() == [1.0, 1.0, 1.0, 1.0]
    # 0.5 : 3 : 1 : 0.1, renormalized over 4.6.
    assert rows[0, 1].round(6).tolist() == [round(x / 4.6, 6) for x in (0.5, 3.0, 1.0, 0.1)]
    # A node where no shape weighs keeps its weights.
    none = np.zeros((1, 2, 4))
    assert weigh_shares(wl, none, 1, 10.0).tolist() == none.tolist()


def test_typical_workload_groups_by_allowed_models():
    spec = Request(
        "c", "t", "p", Tier.OFFLINE_TRAINING, 0.0, gpus=1, cpu_milli=1000, gpu_models=frozenset({"A"}), single_node=True
    )
    wl = TypicalWorkload.from_requests([pod(), pod(), spec])
    assert (wl.milli.tolist(), wl.models) == ([1000, 1000], (frozenset(), frozenset({"A"})))
    assert TypicalWorkload.from_requests([pod(), pod(500)]).models == ()


@pytest.mark.parametrize(("scorer", "p", "used", "request_", "priority", "want"), CASES)
def test_scorer_picks(scorer, p, used, request_, priority, want):
    assert pick(scorer, state(p, used), request_, priority) == want


@pytest.mark.parametrize(
    ("cpu", "left", "want"),
    [
        pytest.param(64000, [500, 1000], 0.0, id="every GPU hosts a typical half: no fragment"),
        pytest.param(64000, [200, 1000], 200.0, id="a 200 sliver is a fragment"),
        pytest.param(500, [200, 1000], 1200.0, id="too little CPU: all free GPU is fragment"),
    ],
)
def test_fragmentation_of_one_node(cpu, left, want):
    got = fragmentation(np.array([cpu]), np.array([left]), HALVES)
    assert got.tolist() == [want]


@pytest.mark.parametrize(
    ("cpu", "left", "want_fgd", "want_fit"),
    [
        # One typical whole-GPU pod fits, so FGD sees no fragment; CPU for only one of the two GPUs.
        pytest.param(1500, [1000, 1000], 0.0, 1000.0, id="CPU for one pod: the second GPU is stranded"),
        pytest.param(2000, [1000, 1000], 0.0, 0.0, id="CPU for both: nothing stranded"),
        pytest.param(5000, [1000, 400], 400.0, 400.0, id="a partial GPU is a fragment for whole-GPU pods"),
    ],
)
def test_fill_measure_counts_how_many_pods_fit_not_whether_one_does(cpu, left, want_fgd, want_fit):
    cpu_a, left_a = np.array([cpu]), np.array([left])
    assert fragmentation(cpu_a, left_a, WHOLE).tolist() == [want_fgd]
    before, _ = unusable_after_whole(cpu_a, left_a, 0, 0, WHOLE)
    assert before.tolist() == [want_fit]


def test_typical_workload_keeps_the_shape_that_crosses_the_coverage_line():
    reqs = [pod(500)] * 6 + [pod(1000)] * 3 + [pod(gpus=0)]
    # 6/10 < 0.95, 9/10 < 0.95, 10/10 crosses: all three shapes, renormalized.
    wl = TypicalWorkload.from_requests(reqs, coverage=0.95)
    assert (wl.milli.tolist(), wl.prob.tolist()) == ([500, 1000, 0], [0.6, 0.3, 0.1])
    wl90 = TypicalWorkload.from_requests(reqs, coverage=0.9)
    assert (wl90.milli.tolist(), wl90.prob.round(6).tolist()) == ([500, 1000], [0.666667, 0.333333])


def test_xirang_keeps_the_rare_shapes_fgds_cut_drops():
    # 2% of the pods need 8 GPUs: below FGD's 95% line, within ours (99%).
    reqs = [pod(500)] * 98 + [pod(gpus=8)] * 2
    assert make_scorer("fgd", reqs).workload.gpus.tolist() == [1]
    assert make_scorer("xirang", reqs).workload.gpus.tolist() == [1, 8]
    assert make_scorer("xirang").for_requests(reqs).workload.gpus.tolist() == [1, 8]


def test_typical_workload_orders_equal_counts_by_larger_shape():
    wl = TypicalWorkload.from_requests([pod(300), pod(700)], coverage=0.5)
    assert wl.milli.tolist() == [700]


def test_xirang_without_workload_still_places():
    s = state(pool((2, 64000), (8, 64000)))
    node, gpus = pick(make_scorer("xirang"), s, pod(250))
    assert s.gpu_free[node, gpus[0]] >= 250


@pytest.mark.parametrize(
    ("name", "options", "match"),
    [
        pytest.param("fdg", {}, "unknown placement policy 'fdg'; choose one of", id="misspelled policy"),
        pytest.param("xirang", {"tie": "fullest"}, "tie keys \\['fullest'\\] are unknown", id="bad tie key"),
        pytest.param("xirang", {"score": "exact"}, "score must be 'int' or 'float'", id="bad score"),
        pytest.param("xirang", {"measure": "area"}, "measure must be 'fgd', 'fit' or 'blend'", id="bad measure"),
        pytest.param("xirang", {"fit_weight": 2.0}, "fit_weight must be in 0..1", id="bad fit weight"),
        pytest.param("xirang", {"share_weight": 0.0}, "share_weight must be > 0", id="bad share weight"),
    ],
)
def test_bad_scorer_options_are_named(name, options, match):
    with pytest.raises(ValueError, match=match):
        make_scorer(name, **options)


@st.composite
def node_states(draw):
    n = draw(st.integers(1, 6))
    used = {}
    for i in range(n):
        gpu_used = draw(st.lists(st.integers(0, 1000), min_size=4, max_size=4))
        used[i] = (gpu_used, draw(st.integers(0, 30000)))
    return n, used


@settings(max_examples=40, deadline=None)
@given(node_states(), st.sampled_from([(300, 1), (1000, 1), (1000, 2), (1000, 0)]), st.integers(0, 2))
def test_memo_never_changes_a_choice(ns, shape, policy):
    """A scorer whose memo saw other states picks what a fresh scorer picks."""
    n, used = ns
    p = pool(*[(4, 32000)] * n)
    wl = workload((1000, 500, 1, 0.5), (4000, 1000, 1, 0.3), (2000, 0, 0, 0.2))
    cls = [FGD, Xirang, lambda w: Xirang(w, measure="fit", score="float", gpu_tie="first")][policy]
    warm = cls(wl)
    request = pod(shape[0], gpus=shape[1])
    s = state(p, used)
    if len(single_node_fit(s, request)) == 0:
        return
    pick(warm, state(p), request)  # the memo learns the empty pool first
    pick(warm, state(p, {0: ([1000, 0, 0, 0], 1000)}), request)
    assert pick(warm, s, request) == pick(cls(wl), s.copy(), request)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([2, 4]), st.lists(st.sampled_from([0, 180, 250, 500, 750, 1000]), min_size=4, max_size=4)
        ),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from([(300, 1), (500, 1), (810, 1), (1000, 1), (1000, 2)]),
)
def test_memo_scores_and_chooses_as_the_node_content_itself(nodes_used, shape):
    """Xirang's memo keys contents without their GPUs' order: every node's memoised score and GPU
    are what evaluating its own content gives (the oracle: `_evaluate` on the node's row, in order;
    nodes of 2 and 4 GPUs, so rows are padded too)."""
    p = pool(*[(gpus, 32000) for gpus, _ in nodes_used])
    s = state(p, {i: (used[:gpus], 1000 * i) for i, (gpus, used) in enumerate(nodes_used)})
    scorer = Xirang(MIXED)
    request = pod(shape[0], gpus=shape[1])
    nodes = single_node_fit(s, request)
    if len(nodes) == 0:
        return
    need = unit_rounded(s, request.milli_per_gpu)[nodes]
    memo_score = scorer.node_scores(s, request, nodes, need)
    gpus_per_kind: dict[NodeKind, int] = {}
    for gpus, _ in nodes_used:
        kind = NodeKind(GPU.name, gpus, 32000)
        gpus_per_kind[kind] = gpus_per_kind.get(kind, 0) + gpus
    for k, node in enumerate(nodes.tolist()):
        access = scorer.memo.access(NodeKind(GPU.name, int(s.gpu_count[node]), 32000), gpus_per_kind)[None]
        score, choice = scorer._evaluate(
            s.cpu_free[[node]], s.gpu_free[[node]], access, request.cpu_milli, int(need[k]), request.gpus
        )
        assert memo_score[k] == score[0]
        _, gpus = scorer.pick_top(s, request, nodes[[k]], need[[k]], np.zeros(len(p.nodes), np.int64))
        if choice[0] >= 0:  # a share: the GPU the evaluation chose on the node's own GPU order
            assert gpus == (int(choice[0]),)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(-1, 2), st.integers(0, 3), st.sampled_from([0, 8, 64000, 10**6])), max_size=40))
def test_node_kinds_are_found_as_np_unique_finds_them(rows):
    table = np.array(rows, dtype=np.int64).reshape(-1, 3)  # model id, GPU count, CPU capacity per node
    columns = (table[:, 0], table[:, 1], table[:, 2])
    kinds, inverse = np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)
    got_kinds, got_inverse = _distinct_rows(*columns)
    assert got_kinds.tolist() == kinds.tolist()
    assert got_inverse.tolist() == inverse.ravel().tolist()


def test_nodes_whose_gpus_differ_only_in_order_share_one_memo_entry():
    p = pool((4, 32000), (4, 32000))
    s = state(p, {0: ([250, 0, 1000, 0], 0), 1: ([0, 1000, 0, 250], 0)})
    assert Xirang(MIXED).memo.node_ids(s).tolist() == [0, 0]
    assert FGD(MIXED).memo.node_ids(s).tolist() == [0, 1]  # FGD's first-index GPU choice keeps the order


def test_the_default_scorer_learns_the_workload_a_cycle_sees_and_falls_back_to_the_generic_one():
    learner = make_scorer("xirang")  # no requests: the live tick's case
    assert learner.for_requests([]) is learner.unfitted
    assert learner.unfitted.workload.milli.tolist() == TypicalWorkload.generic().milli.tolist()
    seen = [pod(500), pod(500), pod()]
    fitted = learner.for_requests(seen)
    assert (fitted.workload.milli.tolist(), fitted.workload.prob.round(6).tolist()) == (
        [500, 1000],
        [0.666667, 0.333333],
    )
    assert learner.for_requests(list(reversed(seen))) is fitted  # same workload: same scorer, its memo kept
