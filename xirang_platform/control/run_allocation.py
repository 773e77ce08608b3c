"""The allocation an admitted run carries (`xirang/allocation`, DESIGN.md section 7): the JSON the
launchers write on the run (`allocation_tag`) and its ops read back (`read_allocation_tag`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


def allocation_tag(allocation: Any, borrowed: bool, launcher: str) -> str:
    """The JSON written on an admitted run (`xirang/allocation`): its GPU slices, per-node shares,
    whether it is borrowed and which launcher runs it. `allocation` is a core `Allocation`."""
    placement = allocation.placement
    doc = {
        "request": allocation.id,
        "gpus": [
            {"node": s.node, "gpu": s.gpu, "milli": s.milli, "gpu_memory_mib": s.gpu_memory_mib}
            for s in placement.slices
        ],
        "nodes": [{"node": sh.node, "cpu_milli": sh.cpu_milli, "memory_mib": sh.memory_mib} for sh in placement.shares],
        "milli": placement.milli,
        "borrowed": borrowed,
        "launcher": launcher,
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class RunAllocation:
    """What an admitted run holds, as its ops read it (decoded from `xirang/allocation`)."""

    request: str
    gpus: tuple[tuple[str, int, int, int], ...]  # (node, GPU index, milli, GPU memory MiB) per GPU slice
    nodes: tuple[tuple[str, int, int], ...]  # (node, CPU milli, memory MiB) per node
    milli: int
    borrowed: bool
    launcher: str

    @property
    def node(self) -> str:
        """The (first) node the run sits on; "" for a run placed on no node."""
        return self.nodes[0][0] if self.nodes else (self.gpus[0][0] if self.gpus else "")

    @property
    def gpu_count(self) -> int:
        """How many GPUs the run touches (a fraction of one GPU counts 1)."""
        return len(self.gpus)

    def device_ids(self, node: str | None = None) -> list[int]:
        """The GPU indices held on `node` (default: the first node), sorted."""
        wanted = node or self.node
        return sorted({g for n, g, _, _ in self.gpus if n == wanted})

    @property
    def gpu_memory_mib(self) -> int:
        """GPU memory held over all slices, MiB."""
        return sum(m for _, _, _, m in self.gpus)


def read_allocation_tag(value: str | None) -> RunAllocation | None:
    """The allocation a run carries (`xirang/allocation`), or None when it has none yet."""
    if not value:
        return None
    doc = json.loads(value)
    if not isinstance(doc, dict) or not doc:
        return None
    return RunAllocation(
        request=str(doc.get("request", "")),
        gpus=tuple((g["node"], int(g["gpu"]), int(g["milli"]), int(g.get("gpu_memory_mib", 0))) for g in doc["gpus"]),
        nodes=tuple((n["node"], int(n["cpu_milli"]), int(n["memory_mib"])) for n in doc["nodes"]),
        milli=int(doc["milli"]),
        borrowed=bool(doc["borrowed"]),
        launcher=str(doc.get("launcher", "local")),
    )
