"""Configuration files read through pydantic models, with messages that name the place and the fix.

Each file's model derives from `ConfigModel` (unknown keys refused, frozen). A `ValidationError` is
reduced to its first `Problem`: where (the key path), what pydantic found (its error type, the value)
and what the model knows there (the keys allowed, the choices). Each reader words its own message
from it, so a file keeps its house style (`file:line: field: problem; fix`, `file: key: ...`).
"""

from __future__ import annotations

import difflib
import enum
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError

KEY = "[key]"  # pydantic's path step for a mapping's key (the step before it is the key itself)


class ConfigModel(BaseModel):
    """A configuration file's model: unknown keys are refused, the result is frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Problem:
    """The first thing a model refused: its place, pydantic's error type, the value and the message
    (a validator's own text, else pydantic's)."""

    path: tuple[str | int, ...]
    kind: str
    value: Any
    message: str
    annotation: Any = None
    known: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """The last key of the path (for a mapping's key: the key itself)."""
        steps = [s for s in self.path if s != KEY]
        return str(steps[-1]) if steps else ""

    def where(self, path: Sequence[str | int] | None = None) -> str:
        """The path as written in the file's terms: `gpu_tolerations[0].effect`, `services.sd.load`."""
        out = ""
        for step in self.path if path is None else path:
            if step == KEY:
                continue
            out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else str(step))
        return out

    def choices(self) -> list[str]:
        """The values allowed where the problem is (an enum's or a Literal's), in their order."""
        return choices_of(self.annotation)

    @property
    def fields(self) -> tuple[str, ...]:
        """The keys of the section the problem is about (when it is a model)."""
        annotation = _plain(self.annotation)
        return tuple(annotation.model_fields) if _is_model(annotation) else ()

    def unknown_key_message(self, source: str) -> str:
        """`<source>[: <section>]: unknown key 'x'; did you mean 'y'?` (or the keys allowed)."""
        where = ": ".join(p for p in (source, self.where(self.path[:-1])) if p)
        return f"{where}: unknown key {self.key!r}; {self.unknown_key_hint()}"

    def unknown_key_hint(self) -> str:
        """`did you mean 'x'?` for a misspelt key, else the keys allowed."""
        close = difflib.get_close_matches(self.key, self.known, n=1)
        return f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(self.known)}"


def first_problem(error: ValidationError, model: type[BaseModel]) -> Problem:
    """The first error of `error` (raised validating `model`) as a `Problem`: an unknown key before
    anything else (a misspelt key also makes its value look missing)."""
    errors = error.errors(include_url=False)
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    path = tuple(first["loc"])
    raised = (first.get("ctx") or {}).get("error")
    message = str(raised) if isinstance(raised, ValueError) else first["msg"]
    parent = _plain(_annotation_at(model, path[:-1]))
    known = tuple(parent.model_fields) if _is_model(parent) else ()
    return Problem(path, first["type"], first.get("input"), message, _annotation_at(model, path), known)


def choices_of(annotation: Any) -> list[str]:
    """The values an enum or a Literal annotation allows, as text."""
    annotation = _plain(annotation)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [str(m.value) for m in annotation]
    if get_origin(annotation) is Literal:
        return [str(a) for a in get_args(annotation)]
    return []


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _plain(annotation: Any) -> Any:
    """`annotation` without `Annotated[...]` and without `| None`."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            rest = [a for a in get_args(annotation) if a is not type(None)]
            annotation = rest[0] if len(rest) == 1 else annotation
            if len(rest) != 1:
                return annotation
        else:
            return annotation


def _annotation_at(model: type[BaseModel], path: tuple[str | int, ...]) -> Any:
    """The annotation of the value at `path` inside `model` (None where the path leaves the model)."""
    annotation: Any = model
    for i, step in enumerate(path):
        if step == KEY:
            continue
        annotation = _plain(annotation)
        origin, args = get_origin(annotation), get_args(annotation)
        if _is_model(annotation):
            field = annotation.model_fields.get(str(step))
            annotation = field.annotation if field is not None else None
        elif origin in (dict, Mapping) and len(args) == 2:
            annotation = args[0] if path[i + 1 : i + 2] == (KEY,) else args[1]
        elif origin in (list, tuple, Sequence) and args:
            annotation = args[0]
        else:
            return None
        if annotation is None:
            return None
    return annotation
