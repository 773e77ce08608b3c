"""Placement from values kept in sync per node (scores per shape, fit masks, gang groups) decides
exactly as placement from scratch, through admissions, releases and copies of the state."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from xirang_platform.pool.model import GpuModel, Node, Pool
from xirang_platform.scheduling.feasibility import eligible_nodes, fit_mask, single_node_fit
from xirang_platform.scheduling.model import Placement, Request, Tier
from xirang_platform.scheduling.placement import (
    TopScores,
    as_placed,
    is_single_node,
    place,
    place_gang,
    place_single_node,
)
from xirang_platform.scheduling.scorers import FGD, NodeScorer, Xirang, is_node_local, make_scorer
from xirang_platform.scheduling.state import ClusterState

MODELS = (GpuModel("A", 40960, 10), GpuModel("B", 81920, 20))
SHARE = Request("r", "t", "p", Tier.INFERENCE, 0.0, gpus=1, milli_per_gpu=500)


def from_scratch(
    state: ClusterState,
    request: Request,
    scorer: NodeScorer,
    priority: np.ndarray,
    allowed: np.ndarray | None,
    max_milli: int | None,
) -> Placement | None:
    """The reference: every filter and score recomputed over the whole pool (the exact functions)."""
    request = as_placed(request)
    eligible = eligible_nodes(state, request) if allowed is None else eligible_nodes(state, request) & allowed
    if is_single_node(request):
        return place_single_node(state, request, scorer, priority, eligible, max_milli)
    if max_milli is not None and request.total_milli > max_milli:
        return None
    found = place_gang(state, request, priority, eligible, by_group=True)
    if found is None and request.tier.rules.mixed_fallback:
        found = place_gang(state, request, priority, eligible, by_group=False)
    return found


@dataclass(frozen=True)
class Step:
    kind: str  # "place", "release" (the oldest placement held), "release all" or "copy" (go on with a copy)
    request: Request | None = None
    max_milli: int | None = None
    allowed_seed: int | None = None


def requests() -> st.SearchStrategy[Request]:
    share = st.builds(
        lambda milli, cpu, mem, tier: Request(
            "r", "t", "p", tier, 0.0, gpus=1, milli_per_gpu=milli, cpu_milli=cpu, gpu_memory_mib=mem
        ),
        st.sampled_from([100, 250, 500, 1000]),
        st.sampled_from([0, 2000, 16000]),
        st.sampled_from([0, 20000, 40000, 60000]),
        st.sampled_from([Tier.INFERENCE, Tier.OFFLINE_TRAINING]),
    )
    pod = st.builds(
        lambda gpus, cpu, models: Request(
            "r", "t", "p", Tier.INFERENCE, 0.0, gpus=gpus, cpu_milli=cpu, gpu_models=models, single_node=True
        ),
        st.integers(0, 4),
        st.sampled_from([1000, 8000]),
        st.sampled_from([frozenset(), frozenset({"B"})]),
    )
    gang = st.builds(
        lambda gpus, cpu, tier: Request("r", "t", "p", tier, 0.0, gpus=gpus, cpu_milli=cpu * gpus),
        st.integers(2, 12),
        st.sampled_from([0, 4000, 20000]),
        st.sampled_from([Tier.ONLINE_TRAINING, Tier.OFFLINE_TRAINING]),
    )
    return st.one_of(share, pod, gang)


steps = st.one_of(
    st.builds(
        Step,
        st.just("place"),
        requests(),
        st.one_of(st.none(), st.sampled_from([100, 375, 1000, 4000])),
        st.one_of(st.none(), st.integers(0, 1000)),
    ),
    st.builds(Step, st.sampled_from(["release", "release all", "copy"])),
)

pools = st.lists(
    st.tuples(st.integers(0, 1), st.sampled_from([0, 2, 4, 8]), st.sampled_from([1, 125, 250]), st.integers(0, 2)),
    min_size=1,
    max_size=10,
).map(
    lambda rows: Pool(
        tuple(
            Node(f"n{i:02d}", MODELS[m] if g else None, g, 64000, 1 << 20, f"d{d}", unit_milli=u)
            for i, (m, g, u, d) in enumerate(rows)
        )
    )
)


@settings(max_examples=150, deadline=None)
@given(pools, st.lists(steps, min_size=1, max_size=40), st.sampled_from(["xirang", "fgd", "xirang-fitted", "learned"]))
def test_kept_values_decide_as_from_scratch(pool: Pool, script: list[Step], policy: str) -> None:
    scorer: NodeScorer = {
        "xirang": Xirang(),
        "fgd": FGD(),
        "xirang-fitted": make_scorer("xirang", [SHARE, *(s.request for s in script if s.request is not None)]),
        "learned": make_scorer("xirang"),  # not fitted to a cycle: the generic workload
    }[policy]
    assert is_node_local(scorer)
    state = ClusterState(pool)
    priority = np.random.default_rng(len(script)).permutation(len(pool.nodes)).astype(np.int64)
    held: list[Placement] = []
    for step in script:
        if step.kind == "copy":
            state = state.copy()
        elif step.kind == "release":
            if held:
                state.release(held.pop(0))
        elif step.kind == "release all":
            state.release_all(held)
            held = []
        else:
            assert step.request is not None
            allowed = None
            if step.allowed_seed is not None:
                allowed = np.random.default_rng(step.allowed_seed).random(len(pool.nodes)) < 0.6
            want = from_scratch(state, step.request, scorer, priority, allowed, step.max_milli)
            got = place(state, step.request, scorer, priority, allowed, step.max_milli)
            assert got == want
            placed = as_placed(step.request)
            if is_single_node(placed):
                assert bool(fit_mask(state, placed).any()) == (len(single_node_fit(state, placed)) > 0)
            if got is not None:
                state.apply(got)
                held.append(got)
    assert state.check() == []


def test_a_copy_reuses_what_its_original_derived_and_keeps_its_own_changes() -> None:
    pool = Pool(tuple(Node(f"n{i}", MODELS[0], 4, 64000, 1 << 20, "d0") for i in range(4)))
    request, scorer, priority = SHARE, Xirang(), np.arange(4)
    original = ClusterState(pool)
    first = place(original, request, scorer, priority)
    assert first is not None
    copy = original.copy()
    copy.apply(first)
    assert place(copy, request, scorer, priority) == from_scratch(copy, request, scorer, priority, None, None)
    # The original did not take the first placement: it still decides as from scratch.
    assert place(original, request, scorer, priority) == first


def test_values_stay_in_sync_after_the_change_log_is_cut() -> None:
    pool = Pool(tuple(Node(f"n{i}", MODELS[i % 2], 4, 64000, 1 << 20, "d0") for i in range(3)))
    request = Request("r", "t", "p", Tier.INFERENCE, 0.0, gpus=1, milli_per_gpu=250, gpu_memory_mib=30000)
    scorer, priority = Xirang(), np.arange(3)
    state = ClusterState(pool)
    first = place(state, request, scorer, priority)
    assert first is not None
    for _ in range(200):  # far past the log's limit for 3 nodes: the log is cut, readers compare stamps
        state.apply(first)
        state.release(first)
    state.apply(first)
    assert len(state.changes.rows) <= state.changes.limit
    assert place(state, request, scorer, priority) == from_scratch(state, request, scorer, priority, None, None)


score_values = st.sampled_from([-np.inf, 0.0, 1.0, 2.0, 3.0])


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 300),
    st.data(),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 12)), min_size=1, max_size=30),
)
def test_top_scores_kept_row_by_row_match_a_pass_over_every_node(
    size: int, data: st.DataObject, updates: list[tuple[int, int]]
) -> None:
    """The top score and its nodes, updated a few rows at a time (one row or several, over several
    blocks of rows), are always those of the whole array, whether the nodes were read after every
    update or only now and then (they are looked for when read)."""
    scores = np.array(data.draw(st.lists(score_values, min_size=size, max_size=size)))
    kept = TopScores(scores > -np.inf, scores.copy())
    for seed, count in updates:
        rows = np.unique(np.random.default_rng(seed).integers(0, size, count))
        new = np.array(data.draw(st.lists(score_values, min_size=len(rows), max_size=len(rows))))
        kept.update(rows, new > -np.inf, new)
        scores[rows] = new
        best = scores.max()
        assert kept.best == best
        if data.draw(st.booleans()):
            assert kept.top.tolist() == (np.flatnonzero(scores == best).tolist() if best > -np.inf else [])
    best = scores.max()
    assert kept.top.tolist() == (np.flatnonzero(scores == best).tolist() if best > -np.inf else [])


def untouched_reference(state: ClusterState, nodes: np.ndarray) -> np.ndarray:
    """Whether nothing is allocated on each of `nodes`, from its GPUs themselves."""
    whole = (state.gpu_free == 1000).sum(axis=1) == state.gpu_count
    return whole[nodes] & (state.cpu_free[nodes] == state.cpu_capacity[nodes])


@settings(max_examples=100, deadline=None)
@given(pools, st.lists(requests(), max_size=12), st.integers(0, 10**6), st.data())
def test_few_rows_read_on_their_own_and_ties_broken_match_the_whole_pool(
    pool: Pool, placed: list[Request], seed: int, data: st.DataObject
) -> None:
    """Content ids read from a few rows are those kept for every node (also in a GPU-memory view),
    and `pick_top` breaks ties as a lexsort of its keys over all the tied nodes (GPU and CPU-only requests)."""
    scorer, state = Xirang(), ClusterState(pool)
    rng = np.random.default_rng(seed)
    priority = rng.permutation(len(pool.nodes)).astype(np.int64)
    for request in placed:
        found = place(state, request, scorer, priority)
        if found is not None:
            state.apply(found)
    for view in (state, state.memory_view(20000)):
        kept = scorer.memo.node_ids(view)
        few = np.sort(rng.choice(len(pool.nodes), size=min(len(pool.nodes), 3), replace=False))
        assert scorer.memo.ids_of(view, few).tolist() == kept[few].tolist()
        assert [scorer.memo.id_at(view, n) for n in few.tolist()] == kept[few].tolist()
    size = data.draw(st.integers(1, len(pool.nodes)))
    nodes = np.sort(rng.choice(len(pool.nodes), size=size, replace=False))
    want = nodes[np.lexsort((priority[nodes], untouched_reference(state, nodes)))[0]]  # untouched last
    request = Request("r", "t", "p", Tier.INFERENCE, 0.0, gpus=1, milli_per_gpu=1)  # the keys ignore the fit
    assert scorer.pick_top(state, request, nodes, np.ones(len(nodes), np.int64), priority)[0] == want
    cpu_only = Request("r", "t", "p", Tier.INFERENCE, 0.0, gpus=0, cpu_milli=1)  # the least GPU, then CPU left
    want = nodes[np.lexsort((priority[nodes], state.cpu_free[nodes], state.gpu_free[nodes].sum(axis=1)))[0]]
    assert scorer.pick_top(state, cpu_only, nodes, np.zeros(len(nodes), np.int64), priority)[0] == want


def test_a_memo_cut_past_its_bound_scores_a_few_nodes_as_an_unbounded_one() -> None:
    """Reading a few rows' ids starts the memo afresh at most once per call: the ids read together
    are of one generation, so their scores are those an unbounded memo gives."""
    pool = Pool(tuple(Node(f"n{i}", MODELS[i % 2], 4, 64000, 1 << 20, "d0") for i in range(6)))
    state, unbounded, bounded = ClusterState(pool), Xirang(), Xirang()
    bounded.memo.MAX_CONTENTS = 1
    priority = np.arange(6)
    for milli in (250, 500, 750, 250, 1000):
        found = place(
            state, Request("r", "t", "p", Tier.INFERENCE, 0.0, gpus=1, milli_per_gpu=milli), unbounded, priority
        )
        assert found is not None
        state.apply(found)
    request = Request("r", "t", "p", Tier.INFERENCE, 0.0, gpus=1, milli_per_gpu=250)
    for nodes in ([0, 1, 2], [3, 4], [5], [0, 2, 4, 5]):
        rows = np.array(nodes)
        need = np.full(len(rows), 250)
        assert (
            bounded.node_scores(state, request, rows, need).tolist()
            == unbounded.node_scores(state, request, rows, need).tolist()
        )
