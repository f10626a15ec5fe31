"""Ranges and allowed values as data on the schema's fields, and the one checker that reads them.

A field of a config dataclass says what it accepts in its annotation:
``k1: Annotated[float, AT_LEAST_0] = 1.5`` or ``method: Annotated[str, OneOf("a", "b")] = "a"``.
:func:`check_ranges` walks a config (dataclasses, lists and mappings of them) and raises one
:class:`ConfigError` line naming the setting, the value and what it must be. A bound on a
list or a mapping applies to each of its items. Every float must be finite.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Annotated, Any

from rag_ablate.core.errors import ConfigError


@dataclass(frozen=True)
class Range:
    """A closed or open interval; ``None`` is unbounded on that side."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        def num(x: float) -> str:
            return str(int(x)) if float(x).is_integer() else str(x)

        if self.high is None and self.low is not None:
            return f"{'>' if self.low_open else '>='} {num(self.low)}"
        if self.low is None and self.high is not None:
            return f"{'<' if self.high_open else '<='} {num(self.high)}"
        if self.low is None or self.high is None:
            return "a finite number"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"in {left}{num(self.low)}, {num(self.high)}{right}"

    def outside(self) -> float:
        """A value this range refuses (the tests' out-of-range probe)."""
        if self.low is not None:
            return self.low if self.low_open else self.low - 1
        if self.high is None:
            return math.inf
        return self.high if self.high_open else self.high + 1


@dataclass(frozen=True)
class OneOf:
    """A string setting with a fixed set of values."""

    values: tuple[str, ...]

    def __init__(self, *values: str) -> None:
        object.__setattr__(self, "values", values)

    def __contains__(self, value: object) -> bool:
        return value in self.values

    def __str__(self) -> str:
        return "one of " + " | ".join(self.values)


Bound = Range | OneOf

AT_LEAST_0 = Range(0)
AT_LEAST_1 = Range(1)
POSITIVE = Range(0, low_open=True)
SHARE = Range(0, 1)  # a probability or a share, both ends included
OPEN_SHARE = Range(0, 1, low_open=True, high_open=True)
FINITE = Range()  # any finite number

# the common annotations, short enough for a field's line
Count = Annotated[int, AT_LEAST_1]  # a number of things, at least one
Count0 = Annotated[int, AT_LEAST_0]  # a number of things, zero allowed (retries, ...)
NonNeg = Annotated[float, AT_LEAST_0]  # a weight, a price, a delay
Positive = Annotated[float, POSITIVE]  # a timeout, a constant that divides
Share = Annotated[float, SHARE]  # a probability or a share in [0, 1]


def bounds(cls: type) -> dict[str, Bound]:
    """The bound each field of the dataclass ``cls`` declares in its annotation (if it declares one)."""
    out: dict[str, Bound] = {}
    for name, hint in typing.get_type_hints(cls, include_extras=True).items():
        if typing.get_origin(hint) is typing.Annotated:
            found = [m for m in hint.__metadata__ if isinstance(m, (Range, OneOf))]
            if found:
                out[name] = found[0]
    return out


def _items(value: Any, key: str) -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [(f"{key}.{k}", v) for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [(f"{key}[{i}]", v) for i, v in enumerate(value)]
    return [(key, value)]


def check_ranges(config: Any, prefix: str) -> None:
    """Raise ConfigError for the first value of ``config`` (a dataclass; its full key ``prefix``)
    outside the bound its field declares, in field order, nested configs included."""
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        return
    limits = bounds(type(config))
    for f in dataclasses.fields(config):
        key = f"{prefix}.{f.name}" if prefix else f.name
        value = getattr(config, f.name)
        bound = limits.get(f.name)
        for item_key, item in _items(value, key):
            if dataclasses.is_dataclass(item):
                check_ranges(item, item_key)
            elif bound is not None and item is not None and item not in bound:
                shown = f"'{item}'" if isinstance(item, str) else item
                raise ConfigError(f"{item_key} must be {bound}, got {shown}")
