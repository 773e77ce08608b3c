"""The quota ledger (DESIGN.md section 6): tenants, projects, accounts and append-only entries.

Every operation is one transaction that writes its entries and the balances they change together;
a refused operation raises a `LedgerError` before writing, and its transaction is rolled back, so
the ledger is unchanged. Concurrency: see `writer.py` (PostgreSQL row locks in key order) and
`db.py` (SQLite `BEGIN IMMEDIATE`); a cycle's decisions are written by `cycle_writes.py`, and one
given the pool is also checked against its capacity under the pool's capacity lock (`capacity.py`);
the tick's lease is `lease.py`.

Amounts are milli-GPU (1000 = one GPU). The quota rules are the core's (`scheduling.quota`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace

from sqlalchemy import Engine, and_, insert, or_, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from xirang_platform.base.user_input import InputError, check_name, check_quota_milli
from xirang_platform.ledger import admission
from xirang_platform.ledger.admission import Reservation, book_of
from xirang_platform.ledger.balances import AccountView
from xirang_platform.ledger.capacity import CapacityCheck, live_usage, lock_capacity, over_capacity
from xirang_platform.ledger.cycle_writes import no_room, write_cycle
from xirang_platform.ledger.db import ledger_url, make_engine, upgrade
from xirang_platform.ledger.errors import (
    AlreadyExists,
    InvalidAmount,
    InvalidName,
    LedgerError,
    ProjectInOtherTenant,
    QuotaExceedsTenant,
    UnknownProject,
    UnknownTenant,
    gpus,
)
from xirang_platform.ledger.idle import idle_history_from, lasting_free, read_holdings, read_in_quota_changes
from xirang_platform.ledger.lease import tick_lease
from xirang_platform.ledger.placements import read_placements, to_allocation
from xirang_platform.ledger.rebuild import EntryView, RebuildReport, compare
from xirang_platform.ledger.tables import ACCOUNTS, ALLOCATIONS, ENTRIES, PROJECTS, TENANTS, AllocState, EntryKind
from xirang_platform.ledger.writer import Writer
from xirang_platform.pool.model import Pool
from xirang_platform.scheduling.model import Allocation, PreemptReason
from xirang_platform.scheduling.quota import (
    AccountKey,
    Balance,
    IdleHistory,
    OvercommitPolicy,
    QuotaBook,
    cap,
    project_quota_excess,
)
from xirang_platform.scheduling.result import CycleResult

_logger = logging.getLogger("xirang.ledger")


class Ledger:
    """The quota ledger on one database (SQLite file by default, PostgreSQL in production)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        policy: OvercommitPolicy | None = None,
        clock: Callable[[], float] = time.time,
        migrate: bool = True,
    ) -> None:
        self.url = ledger_url(url)
        self.engine: Engine = make_engine(self.url)
        self.policy = policy or OvercommitPolicy()
        self.clock = clock
        # True when this ledger found an empty database and created the schema in it.
        self.created = migrate and upgrade(self.engine) is None

    def close(self) -> None:
        """Close the database connections."""
        self.engine.dispose()

    def tick_lease(self) -> AbstractContextManager[str]:
        """The scheduling tick's lease (`lease.py`): '' while this tick holds it, else why not."""
        return tick_lease(self.engine)

    @contextmanager
    def _write(self) -> Iterator[Writer]:
        with self.engine.begin() as conn:
            w = Writer(conn, self.clock())
            yield w
            w.flush()

    # -- tenants and projects -------------------------------------------------------------------

    def add_tenant(self, name: str, quota: int) -> None:
        """Create tenant `name` with `quota` milli-GPU."""
        _check_name(name, "tenant")
        _check_quota(quota, f"tenant '{name}'")
        try:
            with self._write() as w:
                w.conn.execute(insert(TENANTS).values(name=name, created_at=w.now))
                key = AccountKey(name)
                w.add_account(key)
                w.set_quota(key, quota, cause="tenant-add")
        except IntegrityError as e:
            raise AlreadyExists(
                f"tenant '{name}' already exists: change its quota with `xirang quota tenant set {name} "
                f"--quota {gpus(quota)}`"
            ) from e

    def set_tenant_quota(self, name: str, quota: int) -> None:
        """Set tenant `name`'s quota, refusing one below what its project quotas need."""
        _check_quota(quota, f"tenant '{name}'")
        with self._write() as w:
            rows = w.lock_tenant(name)
            if AccountKey(name) not in rows:
                raise UnknownTenant(name)
            self._check_projects_fit(rows, name, {AccountKey(name): quota})
            w.set_quota(AccountKey(name), quota, cause="tenant-set")

    def add_project(self, tenant: str, name: str, quota: int | None = None) -> None:
        """Create project `name` in `tenant`; `quota` None means no limit of its own."""
        _check_name(name, "project")
        if quota is not None:
            _check_quota(quota, f"project '{tenant}/{name}'")
        try:
            with self._write() as w:
                rows = w.lock_tenant(tenant)
                if AccountKey(tenant) not in rows:
                    raise UnknownTenant(tenant)
                owner = w.conn.execute(select(PROJECTS.c.tenant).where(PROJECTS.c.name == name)).scalar()
                if owner is not None:
                    raise _project_taken(name, owner, tenant)
                key = AccountKey(tenant, name)
                self._check_projects_fit(rows, tenant, {key: quota})
                w.conn.execute(insert(PROJECTS).values(name=name, tenant=tenant, created_at=w.now))
                w.add_account(key)
                w.set_quota(key, quota, cause="project-add")
        except IntegrityError as e:
            # Another writer took the name between our check and our insert.
            owner = self._project_owner(name) or "another tenant"
            raise _project_taken(name, owner, tenant) from e

    def set_project_quota(self, tenant: str, name: str, quota: int | None) -> None:
        """Set project `tenant/name`'s quota (None: no limit of its own)."""
        if quota is not None:
            _check_quota(quota, f"project '{tenant}/{name}'")
        with self._write() as w:
            rows = w.lock_tenant(tenant)
            if AccountKey(tenant) not in rows:
                raise UnknownTenant(tenant)
            key = AccountKey(tenant, name)
            if key not in rows:
                raise UnknownProject(tenant, name)
            self._check_projects_fit(rows, tenant, {key: quota})
            w.set_quota(key, quota, cause="project-set")

    def _check_projects_fit(
        self, rows: dict[AccountKey, AccountView], tenant: str, new: dict[AccountKey, int | None]
    ) -> None:
        quotas = {k: h.quota for k, h in rows.items()} | new
        book = book_of({k: AccountView.of(k, q) for k, q in quotas.items()}, tenant)
        excess = project_quota_excess(book, tenant, self.policy)
        if excess > 0:
            total = sum(q or 0 for q in book.projects.values())
            tenant_quota = book.tenants[tenant]
            ratio = self.policy.max_ratio
            needed = int(total / ratio)
            while cap(needed, ratio) < total:
                needed += 1
            raise QuotaExceedsTenant(tenant, total, tenant_quota, ratio, cap(tenant_quota, ratio), excess, needed)

    def _project_owner(self, name: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(select(PROJECTS.c.tenant).where(PROJECTS.c.name == name)).scalar()

    # -- admission ------------------------------------------------------------------------------

    def reserve(
        self,
        allocation: Allocation,
        allocated_fraction: float = 0.0,
        *,
        allow_borrow: bool = True,
        pool: Pool | None = None,
    ) -> Reservation:
        """Reserve one allocation a scheduling cycle admitted; see `reserve_allocations`."""
        return self.reserve_allocations([allocation], allocated_fraction, allow_borrow=allow_borrow, pool=pool)[0]

    def reserve_allocations(
        self,
        allocations: Sequence[Allocation],
        allocated_fraction: float = 0.0,
        *,
        allow_borrow: bool = True,
        pool: Pool | None = None,
    ) -> list[Reservation]:
        """Reserve a cycle's admitted allocations in one transaction, in order, each decided on the
        balances the ones before it left, with its placement.

        Each is charged its placed milli (a fraction rounded up to whole compute units is charged
        rounded). One the cycle admitted borrowed is reserved borrowed; any other is reserved
        in-quota if it fits its caps at the ratio for `allocated_fraction` (the pool's allocated
        share), else borrowed (P1/P2, when `allow_borrow`), else refused with the reason. A refusal
        is an answer and writes nothing for it; bad input (an unknown account, a request already
        reserved, a placement without one slice per GPU) refuses the whole batch, and so does, with
        the `pool`, a placement past the pool's capacity (`OverCapacity`, as in `apply_cycle`)."""
        try:
            with self._write() as w:
                room = None
                if pool is not None:
                    lock_capacity(w.conn)
                    room = CapacityCheck(pool, live_usage(w.conn))
                admission.lock_tenants(w, (a.request.tenant for a in allocations))
                got = []
                for a in allocations:
                    answer = admission.reserve(w, self.policy, a, allocated_fraction, allow_borrow)
                    if answer.admitted and room is not None and (why := room.take(a.placement)):
                        raise no_room(a.id, why)
                    got.append(answer)
        except IntegrityError as e:
            # Only the unique index on live request ids can refuse a reserve's writes.
            ids = [a.id for a in allocations]
            raise admission.already_reserved(self._first_duplicate(ids) or ids[0]) from e
        # The allocation ids are known once the transaction has written them.
        return [admission.resolved(r) for r in got]

    def apply_cycle(
        self,
        result: CycleResult,
        allocated_fraction: float = 0.0,
        *,
        capacity_milli: int | None = None,
        pool: Pool | None = None,
    ) -> list[Reservation]:
        """Write one scheduling cycle's decisions in one transaction: its preemptions, its admissions
        (reserved as the cycle admitted them), then its returns, the order the cycle decides them in
        (a return of an allocation the cycle also preempts is written before the preemption).

        `allocated_fraction` is the pool's allocated share the cycle started from. With the pool's
        `capacity_milli` (default: `pool`'s) the share moves as the cycle's does (victims leave,
        admissions arrive): each admission's cap is checked at the ratio of the share after the
        victims and the admissions before it, and the returns at the laxer of the cycle's first and
        last ratio, so whether the cycle decided its returns before its admissions or after them, a
        decision it made on the ledger's own balances passes here too. With the `pool`, each
        admission's placement is checked against the pool's capacity minus the live allocations'
        (after the victims left), under the pool's capacity lock (`capacity.py`).

        All or nothing: when the ledger cannot do a decision as made (a victim it does not hold, a
        return with no room under the cap, an admission that is not in-quota where the cycle said
        so), it raises (`StaleCycle` for a snapshot that no longer matches the ledger) and writes
        nothing; rebuild the snapshot from the ledger and run the cycle again. An admission the
        ledger refuses on its own account raises a `RequestRefused` naming it: `BadRequest` (a
        field its columns cannot hold, a placement it cannot store, an unknown account; also a
        statement the database refused while writing it) or `OverCapacity`; decide again without
        it. Returns the admissions' reservations, in order."""
        capacity_milli = pool.gpu_milli if capacity_milli is None and pool is not None else capacity_milli

        def write(isolate: bool) -> list[Reservation]:
            with self._write() as w:
                got = write_cycle(w, self.policy, result, allocated_fraction, capacity_milli, pool, isolate=isolate)
            return [admission.resolved(r) for r in got]

        try:
            return write(isolate=False)
        except DBAPIError as e:
            duplicate = self._first_duplicate([ad.request_id for ad in result.admits])
            if isinstance(e, IntegrityError) and duplicate is not None:
                raise admission.already_reserved(duplicate) from e
            # A statement failed when the batch was written: write again, flushing after each
            # admission, so the one the database refuses is named (or the cycle is written whole).
            _logger.warning("ledger: writing the cycle failed (%s); writing it again admission by admission", e)
            return write(isolate=True)

    def _first_duplicate(self, ids: list[str]) -> str | None:
        """The first of `ids` that holds a live allocation or comes twice (None: neither)."""
        with self.engine.connect() as conn:
            live = set(
                conn.execute(
                    select(ALLOCATIONS.c.request_id).where(ALLOCATIONS.c.state != AllocState.RELEASED.value)
                ).scalars()
            )
        seen: set[str] = set()
        for rid in ids:
            if rid in live or rid in seen:
                return rid
            seen.add(rid)
        return None

    def commit(self, request_id: str) -> None:
        """Confirm a reserved request's launch: reserved becomes used."""
        self.commit_many([request_id])

    def commit_many(self, request_ids: Sequence[str]) -> None:
        """Confirm several launches in one transaction (all or none)."""
        with self._write() as w:
            admission.lock_tenants_of(w, request_ids)
            for rid in request_ids:
                admission.commit(w, rid)

    def release(
        self, request_id: str, cause: str = "finished", allocated_fraction: float = 0.0, *, auto_return: bool = True
    ) -> list[str]:
        """Give back a request's milli; borrowed allocations of its tenant that now fit under the
        cap are returned (oldest first) in the same transaction. Returns their request ids."""
        return self.release_many([request_id], cause, allocated_fraction, auto_return=auto_return)

    def release_many(
        self,
        request_ids: Sequence[str],
        cause: str = "finished",
        allocated_fraction: float = 0.0,
        *,
        auto_return: bool = True,
    ) -> list[str]:
        """Release several requests in one transaction (all or none), as `release` does each."""
        with self._write() as w:
            admission.lock_tenants_of(w, request_ids)
            returned: list[str] = []
            for rid in request_ids:
                returned += admission.release(
                    w, self.policy, rid, cause=cause, allocated_fraction=allocated_fraction, auto_return=auto_return
                )
            return returned

    def preempt(
        self,
        victim: str,
        by: str,
        reason: PreemptReason | str = PreemptReason.PRIORITY,
        allocated_fraction: float = 0.0,
        *,
        auto_return: bool = True,
    ) -> list[str]:
        """Take `victim`'s milli back for request `by` (reason `priority` or `reclaim`)."""
        try:
            why = PreemptReason(reason)
        except ValueError as e:
            raise LedgerError(
                f"unknown preemption reason '{reason}': use one of {', '.join(r.value for r in PreemptReason)}"
            ) from e
        with self._write() as w:
            return admission.preempt(w, self.policy, victim, by, why, allocated_fraction, auto_return)

    def return_borrowed(self, tenant: str, allocated_fraction: float = 0.0) -> list[str]:
        """Turn `tenant`'s borrowed allocations in-quota, oldest first, while they fit under its cap."""
        with self._write() as w:
            return admission.return_borrowed(w, self.policy, tenant, allocated_fraction)

    def checkpointed_many(self, times: Mapping[str, float]) -> list[str]:
        """Record when each run last saved a checkpoint (`times`: request id -> epoch seconds), in one
        transaction: a live allocation keeps the latest time it was told, a run the ledger holds
        nothing for (released meanwhile, or asking no GPU) is skipped. No balance changes, so no
        entry is written. Returns the request ids whose time moved, sorted."""
        bad = sorted(rid for rid, at in times.items() if not math.isfinite(at))
        if bad:
            raise LedgerError(f"checkpoint times of {', '.join(bad)} are not finite: report epoch seconds")
        moved = []
        with self.engine.begin() as conn:
            for rid in sorted(times):
                at = float(times[rid])
                live = and_(ALLOCATIONS.c.request_id == rid, ALLOCATIONS.c.state != AllocState.RELEASED.value)
                later = or_(ALLOCATIONS.c.checkpointed_at.is_(None), ALLOCATIONS.c.checkpointed_at < at)
                if conn.execute(update(ALLOCATIONS).where(live, later).values(checkpointed_at=at)).rowcount:
                    moved.append(rid)
        return moved

    # -- reading --------------------------------------------------------------------------------

    def accounts(self) -> list[AccountView]:
        """Every account, tenants before their projects, sorted by key."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(ACCOUNTS).order_by(ACCOUNTS.c.key)).all()
        return [AccountView.from_row(r) for r in rows]

    def snapshot(self) -> tuple[QuotaBook, dict[AccountKey, Balance]]:
        """The quota book and the balances of the accounts it charges, read together."""
        views = self.accounts()
        tenants = {v.key.tenant: v.quota or 0 for v in views if v.key.project is None}
        projects = {(v.key.tenant, v.key.project): v.quota for v in views if v.key.project is not None}
        balances = {v.key: v.balance for v in views if v.limited}
        return QuotaBook(tenants, projects), balances

    def quota_book(self) -> QuotaBook:
        """Every tenant's and project's quota, as the scheduler core reads them."""
        return self.snapshot()[0]

    def balances(self) -> dict[AccountKey, Balance]:
        """The balances of every account the core charges (tenants; projects with a quota)."""
        return self.snapshot()[1]

    def allocations(self, *, live: bool = True) -> list[Allocation]:
        """The allocations held, oldest first, exactly as the cycles admitted them (request,
        placement, start, borrowed, confirmed): `Snapshot.build(pool, ledger.allocations(), book)`
        is the cluster state they hold. `live=False` adds the released ones (history); there, rows
        reserved before placements were stored (migration 0002) come with one unnamed slice per GPU."""
        query = select(ALLOCATIONS).order_by(ALLOCATIONS.c.reserved_at, ALLOCATIONS.c.request_id, ALLOCATIONS.c.id)
        if live:
            query = query.where(ALLOCATIONS.c.state != AllocState.RELEASED.value)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
            placements = read_placements(conn, rows, for_accounting=not live)
        return [to_allocation(r, p) for r, p in zip(rows, placements, strict=True)]

    def entries(
        self, tenant: str | None = None, project: str | None = None, kind: str | None = None, limit: int | None = None
    ) -> list[EntryView]:
        """Entries in the order written, filtered by tenant, project and kind; `limit` keeps the latest."""
        if kind is not None and kind not in {k.value for k in EntryKind}:
            raise LedgerError(f"unknown entry kind '{kind}': use one of {', '.join(k.value for k in EntryKind)}")
        query = select(ENTRIES).join(ACCOUNTS, ACCOUNTS.c.key == ENTRIES.c.account)
        if tenant is not None:
            query = query.where(ACCOUNTS.c.tenant == tenant)
        if project is not None:
            query = query.where(ACCOUNTS.c.project == project)
        if kind is not None:
            query = query.where(ENTRIES.c.kind == kind)
        query = query.order_by(ENTRIES.c.id.desc())
        if limit is not None:
            query = query.limit(limit)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [EntryView.from_row(r) for r in reversed(rows)]

    def idle_history(self, since: float, book: QuotaBook | None = None) -> IdleHistory:
        """Each tenant's in-quota milli from `since` on, rebuilt from the entries (`ledger/idle.py`): the
        history the simulator keeps, so `.lasting_idle(now, span_s)` with `since = now - span_s` is the
        live `Snapshot.lasting_idle`. `book` (default: the ledger's own) names the tenants and quotas."""
        with self.engine.connect() as conn:
            rows = read_in_quota_changes(conn, since)
        return idle_history_from(book or self.quota_book(), rows, since)

    def lasting_free(self, now: float, span_s: float, capacity_milli: int) -> int:
        """The least free milli of a pool of `capacity_milli` over the last `span_s` up to `now`, from the
        allocations' reserve and release times (`idle.lasting_free`): what elastic runs may grow into."""
        with self.engine.connect() as conn:
            rows = read_holdings(conn, now - span_s)
        return lasting_free(rows, capacity_milli, now - span_s, now)

    def rebuild(self, pool: Pool | None = None) -> RebuildReport:
        """Recompute every balance from the entries and report any difference from the stored ones;
        with the `pool`, also every GPU and node the live allocations hold past its capacity."""
        with self.engine.connect() as conn, conn.begin():
            stored = {
                r.key: (r.quota, r.used, r.reserved, r.borrowed)
                for r in conn.execute(select(ACCOUNTS).order_by(ACCOUNTS.c.key))
            }
            entries = [EntryView.from_row(r) for r in conn.execute(select(ENTRIES).order_by(ENTRIES.c.id))]
            usage = live_usage(conn) if pool is not None else None
        report = compare(stored, entries)
        if pool is None or usage is None:
            return report
        return replace(report, over_capacity=over_capacity(pool, usage))


def _project_taken(name: str, owner: str, wanted: str) -> LedgerError:
    if owner == wanted:
        return AlreadyExists(
            f"project '{name}' already exists in tenant '{wanted}': change its quota with "
            f"`xirang quota project set {wanted} {name} --quota 8`"
        )
    return ProjectInOtherTenant(name, owner, wanted)


def _check_name(name: str, what: str) -> None:
    try:
        check_name(name, what)
    except InputError as e:
        raise InvalidName(str(e)) from None


def _check_quota(quota: object, what: str) -> None:
    try:
        check_quota_milli(quota, what)
    except InputError as e:
        raise InvalidAmount(str(e)) from None
