"""Errors of the quota ledger: each message names the problem and the fix.

A `LedgerError` is raised before anything is written; the transaction that raised it is rolled
back, so a failed call leaves the ledger exactly as it was.
"""

from __future__ import annotations

from xirang_platform.pool.model import MILLI_PER_GPU


def gpus(milli: int | None) -> str:
    """`milli` as a GPU count for messages and tables: 8000 -> '8', 500 -> '0.5', None -> '-'."""
    if milli is None:
        return "-"
    whole, rest = divmod(abs(milli), MILLI_PER_GPU)
    sign = "-" if milli < 0 else ""
    if rest == 0:
        return f"{sign}{whole}"
    return f"{sign}{whole}.{rest:03d}".rstrip("0")


class LedgerError(Exception):
    """A request the ledger refuses; the message says why and how to fix it."""


class UnknownTenant(LedgerError):
    """The tenant does not exist."""

    def __init__(self, tenant: str) -> None:
        super().__init__(f"unknown tenant '{tenant}': add it with `xirang quota tenant add {tenant} --quota 8`")


class UnknownProject(LedgerError):
    """The project does not exist in the tenant."""

    def __init__(self, tenant: str, project: str) -> None:
        super().__init__(
            f"unknown project '{project}' in tenant '{tenant}': "
            f"add it with `xirang quota project add {tenant} {project} --quota 8`"
        )


class AlreadyExists(LedgerError):
    """A tenant or project of that name exists already."""


class ProjectInOtherTenant(LedgerError):
    """A project name is taken by another tenant (a project lives in exactly one tenant)."""

    def __init__(self, project: str, owner: str, wanted: str) -> None:
        super().__init__(
            f"project '{project}' already belongs to tenant '{owner}', so it cannot also be in '{wanted}': "
            f"a project lives in exactly one tenant; pick another name, e.g. `xirang quota project add "
            f"{wanted} {wanted}-{project}`"
        )


class InvalidAmount(LedgerError):
    """A quota or amount that is negative, not a number, or not a whole milli-GPU."""


class InvalidName(LedgerError):
    """A tenant or project name the ledger cannot key an account by."""


class QuotaExceedsTenant(LedgerError):
    """Project quotas inside a tenant would sum past the tenant quota x max ratio."""

    def __init__(
        self, tenant: str, total: int, tenant_quota: int, ratio: float, limit: int, excess: int, needed: int
    ) -> None:
        super().__init__(
            f"project quotas of tenant '{tenant}' would sum to {gpus(total)} GPUs, {gpus(excess)} GPUs more "
            f"than the tenant quota {gpus(tenant_quota)} x {ratio:g} = {gpus(limit)} GPUs allow: lower a "
            f"project quota by {gpus(excess)} GPUs or raise the tenant quota with "
            f"`xirang quota tenant set {tenant} --quota {gpus(needed)}`"
        )


class UnknownAllocation(LedgerError):
    """No active allocation of that request id."""

    def __init__(self, request_id: str, action: str) -> None:
        super().__init__(
            f"cannot {action} request '{request_id}': it was never reserved (or is already released); "
            f"reserve it first, and {action} each reservation once"
        )


class InvalidTransition(LedgerError):
    """An operation that the allocation's state forbids (a double commit, a duplicate reserve)."""


class PreemptForbidden(LedgerError):
    """A preemption of an allocation that may not be preempted (P0, or the in-quota part of P1)."""


class InvalidPlacement(LedgerError):
    """An allocation whose placement the ledger cannot store (no slice per GPU, a nameless node...)."""


class StaleCycle(LedgerError):
    """A cycle's decisions that no longer match the ledger (another writer changed it since the snapshot)."""


class LedgerBusy(LedgerError):
    """The ledger could not take the rows it needs in time (a lock held too long, a stalled session):
    nothing was written, and the same call may succeed when retried."""

    retryable = True


class RequestRefused(LedgerError):
    """One admission of a cycle the ledger refuses on its own account; nothing of the cycle is
    written. `request_id` names it, `reason` says why: the caller decides again without it."""

    def __init__(self, request_id: str, reason: str) -> None:
        self.request_id = request_id
        self.reason = reason
        super().__init__(f"the ledger refused request '{request_id}': {reason}")


class BadRequest(RequestRefused):
    """A request the ledger can never hold (a field out of range, a placement it cannot store, an
    unknown account): its run should fail with the reason."""


class OverCapacity(RequestRefused):
    """An admission whose placement would put a GPU or node past its capacity with the allocations
    the ledger holds: the cycle's snapshot was wrong about that room; the request waits."""
