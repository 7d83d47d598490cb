"""topocoll's own environment variables, each read by one ``Setting`` of its kind: on/off
(``flag``), a positive number (``number``, ``count``), a byte count (``byte_count``) or one of
named choices (``choice``). A malformed value raises ValueError naming the variable, the value
and what it accepts (docs/environment.md lists them all).

Where a value is read at import or during ``init``'s collective set-up, raising would leave
that rank alone while its peers wait; such reads take ``or_default`` (or ``at_import``, which
also keeps the problem): the default stands in. ``init`` reads every setting strictly (``problems``) and tells the
problems found to every rank, so all raise the same clear error.
"""
from __future__ import annotations

import math
import os
from typing import Callable, Generic, Mapping, TypeVar

T = TypeVar("T")

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")

_SETTINGS: dict[str, "Setting"] = {}
"""Every setting defined, by name (``problems`` reads each one)."""
_recorded: dict[str, str] = {}
"""Problems ``at_import`` met, by variable name."""


class Setting(Generic[T]):
    """One ``TOPOCOLL_*`` variable: unset or empty gives ``default``; else ``parse`` of the
    stripped text, ValueError (naming the variable and ``accepts``) where it raises one."""

    def __init__(self, name: str, default: T, parse: Callable[[str], T], accepts: str,
                 verdict: str = "must be") -> None:
        self.name, self.default, self._parse, self.accepts = name, default, parse, accepts
        self._verdict = verdict
        _SETTINGS[name] = self

    def is_set(self) -> bool:
        """Whether the variable is set to something other than blanks."""
        return bool(os.environ.get(self.name, "").strip())

    def get(self) -> T:
        """The value now (ValueError naming the variable where it is malformed)."""
        raw = os.environ.get(self.name, "")
        if not raw.strip():
            return self.default
        try:
            return self._parse(raw.strip())
        except ValueError:
            raise ValueError(f"{self.name}={raw!r} {self._verdict} {self.accepts}") from None

    def or_default(self) -> T:
        """``get``'s value, or the default where it is malformed: for reads during ``init``'s
        collective set-up, where ``init`` raises the problem afterwards on every rank."""
        try:
            return self.get()
        except ValueError:
            return self.default

    def at_import(self) -> T:
        """``or_default`` for a value read once, at import: the problem is kept, and ``init``
        raises it on every rank even if the variable changed since."""
        try:
            return self.get()
        except ValueError as err:
            _recorded[self.name] = str(err)
            return self.default


def flag(name: str, default: bool) -> Setting[bool]:
    """On or off: 1, true, yes, on or 0, false, no, off (any case)."""
    def parse(text: str) -> bool:
        low = text.lower()
        if low in ON or low in OFF:
            return low in ON
        raise ValueError(text)
    return Setting(name, default, parse, "1 (true, yes, on) or 0 (false, no, off)")


def number(name: str, default: float, unit: str, zero: bool = False) -> Setting[float]:
    """A finite number of ``unit`` above 0 (0 too with ``zero``)."""
    def parse(text: str) -> float:
        value = float(text)
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            raise ValueError(text)
        return value
    return Setting(name, default, parse,
                   f"a {'' if zero else 'positive '}number of {unit}"
                   + (" (0 or more)" if zero else ""))


def count(name: str, default: int, what: str) -> Setting[int]:
    """A whole number, 1 or more."""
    def parse(text: str) -> int:
        value = int(text)
        if value < 1:
            raise ValueError(text)
        return value
    return Setting(name, default, parse, f"a whole number of {what}, 1 or more")


def byte_count(name: str, default: T, minimum: int = 0, multiple: int = 1) -> Setting:
    """A whole number of bytes, at least ``minimum`` and a multiple of ``multiple``."""
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum or value % multiple:
            raise ValueError(text)
        return value
    return Setting(name, default, parse,
                   f"a number of bytes, {minimum} or more"
                   + (f" and a multiple of {multiple}" if multiple > 1 else ""))


def choice(name: str, default: T, choices: Mapping[str, T], accepts: str = "",
           verdict: str = "must be") -> Setting[T]:
    """One of ``choices``' keys (matched case-insensitively), read as its value."""
    folded = {k.lower(): v for k, v in choices.items()}

    def parse(text: str) -> T:
        return folded[text.lower()] if text.lower() in folded else _no(text)
    return Setting(name, default, parse, accepts or f"one of {', '.join(choices)}", verdict)


def _no(text: str) -> T:  # type: ignore[type-var]
    raise ValueError(text)


def problems() -> list[str]:
    """Every malformed setting: each defined setting read strictly, and what ``at_import`` met
    (a value read at import that has changed since still counts)."""
    found = dict(_recorded)
    for name, setting in _SETTINGS.items():
        try:
            setting.get()
        except ValueError as err:
            found.setdefault(name, str(err))
    return list(found.values())
