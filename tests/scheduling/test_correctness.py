"""Issue 7's cases: each row is one way the core broke its contract (DESIGN.md sections 4-6), as a table.

Every row failed before its fix; the id says the rule it pins.
"""

from __future__ import annotations

import pytest

from tests.scheduling.cycle_builders import Case, expected, job, node, outcome, quotas, running, snapshot_of
from xirang_platform.scheduling.config import SchedulerConfig
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.scorers import make_scorer

HOUR = 3600.0


def serving(name: str, node_name: str, gpus: list[int], tenant: str = "ops"):
    """A P0 allocation that nothing may preempt, to fill part of a node."""
    return running(job(name).gpus(len(gpus)).tier("inference").tenant(tenant), on={node_name: gpus})


GPU_MEMORY = [
    pytest.param(
        Case(
            nodes=[node("n0").gpus(2).unit(125)],
            pending=[job(f"r{k}").milli(250).tier("inference").gpu_memory(60_000).at(k) for k in range(4)],
            want_admit={"r0": {"n0": [0]}, "r1": {"n0": [1]}},
            want_hold={"r2": "no-fit", "r3": "no-fit"},
        ),
        id="1: four quarter-GPU P0 replicas of 60 GB on two 80 GB GPUs: one per GPU, two wait",
    ),
    pytest.param(
        Case(
            nodes=[node("n0").gpus(2).unit(125)],
            running=[running(job("big").milli(250).tier("inference").gpu_memory(60_000), on={"n0": [1]})],
            pending=[job("r0").milli(250).tier("inference").gpu_memory(30_000)],
            # GPU 1 is the fullest by milli but has only 21 GB of memory left: GPU 0 it is.
            want_admit={"r0": {"n0": [0]}},
        ),
        id="1: best fit by milli never picks a GPU whose memory is taken",
    ),
]

CAPS = [
    pytest.param(
        Case(
            nodes=[node("frac").model("A100").gpus(2).unit(250), node("whole").model("L40S").gpus(1)],
            book=quotas({"b": 1, "x": 8}),
            running=[
                running(job("b-batch").milli(500).tenant("b"), on={"frac": [0]}),
                running(job("b-serve").milli(500).tier("inference").tenant("b"), on={"frac": [1]}),
            ],
            pending=[job("b-new").milli(125).tier("inference").tenant("b")],
            # 1,000 + 250 > 1,200: b's own P2 gives way, and the P0 takes 250 on frac (750 <= 1,200),
            # never a whole L40S GPU (1,500).
            want_preempt={"b-batch": ("b-new", "priority")},
            want_admit={"b-new": {"frac": [1]}},
            want_milli={"b-new": 250},
        ),
        id="2: after a preemption the P0 is admitted on a placement that fits its cap",
    ),
    pytest.param(
        Case(
            nodes=[node("h").gpus(2), node("l").model("L40S").gpus(2).unit(125)],
            book=quotas({"t": 1, "ops": 8}),
            running=[
                serving("s", "h", [0]),
                running(job("t-serve").milli(500).tier("inference").tenant("t"), on={"l": [0]}),
            ],
            pending=[job("t-new").milli(250).tier("inference").tenant("t")],
            # 500 + 1,000 on the H100 would pass the cap of 1,200 by 300; 500 + 250 on the L40S fits.
            want_admit={"t-new": {"l": [0]}},
            want_milli={"t-new": 250},
        ),
        id="6: the cap is checked on each candidate node's unit rounding, not on the first node",
    ),
    pytest.param(
        Case(
            nodes=[node("h").gpus(2), node("l").model("L40S").gpus(2).unit(125)],
            book=quotas({"t": 8, "ops": 8}),
            running=[serving("s", "h", [0])],
            pending=[job("t-new").milli(250).tier("inference").tenant("t")],
            want_admit={"t-new": {"l": [0]}},
            want_milli={"t-new": 250},
        ),
        id="6: rounding waste counts: a quarter-GPU replica takes eighth-GPU units, not a whole H100",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1"), node("n2")],
            book=quotas({"a": 8, "b": 16}),
            now=5_000,
            running=[running(job("a-batch").gpus(8).tenant("a"), on={"n0": list(range(8))}, borrowed=True)],
            pending=[job("a-serve").gpus(4).tier("inference").tenant("a")],
            # Returning the borrowed P2 first would put a at 12,000 > 9,600 and make the P0 preempt it.
            want_admit={"a-serve": {"n1": [0, 1, 2, 3]}},
        ),
        id="7: automatic return never creates the overage a preemption then repairs",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1"), node("n2")],
            book=quotas({"a": 20, "b": 4}),
            now=5_000,
            running=[
                running(job(f"a{k:02d}").tenant("a"), on={f"n{k // 8}": [k % 8]}, start=10.0 * k) for k in range(21)
            ],
            pending=[job("a-serve").tier("inference").tenant("a")],
            # At 21 of 24 GPUs the ratio is 1.025 (cap 20,500); once one victim leaves it is 1.067
            # (cap 21,333) and 20,000 + 1,000 fits: one victim, the one that lost the least work.
            want_preempt={"a20": ("a-serve", "priority")},
            want_admit={"a-serve": {"n2": [4]}},
        ),
        id="9: quota relief takes the cap ratio with the victims gone: one victim, not two",
    ),
    pytest.param(
        Case(
            nodes=[node("n0")],
            book=quotas({"t": 1, "ops": 8}),
            pending=[job("huge").gpus(2).tier("inference").tenant("t")],
            want_hold={"huge": "exceeds-cap"},
        ),
        id="11: a P0 larger than its tenant's whole cap is told it can never fit that cap",
    ),
]

VICTIMS = [
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            now=40_000,
            running=[
                running(job("a-old").gpus(4), on={"n0": [0, 1, 2, 3]}, start=40_000 - 10 * HOUR),
                serving("s0", "n0", [4, 5, 6, 7]),
                running(job("b-young").gpus(4), on={"n1": [0, 1, 2, 3]}, start=40_000 - 660),
                serving("s1", "n1", [4, 5, 6, 7]),
            ],
            pending=[job("serve").gpus(4).tier("inference")],
            want_preempt={"b-young": ("serve", "priority")},
            want_admit={"serve": {"n1": [0, 1, 2, 3]}},
        ),
        id="5: between two equal victims on two nodes, the 11-minute-old one goes, not the 10-hour one",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            book=quotas({"a": 8, "c": 4, "d": 1, "ops": 16}),
            running=[
                running(job("c-in").gpus(4).tenant("c"), on={"n0": [0, 1, 2, 3]}),
                serving("s0", "n0", [4, 5, 6, 7]),
                running(job("d-lent").gpus(4).tenant("d"), on={"n1": [0, 1, 2, 3]}, borrowed=True),
                serving("s1", "n1", [4, 5, 6, 7]),
            ],
            pending=[job("a-serve").gpus(4).tier("inference").tenant("a")],
            want_preempt={"d-lent": ("a-serve", "reclaim")},
            want_admit={"a-serve": {"n1": [0, 1, 2, 3]}},
        ),
        id="5: a borrowed victim goes before another tenant's in-quota one of the same size",
    ),
    pytest.param(
        Case(
            nodes=[node("n0").domain("d0"), node("n1").domain("d1")],
            book=quotas({"a": 8, "c": 8, "x": 1}),
            running=[
                running(job("c-in").gpus(8).tenant("c"), on={"n0": list(range(8))}),
                running(job("x1").gpus(4).tenant("x"), on={"n1": [0, 1, 2, 3]}, borrowed=True),
                running(job("x2").gpus(4).tenant("x"), on={"n1": [4, 5, 6, 7]}, borrowed=True),
            ],
            pending=[job("gang").gpus(8).tier("online-training").tenant("a")],
            want_preempt={"x1": ("gang", "reclaim"), "x2": ("gang", "reclaim")},
            want_admit={"gang": {"n1": list(range(8))}},
        ),
        id="5: a P1 gang takes two borrowed jobs in one domain before one in-quota job in the other",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1"), node("n2")],
            now=40_000,
            running=[
                running(
                    job("gang16").gpus(16), on={"n0": list(range(8)), "n1": list(range(8))}, start=40_000 - 10 * HOUR
                ),
                serving("s2", "n2", [0, 1, 2, 3, 4, 5]),
                running(job("small1"), on={"n2": [6]}, start=39_000),
                running(job("small2"), on={"n2": [7]}, start=39_000),
            ],
            pending=[job("serve").gpus(2).tier("inference")],
            want_preempt={"small1": ("serve", "priority"), "small2": ("serve", "priority")},
            want_admit={"serve": {"n2": [6, 7]}},
        ),
        id="5: least work lost beats fewest victims: two 1-GPU jobs of 1,000 s, not a 10-hour 16-GPU gang",
    ),
]

STARVATION = [
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            book=quotas({"a": 16, "b": 16}),
            now=5_000,
            running=[running(job("a1").tenant("a"), on={"n0": [0]}), running(job("a2").tenant("a"), on={"n1": [0]})],
            pending=[job("big").gpus(16).tenant("a").at(0), job("b1").tenant("b").at(4_900)],
            # b's share is lower, so b1 comes first in the order; the hold binds it all the same.
            want_hold={"big": "no-fit", "b1": "reserved-for-gang"},
            want_reserved_for="big",
        ),
        id="3: the gang reservation binds a lower-share tenant's job that comes before the gang in the order",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            book=quotas({"a": 16, "b": 16}),
            now=5_000,
            running=[running(job("a1").tenant("a"), on={"n0": [0]}), running(job("a2").tenant("a"), on={"n1": [0]})],
            pending=[
                job("big").gpus(16).tenant("a").at(0),
                job("b-serve").tier("inference").tenant("b").at(4_900),
                job("b-train").tier("online-training").tenant("b").at(4_900),
            ],
            # Work of a tier above the gang's is never held for it. (Where b-train lands is the default
            # scorer's choice: n1 leaves 6 free GPUs on each node, room for three 2-GPU pods on both.)
            want_admit={"b-serve": {"n0": [1]}, "b-train": {"n1": [1]}},
            want_hold={"big": "no-fit"},
            want_reserved_for="big",
        ),
        id="3: the hold never binds work of a tier above the gang's",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            book=quotas({"a": 16, "b": 16}),
            now=5_000,
            running=[running(job("a-run").tenant("a").gpus(2), on={"n1": [6, 7]})],
            pending=[job("big").gpus(12).tenant("a").at(0), job("b1").tenant("b").at(4_900)],
            # The gang fits now: the hold covers where it lands, b1 (first in the order) waits for it,
            # and once the gang is admitted the hold lifts and b1 takes what is left.
            want_admit={"big": {"n0": list(range(8)), "n1": [0, 1, 2, 3]}, "b1": {"n1": [4]}},
        ),
        id="3: once the gang is admitted the hold lifts and the requests it held are placed",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            book=quotas({"a": 8, "b": 16}),
            now=5_000,
            running=[
                running(job("b-run").gpus(4).tenant("b"), on={"n0": [0, 1, 2, 3]}),
                running(job("a1").tenant("a"), on={"n1": [0]}),
            ],
            pending=[job("big").gpus(16).tenant("a").at(0), job("b-more").gpus(4).tenant("b").at(4_900)],
            # a's quota is 8: the gang could only run borrowed, so nothing is held back for it.
            want_admit={"b-more": {"n0": [4, 5, 6, 7]}},
            want_hold={"big": "no-fit"},
        ),
        id="4: no units are held back for a gang that could only run borrowed",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            book=quotas({"a": 8, "b": 16}),
            now=5_000,
            pending=[job("back").gpus(12).tenant("a").at(0).reclaimed(at=4_500)],
            # Reclaimed 500 s ago: it may not borrow the lender's idle units again yet.
            want_hold={"back": "over-quota"},
        ),
        id="4: a job reclaimed from borrowing does not borrow again within the back-off",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            book=quotas({"a": 8, "b": 16}),
            now=7_000,
            pending=[job("back").gpus(12).tenant("a").at(0).reclaimed(at=4_500)],
            want_admit={"back": {"n0": list(range(8)), "n1": [0, 1, 2, 3]}},
            want_borrowed={"back"},
        ),
        id="4: after the back-off the reclaimed job borrows idle units again",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            book=quotas({"a": 8, "b": 16}),
            now=7_000,
            pending=[job("back").gpus(12).tenant("a").at(0).reclaimed(at=1_000).reclaimed(at=4_000)],
            # Reclaimed twice: the back-off doubles to 3,600 s, and 3,000 s have passed.
            want_hold={"back": "over-quota"},
        ),
        id="4: the back-off doubles with every reclaim",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            book=quotas({"a": 8, "b": 16}),
            now=5_000,
            pending=[job("back").gpus(12).tenant("a").at(0).reclaimed(at=4_500)],
            lasting_idle={"a": 0, "b": 16},
            # Within its back-off, but b's quota has been idle for lend_after_s: lent at once.
            want_admit={"back": {"n0": list(range(8)), "n1": [0, 1, 2, 3]}},
            want_borrowed={"back"},
        ),
        id="4: within the back-off a reclaimed job borrows idle quota whose idleness has lasted",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            book=quotas({"a": 8, "b": 16}),
            now=5_000,
            running=[running(job("c-borrow").gpus(4).tenant("a"), on={"n1": [4, 5, 6, 7]}, borrowed=True)],
            pending=[job("back").gpus(12).tenant("a").at(0).reclaimed(at=4_500)],
            lasting_idle={"a": 8, "b": 16},
            # Lasting: b's 16 GPUs (a's own idle quota is not lent to a), 4 of them already lent: 12 fit.
            want_admit={"back": {"n0": list(range(8)), "n1": [0, 1, 2, 3]}},
            want_borrowed={"back"},
            want_return=["c-borrow"],  # a is under its cap: its earlier borrow turns in-quota
        ),
        id="4: a tenant's own lasting idle quota does not count, work already lent does",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            book=quotas({"a": 8, "b": 16}),
            now=5_000,
            running=[running(job("c-borrow").gpus(4).tenant("a"), on={"n1": [4, 5, 6, 7]}, borrowed=True)],
            pending=[job("back").gpus(12).tenant("a").at(0).reclaimed(at=4_500)],
            lasting_idle={"a": 8, "b": 12},
            # b's lasting 12 GPUs less the 4 lent: 8 < 12, and the back-off runs to 6,300.
            want_hold={"back": "over-quota"},
            want_return=["c-borrow"],
        ),
        id="4: within the back-off nothing past what has lasted is lent",
    ),
]


@pytest.mark.parametrize("case", GPU_MEMORY + CAPS + VICTIMS + STARVATION)
def test_issue7_case(case: Case) -> None:
    assert outcome(case) == expected(case)


@pytest.mark.parametrize(
    ("lasting", "tail"),
    [
        pytest.param(None, "may borrow again from t=6300", id="no idle history: the back-off alone"),
        pytest.param(
            {"a": 0, "b": 8},
            "may borrow again from t=6300, or sooner out of quota idle for 1800 s (8000 milli now)",
            id="with idle history: what has lasted",
        ),
    ],
)
def test_a_reclaimed_job_held_from_borrowing_is_told_when_it_may(lasting, tail) -> None:
    case = Case(
        nodes=[node("n0"), node("n1")],
        book=quotas({"a": 8, "b": 16}),
        now=5_000,
        pending=[job("back").gpus(12).tenant("a").at(0).reclaimed(at=4_500)],
        lasting_idle=lasting,
    )
    [hold] = cycle(snapshot_of(case), [b.build() for b in case.pending], case.now, case.config).holds
    assert hold.message.endswith(f"its borrowed run was reclaimed at t=4500, so it {tail}")


def test_10_cycle_is_pure_with_the_random_scorer() -> None:
    case = Case(
        nodes=[node(f"n{i}").unit(125) for i in range(6)],
        pending=[job(f"r{k}").milli(250).tier("inference").at(k) for k in range(4)] + [job("huge").gpus(9).one_node()],
        config=SchedulerConfig(scorer=make_scorer("random", seed=7)),
    )
    snap, pending = snapshot_of(case), [b.build() for b in case.pending]
    first = cycle(snap, pending, case.now, case.config)
    assert cycle(snap, pending, case.now, case.config) == first
