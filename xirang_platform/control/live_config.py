"""The platform config as a running platform reads it: an edit applies, a bad edit never does.

Every long-lived reader of `xirang.yaml` (the tick and the sensors in their code server, the run
coordinator in the webserver and the daemon, the exporter) and every run worker reads it through
`read_live`. The file is read again when it changed (its modification time, size or inode): an edit
that loads becomes the config in force; one the loader refuses (`quota_gpus: 8 GPUs`, a misspelt
key, broken YAML) does not: the last good config stays in force and the reading carries the
loader's message, which the tick puts in its message in the UI, the exporter serves as
`xirang_config_ok 0` and `xirang check-config` prints.

A process that starts while the file is bad (a run worker, a reloaded code location) has no good
config of its own yet: it takes the last good one that any process of the platform saved, the text
of the file as it last loaded, under `$DAGSTER_HOME/xirang-config/` (written whenever a new good
config was read; relative paths in it still resolve against the config file's folder), so a bad
edit never reaches a run as a stack trace. Without such a copy the loader's error stands, as it does
for a platform started on a bad file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from xirang_platform.control.platform_config import (
    PlatformConfig,
    PlatformConfigError,
    config_from_dict,
    config_path,
    load_config,
)

SAVED_DIR = "xirang-config"  # under DAGSTER_HOME: the last good config of each config file
_logger = logging.getLogger("xirang.config")


@dataclass(frozen=True)
class ConfigReading:
    """The config in force (the file's, or the last good one while the file is bad), why the file as
    it is now is not in force (None: it is), and a number that grows with each new config in force."""

    config: PlatformConfig
    problem: str | None = None
    generation: int = 0

    def line(self) -> str:
        """One line for people: the problem and what runs instead ('' when the file is in force)."""
        if self.problem is None:
            return ""
        return f"platform config not applied: {self.problem}; the platform runs on its last good config until then"


@dataclass
class _Watch:
    """What this process last read of one config file."""

    stamp: tuple[int, int, int] | None
    reading: ConfigReading


_WATCHES: dict[str, _Watch] = {}
_LOCK = threading.Lock()
_GENERATIONS = iter(range(1, 2**62))


def read_live(path: str | Path | None = None) -> ConfigReading:
    """The platform config of `path` (default: `XIRANG_CONFIG`, else ./xirang.yaml) in force now, read
    again only when the file changed; raises the loader's `PlatformConfigError` only when neither this
    process nor a saved copy has a good config of that file."""
    file = config_path(path).resolve()
    stamp = _stamp(file)
    with _LOCK:
        watch = _WATCHES.get(str(file))
        if watch is not None and watch.stamp == stamp:
            return watch.reading
        text = _text(file)
        try:
            reading = ConfigReading(load_config(file), None, next(_GENERATIONS))
        except PlatformConfigError as e:
            last = watch.reading if watch is not None else _saved(file)
            if last is None:
                raise
            reading = ConfigReading(last.config, str(e), last.generation)
            _logger.error(reading.line())
        else:
            if text is not None and text == _text(file):  # the text that loaded, not a later edit
                _save(file, text)
        _WATCHES[str(file)] = _Watch(stamp, reading)
        return reading


def saved_at(path: str | Path | None = None) -> float | None:
    """When the last good config of `path` was saved for the platform's processes (None: no copy)."""
    saved = _saved_file(config_path(path).resolve())
    return saved.stat().st_mtime if saved is not None and saved.is_file() else None


def forget() -> None:
    """Drop what this process read (as a new process starts): the next reading reads the file again."""
    with _LOCK:
        _WATCHES.clear()


def _stamp(file: Path) -> tuple[int, int, int] | None:
    try:
        st = file.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def _text(file: Path) -> str | None:
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _saved_file(file: Path) -> Path | None:
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        return None
    return Path(home) / SAVED_DIR / f"{hashlib.sha256(str(file).encode()).hexdigest()[:16]}.json"


def _save(file: Path, text: str) -> None:
    """Save `text`, the file's text that loaded, as its last good config for the platform's other processes."""
    target = _saved_file(file)
    if target is None:
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"file": str(file), "text": text}), encoding="utf-8")
        os.replace(tmp, target)
    except OSError as e:  # a read-only home keeps only this process's copy
        _logger.warning("cannot save the last good platform config under %s: %s", target.parent, e)


def _saved(file: Path) -> ConfigReading | None:
    """The last good config of `file` a process of the platform saved, or None."""
    saved = _saved_file(file)
    if saved is None or not saved.is_file():
        return None
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(saved.stat().st_mtime))
    try:
        doc = yaml.safe_load(json.loads(saved.read_text(encoding="utf-8"))["text"])
        config = config_from_dict(doc or {}, base=file.parent, source=str(file))
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as e:  # PlatformConfigError is a ValueError
        _logger.warning("the saved platform config %s cannot be read (%s)", saved, e)
        return None
    _logger.warning("platform config %s: running on its last good copy, saved %s", file, when)
    return ConfigReading(config, None, next(_GENERATIONS))
