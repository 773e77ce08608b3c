"""Table-driven cycle cases: each row is a pool, what runs, what waits, and the whole expected outcome."""

from __future__ import annotations

import gc

import pytest

from tests.scheduling.cycle_builders import Case, expected, job, node, outcome, quotas, running
from xirang_platform.scheduling.scorers import make_scorer
from xirang_platform.scheduling.snapshot import SchedulerConfig

ONE_H100_NODE = [node("n0")]


def two_victims_beside_serving(young_start: float) -> list:
    """n0: two 4-GPU P2 jobs (one started at 0, one at `young_start`); n1: a full inference node."""
    return [
        running(job("v-old").gpus(4), on={"n0": [0, 1, 2, 3]}, start=0),
        running(job("v-young").gpus(4), on={"n0": [4, 5, 6, 7]}, start=young_start),
        running(job("serve-1").gpus(8).tier("inference"), on={"n1": list(range(8))}),
    ]


CASES = [
    pytest.param(
        Case(
            nodes=ONE_H100_NODE,
            pending=[
                job("batch").gpus(8).at(0),
                job("train").gpus(4).tier("online-training").at(5),
                job("serve").gpus(4).tier("inference").at(9),
            ],
            want_admit={"serve": {"n0": [0, 1, 2, 3]}, "train": {"n0": [4, 5, 6, 7]}},
            want_hold={"batch": "no-fit"},
        ),
        id="tier order: inference first, then online training; the older offline job waits",
    ),
    pytest.param(
        Case(
            nodes=ONE_H100_NODE,
            pending=[job("old").gpus(4).at(0), job("back").gpus(8).at(500).resumed()],
            want_admit={"back": {"n0": list(range(8))}},
            want_hold={"old": "no-fit"},
        ),
        id="resume first: a preempted request goes before an older fresh one",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            running=[running(job("a-run").gpus(6).tenant("a"), on={"n0": [0, 1, 2, 3, 4, 5]})],
            book=quotas({"a": 8, "b": 8}),
            pending=[job("a1").gpus(2).tenant("a").at(0), job("b1").gpus(2).tenant("b").at(10)],
            # b holds nothing (share 0) so it goes first and takes the best fit (n0's last two GPUs).
            want_admit={"b1": {"n0": [6, 7]}, "a1": {"n1": [0, 1]}},
        ),
        id="fair share: the tenant furthest below its quota goes first even if it submitted later",
    ),
    pytest.param(
        Case(
            nodes=[node("n0").domain("d0"), node("n1").domain("d0"), node("n2").domain("d1"), node("n3").domain("d1")],
            running=[
                running(job("s1").gpus(8).tier("inference"), on={"n1": list(range(8))}),
                running(job("s2").gpus(8).tier("inference"), on={"n3": list(range(8))}),
            ],
            pending=[
                job("p1-gang").gpus(16).tier("online-training").at(0),
                job("p2-gang").gpus(16).tier("offline-training").at(0),
            ],
            want_admit={"p2-gang": {"n0": list(range(8)), "n2": list(range(8))}},
            want_hold={"p1-gang": "no-fit"},
        ),
        id="heterogeneous fallback for P2 only: 8 free GPUs in each of two domains",
    ),
    pytest.param(
        Case(
            nodes=[node("n0").model("H100"), node("n1").model("A100")],
            pending=[
                job("mixed").gpus(12).tier("online-training"),
                job("a100s").gpus(8).tier("online-training").models("A100"),
            ],
            want_admit={"a100s": {"n1": list(range(8))}},
            want_hold={"mixed": "never-fits"},
        ),
        id="gang of one model: 12 GPUs never span an H100 and an A100 node",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1"), node("n2")],
            running=[
                running(job("s1").gpus(4).tier("inference"), on={"n1": [0, 1, 2, 3]}),
                running(job("s2").gpus(6).tier("inference"), on={"n2": [0, 1, 2, 3, 4, 5]}),
            ],
            pending=[job("six").gpus(6).tier("online-training"), job("ten").gpus(10).tier("online-training").at(1)],
            # six: one node (n0) beats n1+n2. ten: n1's 4 left... no: n0 is taken, so n1 (4) + n2 (2) is too little;
            # ten waits.
            want_admit={"six": {"n0": [0, 1, 2, 3, 4, 5]}},
            want_hold={"ten": "no-fit"},
        ),
        id="fewest nodes: a 6-GPU gang takes one free node, not two half-used ones",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1"), node("n2")],
            running=[
                running(job("s1").gpus(4).tier("inference"), on={"n1": [0, 1, 2, 3]}),
                running(job("s2").gpus(6).tier("inference"), on={"n2": [0, 1, 2, 3, 4, 5]}),
            ],
            pending=[job("ten").gpus(10).tier("online-training")],
            # 8 on the fullest-capacity node (n0), then the smallest node that covers the last 2 (n2, exactly 2 free).
            want_admit={"ten": {"n0": list(range(8)), "n2": [6, 7]}},
        ),
        id="fewest nodes, best fit for the last one: 10 GPUs = n0 plus n2's last two",
    ),
    pytest.param(
        Case(
            nodes=[node("n0").unit(125)],
            pending=[job("tune").milli(250).tier("online-training"), job("batch").milli(250).at(1)],
            want_admit={"tune": {"n0": [0]}, "batch": {"n0": [1]}},
        ),
        id="P1 takes whole GPUs: a quarter-GPU fine-tune holds all of GPU 0, a P2 quarter shares GPU 1",
    ),
    pytest.param(
        Case(
            nodes=[node("l0").model("L40S").unit(125), node("h0").unit(125), node("h1").unit(125)],
            running=[running(job("r1").milli(500).tier("inference"), on={"h1": [3]})],
            pending=[job("r2").milli(250).tier("inference").gpu_memory(60_000)],
            # L40S has 46 GB: memory-fit rules it out; of the H100s, the fullest GPU that fits is h1's GPU 3.
            want_admit={"r2": {"h1": [3]}},
        ),
        id="memory-fit packing: a replica needing 60 GB lands on the fullest H100 GPU, never on an L40S",
    ),
    pytest.param(
        Case(
            nodes=[node(f"n{i}").domain(f"d{i}") for i in range(4)],
            running=[
                *(running(job(f"s{i}").gpus(6).tier("inference"), on={f"n{i}": [0, 1, 2, 3, 4, 5]}) for i in range(4)),
                *(running(job(f"v{i}").gpus(2), on={f"n{i}": [6, 7]}) for i in range(4)),
            ],
            pending=[job("gang").gpus(8).tier("online-training")],
            want_hold={"gang": "no-fit"},
        ),
        id="Kueue #5243: eight preemptible GPUs scattered over four domains never admit an 8-GPU gang",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            running=two_victims_beside_serving(young_start=100),
            pending=[job("serve-2").gpus(4).tier("inference")],
            want_preempt={"v-young": ("serve-2", "priority")},
            want_admit={"serve-2": {"n0": [4, 5, 6, 7]}},
        ),
        id="preemption takes the fewest, youngest victims that free a valid placement",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            running=two_victims_beside_serving(young_start=900),
            pending=[job("serve-2").gpus(4).tier("inference")],
            config=SchedulerConfig(min_runtime_s=600, min_runtime_by_level=()),
            want_preempt={"v-old": ("serve-2", "priority")},
            want_admit={"serve-2": {"n0": [0, 1, 2, 3]}},
        ),
        id="minimum runtime: a victim younger than 600 s is spared, the older one goes",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            running=two_victims_beside_serving(young_start=900),
            pending=[job("serve-2").gpus(4).tier("inference")],
            want_preempt={"v-young": ("serve-2", "priority")},
            want_admit={"serve-2": {"n0": [4, 5, 6, 7]}},
        ),
        id="minimum runtime per tier: P0 is not held back by it and takes the victim that loses least",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            running=two_victims_beside_serving(young_start=900),
            pending=[job("train-2").gpus(4).tier("online-training")],
            want_preempt={"v-old": ("train-2", "priority")},
            want_admit={"train-2": {"n0": [0, 1, 2, 3]}},
        ),
        id="minimum runtime per tier: P1 still spares a victim younger than 600 s",
    ),
    pytest.param(
        Case(
            nodes=ONE_H100_NODE,
            book=quotas({"acme": 16}),
            running=[running(job("serve-1").gpus(8).tier("inference"), on={"n0": list(range(8))})],
            pending=[job("serve-2").gpus(2).tier("inference")],
            want_hold={"serve-2": "no-fit"},
        ),
        id="no preemption of P0, even by P0",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1"), node("n2")],
            book=quotas({"a": 12, "b": 4, "c": 8}),
            running=[
                running(job("a-train").gpus(8).tier("online-training").tenant("a"), on={"n0": list(range(8))}),
                running(job("b-own").gpus(4).tier("online-training").tenant("b"), on={"n1": [0, 1, 2, 3]}),
                running(
                    job("b-borrow").gpus(4).tier("online-training").tenant("b"), on={"n1": [4, 5, 6, 7]}, borrowed=True
                ),
                running(job("c-serve").gpus(8).tier("inference").tenant("c"), on={"n2": list(range(8))}),
            ],
            pending=[job("a-serve").gpus(4).tier("inference").tenant("a")],
            want_preempt={"b-borrow": ("a-serve", "reclaim")},
            want_admit={"a-serve": {"n1": [4, 5, 6, 7]}},
        ),
        id="P1 is preempted only for its borrowed part: b's in-quota training keeps running",
    ),
    pytest.param(
        Case(
            nodes=[node(f"n{i}") for i in range(5)],
            book=quotas({"a": 8, "c": 32}),
            running=[
                *(running(job(f"c{i}").gpus(7).tenant("c"), on={f"n{i}": list(range(7))}) for i in range(4)),
            ],
            pending=[job(f"r{k}").gpus(1).tier("inference").tenant("a").at(k) for k in range(10)],
            # 28 of 40 GPUs allocated (70%): ratio 1.2 falls by 0.025 per admitted GPU, so the cap
            # 8000 x ratio is 9600 - 200k after k admissions: the 9th (k = 8) would need 9000 > 8000.
            # Best fit fills the last free GPU of each busy node before opening n4.
            want_admit={f"r{k}": {f"n{k}": [7]} for k in range(4)} | {f"r{k}": {"n4": [k - 4]} for k in range(4, 8)},
            want_hold={"r8": "over-quota", "r9": "over-quota"},
        ),
        id="quota cap with the load-dependent ratio: 8 of 10 admitted as the cluster fills past 70%",
    ),
    pytest.param(
        Case(
            nodes=[node(f"n{i}") for i in range(4)],
            book=quotas({"a": 8, "c": 24}),
            pending=[job(f"r{k}").gpus(1).tier("inference").tenant("a").at(k) for k in range(10)],
            # At 9 of 32 GPUs the ratio is still 1.2: cap 9600, so 9 fit and the 10th would be 10000.
            want_admit={f"r{k}": {"n0": [k]} for k in range(8)} | {"r8": {"n1": [0]}},
            want_hold={"r9": "over-quota"},
        ),
        id="quota cap at low load: 1.2 x 8 GPUs admits 9 one-GPU replicas",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            book=quotas({"a": 4, "b": 12}),
            pending=[job("a1").gpus(8).tenant("a"), job("a-serve").gpus(8).tier("inference").tenant("a").at(1)],
            want_admit={"a1": {"n0": list(range(8))}},
            want_borrowed={"a1"},
            want_hold={"a-serve": "exceeds-cap"},
        ),
        id="borrow: P2 past its cap runs on idle units as borrowed; P0 may not borrow (8 GPUs > cap 4.8)",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            book=quotas({"a": 4, "b": 12}),
            running=[
                running(job("a-old").gpus(4).tenant("a"), on={"n0": [0, 1, 2, 3]}, start=0, borrowed=True),
                running(job("a-new").gpus(4).tenant("a"), on={"n0": [4, 5, 6, 7]}, start=50, borrowed=True),
            ],
            pending=[],
            want_return=["a-old"],
        ),
        id="automatic return: under its cap again, the oldest borrowed allocation turns in-quota",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            book=quotas({"a": 8, "b": 8}),
            running=[
                running(job("a-in").gpus(8).tenant("a"), on={"n0": list(range(8))}),
                running(job("a-lent").gpus(8).tenant("a"), on={"n1": list(range(8))}, borrowed=True),
            ],
            pending=[job("b1").gpus(4).tenant("b")],
            want_preempt={"a-lent": ("b1", "reclaim")},
            want_admit={"b1": {"n1": [0, 1, 2, 3]}},
        ),
        id="reclaim: a tenant under its cap takes back capacity another tenant borrowed",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            book=quotas({"a": 4, "b": 12}),
            running=[running(job("a-batch").gpus(4).tenant("a"), on={"n0": [0, 1, 2, 3]})],
            pending=[job("a-serve").gpus(2).tier("inference").tenant("a")],
            want_preempt={"a-batch": ("a-serve", "priority")},
            want_admit={"a-serve": {"n0": [0, 1]}},
        ),
        id="over its own cap, P0 preempts its own tenant's P2 work to get back under it",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            now=5_000,
            running=[running(job("small1"), on={"n0": [0]}), running(job("small2"), on={"n1": [0]})],
            pending=[job("big").gpus(16).at(0), job("late").gpus(1).at(100)],
            want_hold={"big": "no-fit", "late": "reserved-for-gang"},
            want_reserved_for="big",
        ),
        id="starvation guard: after the bound, the blocked gang's domain is held back from backfill",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            now=5_000,
            running=[running(job("small1"), on={"n0": [0]}), running(job("small2"), on={"n1": [0]})],
            pending=[job("big").gpus(16).at(4_000), job("late").gpus(1).at(4_100)],
            want_admit={"late": {"n0": [1]}},
            want_hold={"big": "no-fit"},
        ),
        id="before the bound, small jobs backfill around a blocked gang",
    ),
    pytest.param(
        Case(
            nodes=ONE_H100_NODE,
            pending=[job(f"j{k}").at(k) for k in range(8)],
            want_admit={f"j{k}": {"n0": [k]} for k in range(8)},
        ),
        id="one cycle admits as many as fit, not one per queue",
    ),
    pytest.param(
        Case(
            nodes=ONE_H100_NODE,
            pending=[job("ghost").tenant("nobody"), job("huge").gpus(9).one_node()],
            want_hold={"ghost": "unknown-account", "huge": "never-fits"},
        ),
        id="bad requests are held with a reason, not raised: unknown account, never fits",
    ),
    pytest.param(
        Case(
            nodes=ONE_H100_NODE,
            book=quotas({"a": 2}),
            pending=[
                job("ok1").tier("inference").tenant("a").at(0),
                job("big1").gpus(4).tier("inference").tenant("a").at(1),
                job("ghost1").tenant("nobody").at(2),
                job("ok2").tier("inference").tenant("a").at(3),
                job("big2").gpus(4).tier("inference").tenant("a").at(4),
                job("ghost2").tenant("nobody").at(5),
            ],
            want_admit={"ok1": {"n0": [0]}, "ok2": {"n0": [1]}},
            want_hold={
                "big1": "exceeds-cap",
                "big2": "exceeds-cap",
                "ghost1": "unknown-account",
                "ghost2": "unknown-account",
            },
        ),
        id="the account and cap check, known per group, answers every member as it answers the first",
    ),
    pytest.param(
        Case(
            nodes=[node("n0"), node("n1")],
            config=SchedulerConfig(min_runtime_s=600, preemption=False),
            book=quotas({"acme": 32}),
            running=[
                running(job("v").gpus(8), on={"n0": list(range(8))}),
                running(job("s").gpus(8).tier("inference"), on={"n1": list(range(8))}),
            ],
            pending=[job("serve").gpus(4).tier("inference")],
            want_hold={"serve": "no-fit"},
        ),
        id="preemption off (FGD's fill method): nothing is ever moved",
    ),
    pytest.param(
        Case(
            nodes=[node("n0").model("H100").gpus(1), node("n1").model("A100").gpus(1)],
            pending=[job("any").one_node().at(0), job("on-h100").one_node().models("H100").at(5)],
            # The default scorer learns the workload from the queue: half of it may run only on H100s,
            # so the unconstrained pod takes the A100 (BestFit would take n0 and leave on-h100 no room).
            want_admit={"any": {"n1": [0]}, "on-h100": {"n0": [0]}},
        ),
        id="gpu_spec: a constrained pod finds its model free, an unconstrained one was steered elsewhere",
    ),
    pytest.param(
        Case(
            nodes=[node("n0").model("H100").gpus(1), node("n1").model("A100").gpus(1)],
            config=SchedulerConfig(min_runtime_s=600, scorer=make_scorer("bestfit")),
            pending=[job("any").one_node().at(0), job("on-h100").one_node().models("H100").at(5)],
            want_admit={"any": {"n0": [0]}},
            want_hold={"on-h100": "no-fit"},
        ),
        id="gpu_spec with --placement bestfit: the unconstrained pod takes the first node, the constrained one waits",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_cycle(case: Case) -> None:
    assert outcome(case) == expected(case)


@pytest.mark.parametrize("collecting", [True, False])
def test_a_cycle_leaves_the_cycle_collector_as_the_caller_had_it(collecting: bool) -> None:
    """The admission loop pauses Python's cycle collector; the caller's setting comes back, whatever it was."""
    case = Case(nodes=ONE_H100_NODE, pending=[job("a").gpus(2), job("b").gpus(8)])
    was = gc.isenabled()
    (gc.enable if collecting else gc.disable)()
    try:
        assert outcome(case)["admit"] == {"a": {"n0": [0, 1]}}
        assert gc.isenabled() is collecting
    finally:
        (gc.enable if was else gc.disable)()
