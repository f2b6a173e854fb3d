"""Configs to and from plain data (YAML, JSON), by cattrs over the frozen dataclasses.

One converter reads and writes the config dataclasses (``BuildConfig``, ``PipelineConfig``, a
model config's ``build:`` section); nested dataclasses, tuples, optionals and mappings come from
the type hints; the hooks here cover what the hints cannot say. (A served model's config is not
read here: Triton's ``ModelConfig`` protobuf schema is its one schema, see
``streamrt.serve.configs.triton_config``.)

* scalars are strict: ``True`` is not an integer, ``1.5`` is not one either, ``"8"`` is (protobuf's
  JSON writes 64-bit integers as strings);
* enums are read by value, case-insensitively (``"FP16"`` -> ``Precision.FP16``);
* tuples from lists (a string is refused, not split into characters);
* paths from strings, shape profiles through :class:`~streamrt.types.ShapeProfile`'s own mapping;
* unknown keys are refused, naming them and the allowed ones.

Every failure becomes one :class:`~streamrt.errors.ConfigError` line that says where it happened
(``model 'cnn' build: unknown build config keys ['precison']``); checks of single values
stay in each dataclass's ``__post_init__``, so a config built in Python is checked the same way.

Modules that own a config with a file format of its own register their hooks on
:data:`converter` with :func:`register_class` and the cattrs hook API.

Example:
    >>> from streamrt.config import BuildConfig
    >>> structure({"precision": "FP16"}, BuildConfig).precision
    <Precision.FP16: 'fp16'>
"""

from __future__ import annotations

import dataclasses
import enum
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import cattrs
from cattrs.gen import make_dict_structure_fn

from streamrt.errors import ConfigError
from streamrt.types import ShapeProfile

if sys.version_info < (3, 11):  # pragma: no cover - the backport cattrs itself needs there
    from exceptiongroup import BaseExceptionGroup

__all__ = ["InvalidValue", "class_reader", "converter", "register_class", "structure", "unstructure"]

T = TypeVar("T")


class InvalidValue(ValueError):
    """A value of the wrong kind; the message starts with ``must be`` and the field name is added."""


converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
"""The converter every config goes through (hooks registered below and by config modules)."""


# --- scalars ------------------------------------------------------------------------------------


def _int(value: Any, _: type) -> int:
    if isinstance(value, bool):
        raise InvalidValue(f"must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise InvalidValue(f"must be an integer, got {value!r}")


def _float(value: Any, _: type) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidValue(f"must be a number, got {value!r}")
    try:
        return float(value)
    except ValueError:
        raise InvalidValue(f"must be a number, got {value!r}") from None


def _bool(value: Any, _: type) -> bool:
    if isinstance(value, bool):
        return value
    raise InvalidValue(f"must be true or false, got {value!r}")


def _str(value: Any, _: type) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # YAML reads `name: 7` as a number
    raise InvalidValue(f"must be a string, got {value!r}")


def _path(value: Any, _: type) -> Path:
    if isinstance(value, (str, Path)):
        return Path(value)
    raise InvalidValue(f"must be a path, got {value!r}")


def _enum_hook(cls: type[enum.Enum]) -> Callable[[Any, type], enum.Enum]:
    def structure_enum(value: Any, _: type) -> enum.Enum:
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            allowed = ", ".join(str(m.value) for m in cls)
            raise InvalidValue(f"must be one of {allowed}, got {value!r}") from None

    return structure_enum


converter.register_structure_hook(int, _int)
converter.register_structure_hook(float, _float)
converter.register_structure_hook(bool, _bool)
converter.register_structure_hook(str, _str)
converter.register_structure_hook(Path, _path)
converter.register_unstructure_hook(Path, str)
converter.register_structure_hook_factory(
    lambda t: isinstance(t, type) and issubclass(t, enum.Enum), _enum_hook
)
converter.register_structure_hook(
    ShapeProfile, lambda v, _: v if isinstance(v, ShapeProfile) else ShapeProfile.from_dict(v)
)
converter.register_unstructure_hook(ShapeProfile, lambda p: p.to_dict())


def _tuple_hook(t: Any, conv: cattrs.Converter) -> Callable[[Any, type], tuple[Any, ...]]:
    """``tuple[X, ...]`` and ``tuple[X, Y]`` from a list: a string is not a list of characters."""
    args = t.__args__
    variadic = len(args) == 2 and args[1] is Ellipsis

    def structure_tuple(value: Any, _: type) -> tuple[Any, ...]:
        if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
            raise InvalidValue(f"must be a list, got {value!r}")
        items = list(value)
        if not variadic and len(items) != len(args):
            raise InvalidValue(f"must be a list of {len(args)} values, got {value!r}")
        types = [args[0]] * len(items) if variadic else list(args)
        out = []
        for index, (item, kind) in enumerate(zip(items, types, strict=True)):
            try:
                out.append(conv.get_structure_hook(kind)(item, kind))
            except Exception as exc:  # located like cattrs' own sequences: "field[3]"
                note = cattrs.IterableValidationNote(f"Structuring {t} @ index {index}", index, kind)
                exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]
                raise cattrs.IterableValidationError(f"While structuring {t}", [exc], t) from None
        return tuple(out)

    return structure_tuple


converter.register_structure_hook_factory(lambda t: getattr(t, "__origin__", None) is tuple, _tuple_hook)


def _tuple_as_list(_: Any, conv: cattrs.Converter) -> Callable[[Any], list[Any]]:
    return lambda value: [conv.unstructure(x) for x in value]  # JSON and YAML have lists


converter.register_unstructure_hook_factory(lambda t: getattr(t, "__origin__", None) is tuple, _tuple_as_list)


# --- dataclasses --------------------------------------------------------------------------------

# Display names used in "unknown ... keys" messages (kept from the hand-written readers).
_NAMES: dict[type, str] = {}


def class_reader(
    cls: type[T],
    *,
    name: str = "",
    ignore: tuple[str, ...] = (),
    before: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> Callable[[Any, type], T]:
    """A cattrs hook reading ``cls`` from a mapping: drop the ``ignore``d keys, apply ``before``,
    refuse the keys left over that are not fields. ``name`` appears in the unknown-keys message
    (``unknown build config keys [...]``). The hooks of the fields' types are bound now: register
    nested classes first."""
    generated = make_dict_structure_fn(cls, converter, _cattrs_forbid_extra_keys=True)
    if name:
        _NAMES[cls] = name

    def structure_class(value: Any, _: type) -> T:
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise InvalidValue(f"must be a mapping, got {type(value).__name__}")
        data = {k: v for k, v in value.items() if k not in ignore}
        if before is not None:
            data = before(data)
        return generated(data, cls)

    return structure_class


def register_class(
    cls: type[T],
    *,
    name: str = "",
    ignore: tuple[str, ...] = (),
    before: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> None:
    """Read ``cls`` through :func:`class_reader` wherever the converter meets it."""
    converter.register_structure_hook(cls, class_reader(cls, name=name, ignore=ignore, before=before))


# --- entry points -------------------------------------------------------------------------------


def structure(data: Any, cls: type[T], where: str = "") -> T:
    """``data`` (a mapping) as a ``cls``; any failure is one ConfigError line prefixed with ``where``."""
    if not isinstance(data, Mapping) and not isinstance(data, cls):
        raise ConfigError(_join(where, f"expected a mapping, got {type(data).__name__}"))
    try:
        return converter.structure(data, cls)
    except Exception as exc:  # cattrs wraps what the hooks raise in exception groups
        error = _config_error(exc, where)
        if error is None:
            raise  # not a bad value: a bug, with its traceback
        raise error from None


def unstructure(obj: Any) -> dict[str, Any]:
    """Plain values (str, int, float, bool, list, dict) of a config dataclass: the inverse of :func:`structure`."""
    out = converter.unstructure(obj)
    assert isinstance(out, dict)
    return out


def _join(where: str, message: str) -> str:
    return f"{where}: {message}" if where else message


def _config_error(exc: BaseException, where: str) -> ConfigError | None:
    """The first leaf of cattrs' exception tree as one line: location, field and message.

    None when the leaf is not about a value (an AttributeError in a hook is a bug, not a config error).
    """
    path: list[str] = []
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
        for note in getattr(exc, "__notes__", ()):
            if isinstance(note, cattrs.AttributeValidationNote):
                path.append(f".{note.name}" if path else note.name)
            elif isinstance(note, cattrs.IterableValidationNote):
                path.append(f"[{note.index}]")
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        known = sorted(f.name for f in dataclasses.fields(exc.cl))
        name = _NAMES.get(exc.cl, "")
        message = f"unknown {name + ' ' if name else ''}keys {sorted(exc.extra_fields)}; known: {known}"
        return _error(where, "".join(path), message)
    if isinstance(exc, ConfigError):
        return _error(where, "".join(path), exc.message, exc.hint)
    field, container = _split_last(path)
    if isinstance(exc, InvalidValue):
        return _error(where, container, f"{field or 'value'} {exc}")
    if isinstance(exc, KeyError):
        return _error(where, container, f"missing required key {exc}")
    if isinstance(exc, (TypeError, ValueError)):  # cattrs' own: a list where a mapping goes, ...
        return _error(where, container, f"{field or 'value'}: {exc}")
    return None


def _split_last(path: list[str]) -> tuple[str, str]:
    """``['instance_group', '[0]', '.count']`` -> ``('count', 'instance_group[0]')``."""
    if not path or path[-1].startswith("["):
        return "", "".join(path)
    return path[-1].lstrip("."), "".join(path[:-1])


def _error(where: str, container: str, message: str, hint: str | None = None) -> ConfigError:
    prefix = " ".join(p for p in (where, container) if p)
    return ConfigError(_join(prefix, message), hint=hint)
