"""Issue 21's holding and lending cases (DESIGN.md 5.3 and 5.5), as a table: the gang reservation that
holds, the owner's demand before a borrower's, a request already running held with a reason.

Every row failed before its fix, or pins the other side of the same rule; the id says which.
"""

from __future__ import annotations

import pytest

from tests.scheduling.cycle_builders import Case, expected, job, node, outcome, quotas, running


def _backfilled(a_quota: float, b_start: float, **want) -> Case:
    """Two 8-GPU domains, 15 GPUs taken (1 by a, 14 by b from `b_start`), a's 8-GPU P2 gang waiting
    since t=5 and b's one more GPU; `want`: the case's expectations."""
    return Case(
        nodes=[node("n0").domain("d0"), node("n1").domain("d1")],
        book=quotas({"a": a_quota, "b": 16}),
        now=5_000,
        running=[
            running(job("a-small").tenant("a"), on={"n0": [0]}),
            running(job("b-fill0").gpus(7).tenant("b"), on={"n0": [1, 2, 3, 4, 5, 6, 7]}, start=b_start),
            running(job("b-fill1").gpus(7).tenant("b"), on={"n1": [0, 1, 2, 3, 4, 5, 6]}, start=b_start),
        ],
        pending=[job("big").gpus(8).tenant("a").at(5), job("b-late").tenant("b").at(4_900)],
        **want,
    )


STARVATION_HOLD = [
    pytest.param(
        Case(
            nodes=[node("n0").domain("d0"), node("n1").domain("d1")],
            book=quotas({"a": 16, "ops": 8}),
            now=5_000,
            running=[
                running(job("a1").gpus(4).tenant("a"), on={"n0": [0, 1, 2, 3]}),
                running(job("a2").gpus(5).tenant("a"), on={"n1": [0, 1, 2, 3, 4]}),
            ],
            pending=[
                job("serve").gpus(2).tier("inference").tenant("ops").at(0),
                job("big").gpus(8).tenant("a").at(0),
                job("late").gpus(2).tenant("a").at(4_900),
            ],
            # 7 GPUs free: the 8-GPU P2 gang is blocked, and n0 (4 free) is held for it. The 2-GPU
            # replica goes first and packs onto n1; the hold stays big's, so late waits for it.
            want_admit={"serve": {"n1": [5, 6]}},
            want_hold={"big": "no-fit", "late": "reserved-for-gang"},
            want_reserved_for="big",
        ),
        id="2a: a multi-GPU P0 replica never takes, uses up or lifts the starving gang's hold",
    ),
    pytest.param(
        _backfilled(8, 10, want_hold={"big": "no-fit", "b-late": "reserved-for-gang"}, want_reserved_for="big"),
        # 15 of 16 GPUs allocated: the ratio is 1.0 and a (quota 8, holding 1) could not take 8 more in
        # quota. Without b's backfill since t=5 (14 GPUs) the ratio is 1.2, the cap 9,600, and 1 + 8
        # fits: the gang is held for, and b-late may not take n1's last GPU.
        id="2b: whether the gang runs in quota is judged at the cap ratio without the backfill since it waits",
    ),
    pytest.param(
        # b's work ran before the gang came: it is not backfill the hold could have stopped. At 15 of
        # 16 GPUs the ratio stays 1.0, a could only borrow, and b-late takes the last GPU.
        _backfilled(8, 0, want_admit={"b-late": {"n1": [7]}}, want_hold={"big": "no-fit"}),
        id="2b: work that ran before the gang came is not backfill: it still counts in that ratio",
    ),
    pytest.param(
        # a's quota is 6: 1 + 8 > 7,200 even at the highest ratio, so the gang could only run borrowed
        # and nothing is held back for it.
        _backfilled(6, 10, want_admit={"b-late": {"n1": [7]}}, want_hold={"big": "no-fit"}),
        id="2b: a gang that could only run borrowed, even at the ratio without backfill, gets no hold",
    ),
    pytest.param(
        Case(
            nodes=[node("n0").domain("d0"), node("n1").domain("d1"), node("n2").domain("d2")],
            now=5_000,
            running=[
                running(job("x0").gpus(3), on={"n0": [0, 1, 2]}),
                running(job("x1").gpus(3), on={"n1": [0, 1, 2]}),
                running(job("x2").gpus(7), on={"n2": [0, 1, 2, 3, 4, 5, 6]}),
            ],
            pending=[job("big").gpus(12).at(0), job("one").at(4_900), job("two").gpus(2).at(4_900)],
            # No domain holds 12 GPUs: the gang fits only the mixed fallback, over n0 and n1 (the most
            # free GPUs). one takes n2's last GPU; two would land on n0 or n1 and waits.
            want_admit={"one": {"n2": [7]}},
            want_hold={"big": "no-fit", "two": "reserved-for-gang"},
            want_reserved_for="big",
        ),
        id="2c: a P2 gang that fits only the heterogeneous fallback gets a hold too",
    ),
    pytest.param(
        Case(
            nodes=[node("n0").domain("d0"), node("n1").domain("d1"), node("n2").domain("d2")],
            now=5_000,
            running=[
                running(job("x1"), on={"n1": [0]}, start=4_800),
                running(job("x2").gpus(2), on={"n2": [0, 1]}, start=4_800),
            ],
            pending=[
                job("g1").gpus(8).tier("online-training").at(0),
                job("g2").gpus(8).tier("online-training").at(100),
                job("late").gpus(7).at(4_900),
            ],
            # g1 fits now and is admitted on n0; the hold is then g2's (n1, the most free GPUs), and
            # late, with 7 GPUs only on n1, waits for it. (x1 and x2 are too young to preempt.)
            want_admit={"g1": {"n0": list(range(8))}},
            want_hold={"g2": "no-fit", "late": "reserved-for-gang"},
            want_reserved_for="g2",
        ),
        id="2: once a starving gang is admitted, the next blocked gang's hold binds the rest of the cycle",
    ),
    pytest.param(
        Case(
            nodes=[node("n0").domain("d0"), node("n1").domain("d1"), node("n2").domain("d2")],
            book=quotas({"a": 24, "b": 24}),
            now=5_000,
            running=[
                running(job("x1").tenant("a"), on={"n1": [0]}, start=4_800),
                running(job("x2").gpus(2).tenant("a"), on={"n2": [0, 1]}, start=4_800),
            ],
            pending=[
                job("g1").gpus(8).tier("online-training").tenant("a").at(0),
                job("g2").gpus(8).tier("online-training").tenant("a").at(100),
                job("b-late").gpus(7).tier("online-training").tenant("b").at(4_900),
            ],
            # b's share is lowest, so b-late comes first in the order, before g1 is admitted: the
            # units g1 fits on now and g2's are both held, so b-late waits all the same.
            want_admit={"g1": {"n0": list(range(8))}},
            want_hold={"g2": "no-fit", "b-late": "reserved-for-gang"},
            want_reserved_for="g2",
        ),
        id="2: the blocked gang's hold binds a request ordered before an older starving gang that fits now",
    ),
]

OWNER_FIRST = [
    pytest.param(
        Case(
            nodes=[node("n0").domain("d0"), node("n1").domain("d1")],
            book=quotas({"a": 8, "b": 8}),
            running=[running(job("a-run").gpus(8).tier("online-training").tenant("a"), on={"n0": list(range(8))})],
            pending=[job("a-gang").gpus(8).tier("online-training").tenant("a"), job("b-own").gpus(8).tenant("b")],
            # a-gang (P1, past a's cap) comes first in the order, but n1 is b's idle quota and b's own
            # in-quota P2 wants it this cycle: b gets it, a-gang waits.
            want_admit={"b-own": {"n1": list(range(8))}},
            want_hold={"a-gang": "no-fit"},
        ),
        id="3: a borrower never takes units its owner's pending in-quota request uses in the same cycle",
    ),
    pytest.param(
        Case(
            nodes=[node("n0").domain("d0"), node("n1").domain("d1")],
            book=quotas({"a": 8, "b": 16}),
            running=[running(job("a-run").gpus(8).tier("online-training").tenant("a"), on={"n0": list(range(8))})],
            pending=[job("a-gang").gpus(8).tier("online-training").tenant("a"), job("b-big").gpus(16).tenant("b")],
            # b's 16-GPU request cannot use the 8 idle GPUs this cycle: they are lent.
            want_admit={"a-gang": {"n1": list(range(8))}},
            want_borrowed={"a-gang"},
            want_hold={"b-big": "no-fit"},
        ),
        id="3: idle units the owner's pending request cannot use this cycle are lent",
    ),
]

DUPLICATES = [
    pytest.param(
        Case(
            nodes=[node("n0")],
            running=[running(job("r1").gpus(2), on={"n0": [0, 1]})],
            pending=[job("r1").gpus(2), job("r2")],
            want_admit={"r2": {"n0": [2]}},
            want_hold={"r1": "already-running"},
        ),
        id="4: a pending request whose id is already running is held, not admitted twice",
    ),
]


@pytest.mark.parametrize("case", STARVATION_HOLD + OWNER_FIRST + DUPLICATES)
def test_issue21_case(case: Case) -> None:
    assert outcome(case) == expected(case)
