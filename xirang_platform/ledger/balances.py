"""One account's balances as the ledger keeps them: the core's `quota.Balance`, the account's key,
and whether it has a quota of its own (a project without one only counts its usage).

The writer holds locked accounts as these, readers get them from `Ledger.accounts()`, and the
rebuild replays entries into them, so the four balance fields live in `quota.Balance` only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from xirang_platform.ledger.tables import Bucket
from xirang_platform.scheduling.quota import AccountKey, Balance, cap


@dataclass(frozen=True)
class AccountView:
    """An account: its key, its balance (quota 0 when it has none of its own), and `limited`."""

    key: AccountKey
    balance: Balance = field(default_factory=lambda: Balance(0))
    limited: bool = False

    @classmethod
    def of(cls, key: AccountKey, quota: int | None, used: int = 0, reserved: int = 0, borrowed: int = 0) -> AccountView:
        """An account with `quota` (None: no quota of its own) and these balances."""
        return cls(key, Balance(quota or 0, used, reserved, borrowed), quota is not None)

    @classmethod
    def from_row(cls, row: Any) -> AccountView:
        """From an `accounts` row."""
        return cls.of(AccountKey(row.tenant, row.project), row.quota, row.used, row.reserved, row.borrowed)

    @property
    def quota(self) -> int | None:
        """The quota in milli-GPU, None for a project without one of its own."""
        return self.balance.quota if self.limited else None

    @property
    def used(self) -> int:
        """In-quota milli of confirmed launches."""
        return self.balance.used

    @property
    def reserved(self) -> int:
        """In-quota milli admitted, launch not yet confirmed."""
        return self.balance.reserved

    @property
    def borrowed(self) -> int:
        """Milli admitted past the cap on idle units."""
        return self.balance.borrowed

    @property
    def in_quota(self) -> int:
        """In-quota milli held: used plus reserved."""
        return self.balance.in_quota

    def cap(self, ratio: float) -> int | None:
        """The cap at `ratio` (None for a project without a quota of its own)."""
        return None if self.quota is None else cap(self.quota, ratio)

    def headroom(self, ratio: float) -> int | None:
        """In-quota milli that still fits under the cap at `ratio` (None when unlimited)."""
        return self.balance.headroom(ratio) if self.limited else None

    def bump(self, bucket: Bucket | str, amount: int) -> AccountView:
        """This account with `amount` added to `bucket` (to the quota: its sum so far)."""
        name = Bucket(bucket).value
        return replace(self, balance=replace(self.balance, **{name: getattr(self.balance, name) + amount}))

    def with_quota(self, quota: int | None) -> AccountView:
        """This account with its quota set (None: no quota of its own)."""
        return replace(self, balance=replace(self.balance, quota=quota or 0), limited=quota is not None)

    def as_tuple(self) -> tuple[int | None, int, int, int]:
        """Quota, used, reserved, borrowed: as the `accounts` row stores them."""
        return (self.quota, self.used, self.reserved, self.borrowed)
