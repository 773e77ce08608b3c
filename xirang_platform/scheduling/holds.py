"""Holds: the message of each hold for people, built only when a request's hold changed
(`cycle._hold`), and the units a starving gang has held back for it (`reservation_scope`).

A hold is (reason, token, builder): the message is `builder(request, token)`, or the token itself
when there is no builder. The token carries what the message reads besides the request (a quota
check's message, the milli left under a cap), so a request whose reason and token are unchanged
keeps last cycle's hold without building its message again.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from xirang_platform.scheduling.feasibility import eligible_nodes
from xirang_platform.scheduling.model import HoldReason, Request
from xirang_platform.scheduling.placement import is_single_node, place, usable_whole_gpus
from xirang_platform.scheduling.scorers import NodeScorer
from xirang_platform.scheduling.state import ClusterState

MessageBuilder = Callable[[Request, object], str]  # (request, token) -> the hold's message
# Holds a whole group of requests meets alike: their messages differ only by the request's own text.
GROUP_HOLDS = frozenset({HoldReason.NO_FIT, HoldReason.NEVER_FITS, HoldReason.OVER_QUOTA})


def shape_text(r: Request) -> str:
    """The request as people read it: id, tier, GPUs, CPU and memory."""
    gpu = f"{r.gpus} GPU" if r.whole_gpus else f"{r.milli_per_gpu} milli-GPU"
    return f"{r.id} ({r.tier}, {gpu}, {r.cpu_milli} milli-CPU, {r.memory_mib} MiB)"  # a StrEnum reads as its value


def no_fit_message(r: Request, _: object) -> str:
    """No-fit: the request alone decides the message."""
    return f"no free units fit {shape_text(r)} now; it waits for capacity"


def rounded_past_cap_message(r: Request, headroom: object) -> str:
    """Over its cap once a free unit rounds it up (`headroom`: the milli left under the cap)."""
    return (
        f"{shape_text(r)}: the free units round it up past its cap ({headroom} milli left under it); "
        "it waits for finer units or room"
    )


def never_fits_message(r: Request, _: object = None) -> str:
    """Never fits this pool, with what the request could relax."""
    if is_single_node(r):
        rule = "one node"
    elif r.tier.rules.mixed_fallback:
        rule = "the whole pool"
    else:
        rule = "one interconnect domain of one GPU model"
    constraints = []
    if r.gpu_models:
        constraints.append(f"models {sorted(r.gpu_models)}")
    if r.min_compute_level:
        constraints.append(f"compute level >= {r.min_compute_level}")
    if r.gpu_memory_mib:
        constraints.append(f">= {r.gpu_memory_mib} MiB GPU memory")
    extra = f" with {', '.join(constraints)}" if constraints else ""
    return (
        f"{shape_text(r)} cannot fit on {rule}{extra} of this pool even when it is empty; "
        "ask for fewer GPUs, CPU or memory, or relax the GPU model / compute level / memory tags"
    )


def reservation_scope(
    state: ClusterState, request: Request, scorer: NodeScorer, priority: np.ndarray
) -> np.ndarray | None:
    """Nodes to hold back for a starving gang: where it fits now if it does; else the node
    (single-node gang) or (domain, model) group that already has the most usable whole GPUs and
    could hold the gang when empty."""
    now = place(state, request, scorer, priority)
    if now is not None:
        return np.isin(np.array(state.names), now.nodes)
    eligible = eligible_nodes(state, request)
    usable = usable_whole_gpus(state, request, eligible)
    if is_single_node(request):
        big_enough = np.flatnonzero(eligible & (state.gpu_count >= request.gpus))
        if len(big_enough) == 0:
            return None
        best = big_enough[np.lexsort((priority[big_enough], -usable[big_enough]))[0]]
        mask = np.zeros(len(state.names), dtype=bool)
        mask[best] = True
        return mask
    best_key, best_mask = None, None
    for domain, model in sorted(
        {(int(d), int(m)) for d, m in zip(state.domain_id[eligible], state.model_id[eligible], strict=True)}
    ):
        mask = eligible & (state.domain_id == domain) & (state.model_id == model)
        if state.gpu_count[mask].sum() < request.gpus:
            continue
        key = (-int(usable[mask].sum()), domain, model)
        if best_key is None or key < best_key:
            best_key, best_mask = key, mask
    return best_mask
