"""The fragmentation measures taken of a node's states at once (as it is, and after a pod is placed)
equal the measures of each state taken alone, and Xirang's per-class share rows equal the rows
weighed per call."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from xirang_platform.scheduling.scorers import Xirang
from xirang_platform.scheduling.scorers.fragmentation import (
    NodeKind,
    TypicalWorkload,
    frag_after_share,
    frag_after_whole,
    fragmentation,
    unusable_after_share,
    unusable_after_whole,
    weigh_shares,
)

# Shares of three sizes, whole GPUs of 1 and 2, a CPU-only shape; two of them only on model "A".
WL = TypicalWorkload(
    cpu=np.array([2000, 4000, 8000, 16000, 3000, 8000]),
    milli=np.array([250, 500, 1000, 1000, 0, 300]),
    gpus=np.array([1, 1, 1, 2, 0, 1]),
    prob=np.array([0.2, 0.2, 0.3, 0.1, 0.1, 0.1]),
    models=(frozenset(), frozenset({"A"}), frozenset(), frozenset({"A"}), frozenset(), frozenset()),
)
KINDS = [NodeKind(m, 4, c) for m in ("A", "B") for c in (8000, 64000)]
GPUS_PER_KIND = {k: 4 for k in KINDS}


@st.composite
def nodes(draw) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """1-3 nodes of 4 GPUs: free CPU, free milli per GPU, and their access rows (or None)."""
    n = draw(st.integers(1, 3))
    cpu = np.array(draw(st.lists(st.integers(0, 64).map(lambda k: 1000 * k), min_size=n, max_size=n)))
    milli = st.sampled_from([0, 100, 250, 300, 500, 700, 1000])
    left = np.array(draw(st.lists(st.lists(milli, min_size=4, max_size=4), min_size=n, max_size=n)))
    if draw(st.booleans()):
        return cpu, left, None
    rule = draw(st.sampled_from(["fgd", "demand"]))
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=n, max_size=n))
    return cpu, left, np.array([WL.access(k, GPUS_PER_KIND, rule) for k in kinds])


@settings(max_examples=150, deadline=None)
@given(nodes(), st.sampled_from([(1000, 250), (4000, 300), (0, 500), (9000, 700)]))
def test_a_share_is_measured_as_the_node_with_it_placed(ns, shape):
    cpu, left, access = ns
    req_cpu, milli = shape
    for measure, alone in (
        (frag_after_share, lambda c, g, a: fragmentation(c, g, WL, a)),
        (unusable_after_share, lambda c, g, a: unusable_after_whole(c, g, 0, 0, WL, a)[0]),
    ):
        before, after = measure(cpu, left, req_cpu, milli, WL, access)
        np.testing.assert_allclose(before, alone(cpu, left, access), rtol=1e-12)
        for i in range(len(cpu)):
            row = None if access is None else access[i : i + 1]
            for g in range(left.shape[1]):
                placed = left[i : i + 1].copy()
                placed[0, g] -= milli
                want = alone(cpu[i : i + 1] - req_cpu, placed, row)[0] if placed[0, g] >= 0 else np.inf
                np.testing.assert_allclose(after[i, g], want, rtol=1e-12)


@settings(max_examples=150, deadline=None)
@given(nodes(), st.sampled_from([(1000, 1), (8000, 2), (3000, 0)]))
def test_whole_gpus_are_measured_as_the_node_with_them_placed(ns, shape):
    cpu, left, access = ns
    req_cpu, gpus = shape
    for measure, alone in (
        (frag_after_whole, lambda c, g, a: fragmentation(c, g, WL, a)),
        (unusable_after_whole, lambda c, g, a: unusable_after_whole(c, g, 0, 0, WL, a)[0]),
    ):
        before, after = measure(cpu, left, req_cpu, gpus, WL, access)
        np.testing.assert_allclose(before, alone(cpu, left, access), rtol=1e-12)
        for i in range(len(cpu)):
            free = np.flatnonzero(left[i] == 1000)
            if len(free) < gpus:
                continue  # not a node the pod fits
            placed = left[i : i + 1].copy()
            placed[0, free[:gpus]] = 0
            row = None if access is None else access[i : i + 1]
            np.testing.assert_allclose(after[i], alone(cpu[i : i + 1] - req_cpu, placed, row)[0], rtol=1e-12)


def test_xirang_keeps_per_class_the_share_rows_it_would_weigh_per_call():
    for access in ("fgd", "demand"):
        scorer = Xirang(WL, access=access, share_weight=20.0)
        rows = np.array([scorer._access_rows(k, GPUS_PER_KIND) for k in KINDS])
        plain = np.array([WL.access(k, GPUS_PER_KIND, access) for k in KINDS])
        assert rows[:, 0].tobytes() == plain.tobytes()
        assert rows[:, 1].tobytes() == weigh_shares(WL, plain, len(KINDS), 20.0).tobytes()
