"""The platform's sensors for one code location, as `definitions.py` adds them.

```python
defs = Definitions(
    assets=[...],
    sensors=platform_sensors("research"),
    resources={"gpu_pool": GpuPoolResource()},
)
```

The location named by `tick.location` in the platform config runs the scheduling tick and the three
release sensors (they watch every location); every location runs its own resumption sensors, and,
when the platform config names an `autoscaling:` file, the autoscaling sensor of its own services.
"""

from __future__ import annotations

from collections.abc import Sequence

from dagster import JobDefinition, SensorDefinition

from sensors.autoscaling import build_autoscaling_sensor
from sensors.release import build_release_sensors
from sensors.resume import build_resume_sensors
from sensors.scheduling_tick import build_scheduling_tick
from xirang_platform.control.live_config import read_live


def platform_sensors(
    location: str, config_path: str | None = None, jobs: Sequence[JobDefinition] = ()
) -> list[SensorDefinition]:
    """The sensors code location `location` runs (see the module docstring); `jobs` are the op jobs
    its resumption sensor may rerun after a preemption."""
    platform = read_live(config_path).config  # while an edit of the file is bad, its last good config
    out = build_resume_sensors(location, jobs)
    if platform.autoscaling_path:
        out.append(build_autoscaling_sensor(location, interval_s=platform.tick_interval_s, jobs=jobs))
    if platform.hosts_tick(location):
        out = [build_scheduling_tick(platform.tick_interval_s), *build_release_sensors(), *out]
    return out
