"""Kubernetes resource quantities (`100m`, `1.5`, `2Gi`, `1e3`), parsed exactly.

A quantity is held as an integer count of nano-units: `parse_quantity("1") == 1_000_000_000`,
`parse_quantity("100m") == 100_000_000`, `parse_quantity("1Ki") == 1024 * NANO`. Nano is
the finest precision Kubernetes keeps, so integers are exact and cheap to add and compare
whatever the resource (cpu, bytes of memory, GPUs, pods).

As the API server does (`k8s.io/apimachinery/pkg/api/resource.ParseQuantity`), a non-zero
value finer than a nano-unit is rounded up, away from zero ("if you want some resources, you
should get some"), and a binary-suffixed value above 2^63-1 is capped there. Two limits of
our own keep a hostile string from costing memory: at most `MAX_DIGITS` digits and a decimal
exponent within ±`MAX_EXPONENT`; beyond those the string is refused as malformed.
"""

from __future__ import annotations

import re

NANO = 10**9
MAX_DIGITS = 300
MAX_EXPONENT = 300
_MAX_INT64 = 2**63 - 1

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_DOWN = sorted(_BINARY.items(), key=lambda item: -item[1])
_DECIMAL_DOWN = [(s, p) for s, p in sorted(_DECIMAL.items(), key=lambda item: -item[1]) if p > 0]
_SYNTAX = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?(.*)", re.ASCII | re.DOTALL)
_EXPONENT = re.compile(r"[eE]([+-]?[0-9]+)", re.ASCII)


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity; the message quotes it."""


def parse_quantity(text: str | int | float) -> int:
    """The quantity `text` in nano-units; raises QuantityError when malformed.

    Plain JSON numbers are accepted as their text, as the API server accepts them.
    """
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise QuantityError(f"quantity must be a string, not {type(text).__name__}: {text!r}")
    raw = str(text).strip()
    match = _SYNTAX.fullmatch(raw)
    if match is None or not (match[2] or match[3]):
        raise QuantityError(f"malformed quantity {raw!r}: no digits")
    sign, whole, frac, suffix = match[1], match[2], match[3] or "", match[4]
    if len(whole) + len(frac) > MAX_DIGITS:
        raise QuantityError(f"malformed quantity {raw[:40]!r}...: too many digits")
    binary, power = _multiplier(raw, suffix)
    nanos = _scaled(int(whole + frac) * 1024**binary, power + 9 - len(frac))
    if suffix in _BINARY:
        nanos = min(nanos, _MAX_INT64 * NANO)
    return -nanos if sign == "-" else nanos


def _multiplier(raw: str, suffix: str) -> tuple[int, int]:
    """The suffix as (power of 1024, power of 10)."""
    if suffix in _BINARY:
        return _BINARY[suffix], 0
    if suffix in _DECIMAL:
        return 0, _DECIMAL[suffix]
    exponent = _EXPONENT.fullmatch(suffix)
    if exponent is None:
        raise QuantityError(f"malformed quantity {raw!r}: unknown suffix {suffix!r}")
    power = int(exponent[1])
    if abs(power) > MAX_EXPONENT:
        raise QuantityError(f"malformed quantity {raw!r}: exponent out of range")
    return 0, power


def _scaled(value: int, power: int) -> int:
    """value * 10**power, rounded up: integer arithmetic only."""
    scale: int = 10 ** abs(power)
    return value * scale if power >= 0 else -(-value // scale)


def format_resource(resource: str, nanos: int) -> str:
    """`format_quantity` with the suffixes the resource is written in: binary for bytes."""
    binary = resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-")
    return format_quantity(nanos, binary=binary)


def format_quantity(nanos: int, *, binary: bool = False) -> str:
    """A short exact text for `nanos` that parse_quantity reads back to the same value.

    Whole values take the largest suffix that keeps an integer mantissa, binary or decimal
    (binary preferred at equal length when `binary`, as for bytes); fractions take m, u or n.
    """
    if nanos < 0:
        return "-" + format_quantity(-nanos, binary=binary)
    if nanos == 0:
        return "0"
    if nanos % NANO == 0:
        return _format_whole(nanos // NANO, binary=binary)
    for suffix, scale in (("m", 10**6), ("u", 10**3)):
        if nanos % scale == 0:
            return f"{nanos // scale}{suffix}"
    return f"{nanos}n"


def _format_whole(value: int, *, binary: bool) -> str:
    decimal = next(
        (f"{value // 10**p}{s}" for s, p in _DECIMAL_DOWN if value % 10**p == 0), str(value)
    )
    if not binary:
        return decimal
    exact = (f"{value // 1024**p}{s}" for s, p in _BINARY_DOWN if value % 1024**p == 0)
    return min(next(exact, decimal), decimal, key=len)
