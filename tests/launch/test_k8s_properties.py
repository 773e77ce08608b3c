"""Property: whatever the real cycle admits on the scenario pool renders as valid objects whose GPU asks
and pinned nodes match the allocation, or is refused with the one documented launch error (a fraction
the scheduler put on a MIG node that no offered MIG profile fits: the scheduler does not know MIG
profiles, so it may reserve e.g. 500 milli on a node offering only 1g.10gb slices)."""

from __future__ import annotations

from collections import Counter

import kubernetes_validate
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.launch.k8s_checks import pod_facts
from xirang_platform.launch.k8s import is_gang
from xirang_platform.launch.k8s_gang import gang_objects
from xirang_platform.launch.k8s_gpu import LaunchError, matching_mig_profile, mig_layout
from xirang_platform.launch.k8s_pod import manifest
from xirang_platform.launch.k8s_run_worker import run_worker_job
from xirang_platform.launch.k8s_scenario import SCENARIO_POOL
from xirang_platform.launch.k8s_settings import K8sSettings
from xirang_platform.pool.readers import read_pool
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.model import Request, Tier
from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.scheduling.snapshot import Snapshot

POOL = read_pool(SCENARIO_POOL)
BOOK = QuotaBook({"a": 100_000, "b": 100_000}, {("a", "p"): None, ("b", "p"): None})
SETTINGS = K8sSettings()


@st.composite
def requests(draw, index: int) -> Request:
    tier = draw(st.sampled_from(list(Tier)))
    models = draw(st.sampled_from([frozenset(), frozenset({"H100-SXM"}), frozenset({"A100-80"}), frozenset({"L40S"})]))
    if draw(st.booleans()):
        shape = {"gpus": 1, "milli_per_gpu": draw(st.sampled_from([125, 142, 250, 500]))}
    else:
        shape = {"gpus": draw(st.integers(0, 16))}
    return Request(f"r{index}", draw(st.sampled_from("ab")), "p", tier, float(index), gpu_models=models, **shape)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.integers(0, 10**6), min_size=1, max_size=8).flatmap(
        lambda keys: st.tuples(*[requests(i) for i in range(len(keys))])
    )
)
def test_every_admission_renders_valid_objects_that_match_its_placement(pending):
    result = cycle(Snapshot.build(POOL, [], BOOK), list(pending), 0.0)
    for admit in result.admits:
        allocation = admit.allocation
        per_node = Counter(s.node for s in allocation.placement.slices)
        request = allocation.request
        if is_gang(allocation):
            event("gang")
            gang = gang_objects(allocation, POOL, SETTINGS)
            docs = [manifest(o) for o in gang.objects()]
            facts = pod_facts(docs[-1]["spec"]["template"]["spec"])
            per_pod = int(facts["gpu"]["nvidia.com/gpu"])
            assert Counter(gang.pod_nodes) == Counter({n: c // per_pod for n, c in per_node.items()})
            assert sorted(facts["nodes"]) == sorted(per_node)
        else:
            layout = mig_layout(POOL.node(allocation.placement.nodes[0]))
            if layout is not None and not request.whole_gpus:
                (piece,) = allocation.placement.slices
                if matching_mig_profile(layout, request, piece.milli) is None:
                    event("refused: no MIG profile fits")
                    with pytest.raises(LaunchError, match="matches no MIG profile it offers"):
                        run_worker_job(allocation, POOL, SETTINGS, run_id=allocation.id)
                    continue
                event("MIG slice")
            docs = [manifest(run_worker_job(allocation, POOL, SETTINGS, run_id=allocation.id))]
            facts = pod_facts(docs[0]["spec"]["template"]["spec"])
            assert facts["nodes"] == list(allocation.placement.nodes)
            if request.gpus == 0:
                assert facts["gpu"] == {}
            elif request.whole_gpus:
                assert facts["gpu"] == {"nvidia.com/gpu": str(request.gpus)}
            else:
                assert list(facts["gpu"].values()) == ["1"]
        assert facts["priority"] == SETTINGS.priority_class(request.tier)
        for doc in docs:
            kubernetes_validate.validate(doc, "1.37.0", strict=True)
