"""The ledger's tenants and projects brought in line with the platform config's quota book.

`GpuPoolResource.ledger()` syncs once per process and config file (every code server's sensors at
start-up); the tests sync a fresh ledger the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from xirang_platform.ledger.errors import AlreadyExists
from xirang_platform.ledger.ledger import Ledger
from xirang_platform.scheduling.quota import QuotaBook


def sync_accounts(ledger: Ledger, book: QuotaBook) -> list[str]:
    """Create the tenants and projects of `book` the ledger lacks and set quotas that differ
    (tenants first when they grow, projects first when they shrink); returns what changed. Every
    code server's sensors sync at start-up: an account another one added since this one read the
    ledger is taken as found, not as an error."""
    known = {(v.key.tenant, v.key.project): v.quota for v in ledger.accounts()}

    def added(add: Callable[[], None]) -> bool:
        try:
            add()
        except AlreadyExists:
            known.update({(v.key.tenant, v.key.project): v.quota for v in ledger.accounts()})
            return False
        return True

    changed = []
    for tenant, quota in sorted(book.tenants.items()):
        if (tenant, None) not in known and added(partial(ledger.add_tenant, tenant, quota)):
            changed.append(f"tenant {tenant} added")
        elif known[(tenant, None)] != quota and quota > (known[(tenant, None)] or 0):
            ledger.set_tenant_quota(tenant, quota)
            changed.append(f"tenant {tenant} quota {quota}")
    for (tenant, project), project_quota in sorted(book.projects.items()):
        if (tenant, project) not in known and added(partial(ledger.add_project, tenant, project, project_quota)):
            changed.append(f"project {tenant}/{project} added")
        elif (tenant, project) in known and known[(tenant, project)] != project_quota:
            ledger.set_project_quota(tenant, project, project_quota)
            changed.append(f"project {tenant}/{project} quota {project_quota}")
    for tenant, quota in sorted(book.tenants.items()):
        if (tenant, None) in known and known[(tenant, None)] != quota and quota < (known[(tenant, None)] or 0):
            ledger.set_tenant_quota(tenant, quota)
            changed.append(f"tenant {tenant} quota {quota}")
    return changed
