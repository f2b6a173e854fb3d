"""One command-line flag tied to one config field, readable both ways.

An :class:`Option` holds a flag's spellings, the config field it fills, its help, its argparse
settings and how the flag's text becomes the field's value (``value``), and back (``text`` and
:meth:`Option.to_args`). The CLI adds options to parsers (:mod:`streamrt.cli.args`); the builder
turns a config back into the flags that rebuild it (:func:`streamrt.building.flags.build_flags`),
from the same table, so a new option cannot be forgotten on either side.

Example:
    >>> Option("workers", ("--workers",), "lanes", {"type": int}).to_args(2)
    ['--workers', '2']
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Option", "number_text"]


def number_text(value: float) -> str:
    """A number as short text that parses back to the same float (``300.0`` -> ``'300'``)."""
    short = f"{value:g}"
    return short if float(short) == value else repr(float(value))


def _plain(value: Any) -> str:
    return str(getattr(value, "value", value))  # an Enum member as its value ("fp16"), else str()


@dataclass(frozen=True)
class Option:
    """One flag: its spellings, the config field it fills, its help and argparse settings.

    ``value`` turns what argparse parsed into the field's value (``--no-keep-io-types`` -> False);
    a flag that was not given leaves the field alone (its default is None in argparse). ``text``
    is the inverse for flags that take an argument: the field's value as that argument (for an
    ``append`` flag, one argument per occurrence); the default writes enums by value, else ``str``.
    ``shown``: a rebuild command writes the flag even at its default (``--backend``).
    """

    field: str
    flags: tuple[str, ...]
    help: str
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    value: Callable[[Any], Any] = lambda v: v
    per_side: bool = False  # copied as --<prefix>flag by prefixed groups
    text: Callable[[Any], str | Sequence[str]] | None = None
    shown: bool = False

    def spellings(self, prefix: str) -> list[str]:
        return [f"--{prefix}{f[2:]}" for f in self.flags if f.startswith("--")] if prefix else list(self.flags)

    def to_args(self, value: Any) -> list[str]:
        """The command-line words that set the field to ``value``: parsing them gives ``value`` back.

        A ``store_true`` flag is written when ``value`` is what it sets (``--no-speed-check`` for
        ``speed_check=False``), else nothing; a ``--x/--no-x`` flag as one of its spellings; an
        ``append`` flag once per item of ``text(value)``.
        """
        flag = self.flags[0]
        action = self.kwargs.get("action")
        if action == "store_true":
            return [flag] if value == self.value(True) else []
        if action is argparse.BooleanOptionalAction:
            return [] if value is None else [flag if value else f"--no-{flag[2:]}"]
        if action == "append":
            items = self.text(value) if self.text is not None else [_plain(v) for v in value]
            return [word for item in items for word in (flag, item)]
        text = self.text(value) if self.text is not None else _plain(value)
        assert isinstance(text, str), f"{flag}: text() of a one-argument flag must be one string"
        return [flag, text]
