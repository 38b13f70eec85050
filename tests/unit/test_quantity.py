"""Kubernetes quantities parse exactly, into integer nano-units."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gangcheck.logic.placement.quantity import NANO, QuantityError, format_quantity, parse_quantity

GIB = 2**30
PROPERTY = settings(database=None, deadline=None, max_examples=200)


VALID = [
    ("100m", 100_000_000),
    ("1", NANO),
    ("1.5", 1_500_000_000),
    ("2Gi", 2 * GIB * NANO),
    ("500Mi", 500 * 2**20 * NANO),
    ("1e3", 1000 * NANO),
    ("1k", 1000 * NANO),
    ("1M", 10**6 * NANO),
    ("12345", 12345 * NANO),
    ("0.5Gi", GIB // 2 * NANO),
    ("5e-1", NANO // 2),
    ("2E", 2 * 10**18 * NANO),
    ("2E2", 200 * NANO),
    ("3n", 3),
    ("7u", 7000),
    ("0.1n", 1),
    ("-0.1n", -1),
    ("+1", NANO),
    ("-250m", -250_000_000),
    ("1.", NANO),
    (".5", NANO // 2),
    ("0Gi", 0),
    ("1e+2", 100 * NANO),
    (4, 4 * NANO),
    (0.25, NANO // 4),
    (" 1 ", NANO),
    ("16Ei", (2**63 - 1) * NANO),
]
VALID_IDS = [
    "millicores are thousandths of a unit",
    "a bare integer is whole units",
    "a decimal fraction is exact",
    "Gi is a power of 1024",
    "Mi is a power of 1024",
    "a decimal exponent multiplies by a power of ten",
    "k is a thousand",
    "M is a million",
    "a large plain integer is exact",
    "a fraction of a Gi is exact",
    "a negative exponent divides",
    "capital E alone is exa",
    "capital E followed by digits is an exponent",
    "n is nano",
    "u is micro",
    "less than a nano-unit rounds up to one",
    "negative amounts round away from zero",
    "a leading plus sign is allowed",
    "a leading minus sign makes it negative",
    "a trailing dot is allowed as the API server allows it",
    "a leading dot is allowed",
    "zero with a suffix is zero",
    "an exponent may carry a plus sign",
    "a JSON integer reads as its text",
    "a JSON float reads as its text",
    "surrounding whitespace is trimmed as JSON decoding does",
    "binary values past 2^63-1 are capped there",
]


@pytest.mark.parametrize(("text", "nanos"), VALID, ids=VALID_IDS)
def test_valid_quantities_parse_exactly(text: str | int | float, nanos: int) -> None:
    assert parse_quantity(text) == nanos


INVALID: list[object] = [
    "abc",
    "1.2.3",
    "",
    "1Xi",
    "1e",
    "1 Gi",
    "1ki",
    "1K",
    "Gi",
    ".",
    "-",
    "1e1.5",
    "1mm",
    "1Mi1",
    "0x10",
    "1_000",
    "\u0661",
    "1e400",
    "1" * 400,
    True,
    None,
    [1],
]
INVALID_IDS = [
    "letters are not a quantity",
    "two decimal points are malformed",
    "the empty string is malformed",
    "an unknown binary suffix is malformed",
    "e without an exponent is malformed",
    "a space before the suffix is malformed",
    "lowercase ki is not a binary suffix",
    "uppercase K is not a decimal suffix",
    "a suffix without a number is malformed",
    "a lone dot is malformed",
    "a lone sign is malformed",
    "a fractional exponent is malformed",
    "a doubled suffix is malformed",
    "digits after a suffix are malformed",
    "hex is malformed",
    "digit separators are malformed",
    "non-ASCII digits are malformed",
    "an exponent beyond the limit is refused",
    "more digits than the limit are refused",
    "a boolean is not a quantity",
    "null is not a quantity",
    "a list is not a quantity",
]


@pytest.mark.parametrize("text", INVALID, ids=INVALID_IDS)
def test_malformed_quantities_raise_quantity_error(text: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)  # type: ignore[arg-type]


def test_quantity_error_quotes_the_input() -> None:
    with pytest.raises(QuantityError, match="'1Xi'"):
        parse_quantity("1Xi")


FORMATS = [
    (parse_quantity("8"), False, "8"),
    (parse_quantity("500m"), False, "500m"),
    (parse_quantity("3Gi"), True, "3Gi"),
    (parse_quantity("1536Mi"), True, "1536Mi"),
    (parse_quantity("2G"), True, "2G"),
    (parse_quantity("1000"), False, "1k"),
    (parse_quantity("-1.5"), False, "-1500m"),
    (0, True, "0"),
    (7, False, "7n"),
]
FORMAT_IDS = [
    "whole units print plainly",
    "fractions print in milli",
    "bytes print in the largest exact binary suffix",
    "bytes not a whole Gi print in Mi",
    "bytes with no exact binary suffix print in decimal",
    "a thousand prints as k",
    "negative fractions keep their sign",
    "zero is zero",
    "nano-units print with n",
]


@pytest.mark.parametrize(("nanos", "binary", "text"), FORMATS, ids=FORMAT_IDS)
def test_format_quantity_is_short_and_exact(nanos: int, binary: bool, text: str) -> None:
    assert format_quantity(nanos, binary=binary) == text


# --- properties ------------------------------------------------------------------------------

decimals = st.decimals(
    min_value=Decimal(-(10**15)),
    max_value=Decimal(10**15),
    allow_nan=False,
    allow_infinity=False,
    places=12,
)


def _expected_nanos(value: Decimal) -> int:
    """Independent oracle: the exact value in nano-units, rounded away from zero."""
    exact = abs(Fraction(value)) * NANO
    magnitude = -(-exact.numerator // exact.denominator)
    return -magnitude if value < 0 else magnitude


@PROPERTY
@given(decimals)
def test_any_decimal_text_parses_to_its_exact_value(value: Decimal) -> None:
    assert parse_quantity(str(value)) == _expected_nanos(value)


@PROPERTY
@given(decimals, decimals)
def test_parsing_preserves_order(a: Decimal, b: Decimal) -> None:
    low, high = sorted((a, b))
    assert parse_quantity(str(low)) <= parse_quantity(str(high))


@PROPERTY
@given(st.integers(min_value=-(10**30), max_value=10**30), st.booleans())
def test_formatted_quantities_parse_back_to_the_same_value(nanos: int, binary: bool) -> None:
    assert parse_quantity(format_quantity(nanos, binary=binary)) == nanos


@PROPERTY
@given(
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from([("Ki", 1), ("Mi", 2), ("Gi", 3), ("Ti", 4)]),
)
def test_binary_suffixes_are_powers_of_1024(n: int, suffix: tuple[str, int]) -> None:
    name, power = suffix
    assert parse_quantity(f"{n}{name}") == parse_quantity(str(n * 1024**power))


@PROPERTY
@given(st.integers(min_value=0, max_value=10**9))
def test_decimal_suffixes_exponents_and_millis_agree(n: int) -> None:
    assert parse_quantity(f"{n}k") == parse_quantity(f"{n}000") == parse_quantity(f"{n}e3")
    assert parse_quantity(f"{n}M") == parse_quantity(f"{n}E6") == n * 10**6 * NANO
    assert parse_quantity(f"{n * 1000}m") == parse_quantity(str(n))
    assert parse_quantity("1Ki") == parse_quantity("1024")


@PROPERTY
@given(st.text(alphabet="0123456789.+-eEinumkKMGTP x", max_size=12))
def test_any_text_either_parses_or_raises_quantity_error(text: str) -> None:
    try:
        value = parse_quantity(text)
    except QuantityError:
        return
    assert isinstance(value, int)
