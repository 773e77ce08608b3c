"""`xirang check-config`: what in a platform config that loads is still likely a mistake.

The loader (`platform_config.load_config`) refuses what cannot work (project quotas past their
tenant's cap at the highest ratio, a location naming an unknown tenant, a tier preference naming a
GPU model the pool lacks); `check-config` reports its refusal as an error, and says when a running
platform keeps its last good version meanwhile (`live_config`). On a config that loads, these checks
warn:

- `quota-past-pool`: the tenants' quotas sum past the pool's GPUs, so in-quota work can wait for
  capacity it was promised;
- `project-past-tenant-quota`: a project's quota is larger than its tenant's, so it can be reached only
  while the pool is allocated little enough for the overcommit ratio to allow it;
- `location-without-tenant`: a code location of the workspace that `locations:` does not map, whose
  GPU runs fail at submission;
- `tenant-without-location`: a tenant no code location is charged to, so no run can use its quota.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from xirang_platform.control.live_config import saved_at
from xirang_platform.control.platform_config import PlatformConfig, PlatformConfigError, load_config
from xirang_platform.pool.model import MILLI_PER_GPU


@dataclass(frozen=True, order=True)
class Finding:
    """One problem: `error` (the config does not load) or `warning`, what it is, and the fix."""

    severity: str
    check: str
    message: str

    def as_dict(self) -> dict[str, str]:
        """The finding as JSON."""
        return asdict(self)


def check_config(path: Path | None, workspace: Path | None) -> list[Finding]:
    """Every finding of the config at `path` (default `XIRANG_CONFIG`, else ./xirang.yaml) against the
    code locations of `workspace` (None: the location checks are skipped), errors first."""
    try:
        config = load_config(path)
    except PlatformConfigError as e:
        return [Finding("error", "loads", f"{e}{_kept(path)}")]
    found = quota_checks(config)
    if workspace is not None:
        found += location_checks(config, workspace_locations(workspace))
    return sorted(found)


def _kept(path: Path | None) -> str:
    """What a running platform does meanwhile, when it saved a good version of the file (`live_config`)."""
    saved = saved_at(path)
    if saved is None:
        return ""
    when = datetime.fromtimestamp(saved, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"; the running platform keeps its last good config (saved {when}) until this is fixed"


def quota_checks(config: PlatformConfig) -> list[Finding]:
    """The quota warnings of a loaded config."""
    book, pool = config.book, config.pool
    out = []
    total = sum(book.tenants.values())
    if total > pool.gpu_milli:
        out.append(
            Finding(
                "warning",
                "quota-past-pool",
                f"{config.source}: the tenants' quotas sum to {_gpus(total)} GPUs, past the pool's "
                f"{_gpus(pool.gpu_milli)}: in-quota work can wait for capacity it was promised; lower a tenant's "
                f"quota_gpus or add nodes",
            )
        )
    for (tenant, project), quota in sorted(book.projects.items()):
        if quota is not None and quota > book.tenants[tenant]:
            out.append(
                Finding(
                    "warning",
                    "project-past-tenant-quota",
                    f"{config.source}: project {tenant}/{project} has {_gpus(quota)} GPUs, more than tenant "
                    f"{tenant}'s {_gpus(book.tenants[tenant])}: it is reachable only while the overcommit ratio "
                    f"allows it; lower the project's quota_gpus or raise the tenant's",
                )
            )
    return out


def location_checks(config: PlatformConfig, locations: Sequence[str]) -> list[Finding]:
    """The location warnings: workspace locations without a tenant, tenants without a location."""
    out = []
    for location in sorted(set(locations) - set(config.locations)):
        out.append(
            Finding(
                "warning",
                "location-without-tenant",
                f"{config.source}: code location {location!r} of the workspace has no tenant: its GPU runs fail at "
                f"submission; map it under `locations:` ({location}: one of {', '.join(sorted(config.book.tenants))})",
            )
        )
    charged = set(config.locations.values())
    for tenant in sorted(set(config.book.tenants) - charged):
        out.append(
            Finding(
                "warning",
                "tenant-without-location",
                f"{config.source}: tenant {tenant!r} has no code location: no run can use its quota; map one "
                f"under `locations:`, or drop the tenant",
            )
        )
    return out


def workspace_locations(path: Path) -> list[str]:
    """The code location names a Dagster `workspace.yaml` loads (`location_name`, else the attribute,
    module or file name Dagster names it by)."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise PlatformConfigError(f"{path}: cannot read the workspace ({e}); pass --workspace FILE") from None
    names = []
    for entry in doc.get("load_from") or []:
        for spec in (entry or {}).values():
            if isinstance(spec, dict):
                names.append(str(_location_name(spec)))
    return names


def _location_name(spec: dict[str, Any]) -> str:
    for key in ("location_name", "attribute", "module_name", "package_name"):
        if spec.get(key):
            return str(spec[key])
    return Path(str(spec.get("relative_path", "unnamed"))).stem


def _gpus(milli: int) -> str:
    return f"{milli / MILLI_PER_GPU:g}"
