"""The `--tenants` YAML file: tenant and project quotas for a replay, read into a `QuotaBook`.

```yaml
tenants:
  research:
    quota_gpus: 40          # or quota_share: 0.4 (a fraction of the pool's GPUs)
    projects:
      llm: {quota_gpus: 20}
      vision: {}            # no quota of its own: limited by the tenant's only
  product:
    quota_share: 0.6        # no projects: one project called `default`
```

Quotas are whole or fractional GPUs (at most 3 decimals), stored in milli-GPU; names and quotas
follow the ledger's rules (`xirang_platform.base.user_input`: lower-case names, quotas up to 1,000,000
GPUs). Tenant shares sum to at most 1. Project quotas of a tenant may sum to at most the tenant
quota x the overcommit policy's maximum ratio (DESIGN.md section 6).
Without a file, one tenant `default` with project `default` owns the whole pool.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml

from xirang_platform.base.user_input import InputError, check_name, not_utf8, quota_milli, shown
from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.quota import OvercommitPolicy, QuotaBook, project_quota_excess

DEFAULT_PROJECT = "default"
_TENANT_KEYS = ("quota_gpus", "quota_share", "projects")
_PROJECT_KEYS = ("quota_gpus", "quota_share")


class TenantsError(ValueError):
    """A tenants file that cannot be used; the message names the place and the fix."""


def default_book(pool_gpu_milli: int) -> QuotaBook:
    """One tenant `default`, project `default`, owning the whole pool."""
    return QuotaBook.single_tenant(pool_gpu_milli)


def read_tenants(path: str | Path, pool_gpu_milli: int, policy: OvercommitPolicy | None = None) -> QuotaBook:
    """The quota book a tenants YAML file describes, for a pool of `pool_gpu_milli`."""
    path = Path(path)
    if not path.is_file():
        raise TenantsError(f"{path}: no such tenants file; see data/tenants.example.yaml for the format")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise TenantsError(not_utf8(path, e)) from None
    except yaml.YAMLError as e:
        raise TenantsError(f"{path}: not valid YAML ({e}); see data/tenants.example.yaml") from None
    return book_from_dict(doc, pool_gpu_milli, policy, source=str(path))


def book_from_dict(
    doc: Any, pool_gpu_milli: int, policy: OvercommitPolicy | None = None, source: str = "tenants"
) -> QuotaBook:
    """The quota book of an already parsed tenants document (see the module docstring)."""
    policy = policy or OvercommitPolicy()
    if not isinstance(doc, dict) or not isinstance(doc.get("tenants"), dict) or not doc["tenants"]:
        raise TenantsError(f"{source}: expected a top-level `tenants:` mapping of tenant names to quotas")
    _known_keys(source, doc, ("tenants",))
    tenants: dict[str, int] = {}
    projects: dict[tuple[str, str], int | None] = {}
    for raw_name, spec in doc["tenants"].items():
        name = _name(f"{source}: tenants", raw_name, "tenant")
        where = f"{source}: tenants.{name}"
        if not isinstance(spec, dict):
            raise TenantsError(f"{where}: expected a mapping with quota_gpus or quota_share")
        _known_keys(where, spec, _TENANT_KEYS)
        quota = _quota(where, spec, pool_gpu_milli)
        if quota is None:
            raise TenantsError(f"{where}: give quota_gpus (GPUs) or quota_share (fraction of the pool)")
        tenants[str(name)] = quota
        sub = spec.get("projects") or {DEFAULT_PROJECT: {}}
        if not isinstance(sub, dict):
            raise TenantsError(f"{where}.projects: expected a mapping of project names to quotas")
        for raw_pname, pspec in sub.items():
            pname = _name(f"{where}.projects", raw_pname, "project")
            pwhere = f"{where}.projects.{pname}"
            pspec = {} if pspec is None else pspec
            if not isinstance(pspec, dict):
                raise TenantsError(f"{pwhere}: expected a mapping (or {{}} for no quota of its own)")
            _known_keys(pwhere, pspec, _PROJECT_KEYS)
            projects[(str(name), str(pname))] = _quota(pwhere, pspec, pool_gpu_milli)
    _check_shares(source, doc)
    book = QuotaBook(tenants, projects)
    for t in sorted(tenants):
        excess = project_quota_excess(book, t, policy)
        if excess:
            raise TenantsError(
                f"{source}: tenants.{t}: project quotas exceed the tenant quota x {policy.max_ratio} by "
                f"{excess / MILLI_PER_GPU:g} GPUs; lower a project quota or raise the tenant's"
            )
    return book


def _quota(where: str, spec: dict, pool_gpu_milli: int) -> int | None:
    if "quota_gpus" in spec and "quota_share" in spec:
        raise TenantsError(f"{where}: give quota_gpus or quota_share, not both")
    if "quota_gpus" in spec:
        try:
            return quota_milli(spec["quota_gpus"])
        except InputError as e:
            raise TenantsError(f"{where}: {e}") from None
    if "quota_share" not in spec:
        return None
    share = spec["quota_share"]
    what = "give a fraction of the pool between 0 and 1"
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
        problem = "is more than the whole pool" if isinstance(share, int | float) and share > 1 else "is not a fraction"
        raise TenantsError(f"{where}: quota_share {shown(share)} {problem}; {what}")
    return round(share * pool_gpu_milli)


def _check_shares(source: str, doc: dict) -> None:
    """Tenant shares are fractions of one pool: together at most all of it."""
    shares = {
        str(name): spec["quota_share"]
        for name, spec in doc["tenants"].items()
        if isinstance(spec, dict) and "quota_share" in spec
    }
    total = sum(shares.values())
    if total > 1 + 1e-9:
        listed = ", ".join(f"{n} {v:g}" for n, v in sorted(shares.items()))
        raise TenantsError(
            f"{source}: tenant quota_share values sum to {total:g} ({listed}), more than the whole pool; "
            "lower them so that they sum to at most 1"
        )


def _name(where: str, name: object, what: str) -> str:
    if isinstance(name, int) and not isinstance(name, bool):
        name = str(name)  # YAML reads a key like `2024:` as a number
    try:
        return check_name(name, what)
    except InputError as e:
        raise TenantsError(f"{where}: {e}") from None


def _known_keys(where: str, spec: dict, allowed: tuple[str, ...]) -> None:
    for key in spec:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(allowed)}"
            raise TenantsError(f"{where}: unknown key {key!r}; {hint}")
