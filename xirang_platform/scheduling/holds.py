"""Hold messages for people, built only when a request's hold changed (`cycle._hold`).

A hold is (reason, token, builder): the message is `builder(request, token)`, or the token itself
when there is no builder. The token carries what the message reads besides the request (a quota
check's message, the milli left under a cap), so a request whose reason and token are unchanged
keeps last cycle's hold without building its message again.
"""

from __future__ import annotations

from collections.abc import Callable

from xirang_platform.scheduling.model import HoldReason, Request
from xirang_platform.scheduling.placement import is_single_node

MessageBuilder = Callable[[Request, object], str]  # (request, token) -> the hold's message
# Holds a whole group of requests meets alike: their messages differ only by the request's own text.
GROUP_HOLDS = frozenset({HoldReason.NO_FIT, HoldReason.NEVER_FITS, HoldReason.OVER_QUOTA})


def shape_text(r: Request) -> str:
    """The request as people read it: id, tier, GPUs, CPU and memory."""
    gpu = f"{r.gpus} GPU" if r.whole_gpus else f"{r.milli_per_gpu} milli-GPU"
    return f"{r.id} ({r.tier.value}, {gpu}, {r.cpu_milli} milli-CPU, {r.memory_mib} MiB)"


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
