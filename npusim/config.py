"""Loading and validating the user's YAML files (arch, mapping specs).

One job: turn a YAML file into a validated, immutable pydantic model, or raise
:class:`~npusim.errors.ConfigError` naming the file, the key path
(``cores.sram.capacity_mb``), what was expected and, for unknown keys, the
closest valid key ("did you mean ...?"). Only ``yaml.safe_load`` is used.

``extends: other.yaml`` (path relative to the file, or a preset name) loads the
base file first and deep-merges the overriding file on top of it; mappings merge
key by key, every other value is replaced.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from npusim.errors import ConfigError
from npusim.files import read_text

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base for every schema: unknown keys are errors, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # inf/nan: never a valid input


def load_yaml(path: Path) -> dict[str, Any]:
    """Read one YAML mapping with ``yaml.safe_load``; syntax errors name the line."""
    text = read_text(path, "a YAML file")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}:{where}: invalid YAML: {problem}") from None
    if data is None:
        raise ConfigError(f"{path}: the file is empty; expected a YAML mapping")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a YAML mapping at the top level, got {type(data).__name__}")
    return data


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Merge ``override`` into a copy of ``base``: dicts recursively, other values replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_with_extends(path: Path, resolve_name, _seen: tuple[Path, ...] = (), merge=deep_merge) -> dict[str, Any]:
    """Load ``path`` and, if it says ``extends: X``, merge it over X (recursively).

    ``resolve_name(name, relative_to)`` maps the ``extends`` value to a file path; ``merge(base,
    override)`` merges (a schema whose derived keys must follow their sources passes its own).
    """
    path = Path(path).resolve()
    if path in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise ConfigError(f"{path}: extends: cycle detected: {chain}")
    data = load_yaml(path)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: extends: expected a file name or preset name, got {parent!r}")
    base = load_with_extends(resolve_name(parent, path.parent), resolve_name, (*_seen, path), merge)
    return merge(base, data)


def validate(model: type[M], data: dict[str, Any], source: str | Path) -> M:
    """Validate ``data`` against ``model``; raise one ConfigError listing every problem (one line
    when there is one)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = [_describe(model, err) for err in exc.errors()]
        if len(lines) == 1:
            raise ConfigError(f"{source}: {lines[0]}") from None
        raise ConfigError(f"{source}: {len(lines)} problems:\n  " + "\n  ".join(lines)) from None


def _describe(model: type[BaseModel], err: dict[str, Any]) -> str:
    loc = [str(p) for p in err["loc"]]
    key = ".".join(loc) or "(top level)"
    if err["type"] == "extra_forbidden":
        valid = _fields_at(model, err["loc"][:-1])
        hint = difflib.get_close_matches(loc[-1], valid, n=1, cutoff=0.6)
        suggestion = f"; did you mean '{hint[0]}'?" if hint else ""
        return f"{key}: unknown key{suggestion} (valid keys here: {', '.join(sorted(valid))})"
    if err["type"] == "missing":
        return f"{key}: required key is missing"
    got = err.get("input")
    got_text = "" if isinstance(got, dict) else f" (got {got!r})"
    return f"{key}: {err['msg'].removeprefix('Value error, ')}{got_text}"


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the sub-model found by walking ``loc`` from ``model``."""
    current: Any = model
    skip_key = False  # the next part is a key of a dict-valued field (e.g. a fabric's name)
    for part in loc:
        if skip_key or isinstance(part, int) or not (isinstance(current, type) and issubclass(current, BaseModel)):
            skip_key = False
            continue
        field = current.model_fields.get(part)
        if field is None:
            return []
        skip_key = getattr(field.annotation, "__origin__", None) is dict
        current = _model_in(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _model_in(annotation: Any) -> Any:
    """The BaseModel class inside an annotation such as ``Foo | None`` or ``list[Foo]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
