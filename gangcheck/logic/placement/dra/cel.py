"""The CEL subset of device selectors: compiled once, evaluated per device (see
`compile_selector`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gangcheck.logic.placement.dra.model import CelError, CelValue, Device, Quantity, Version, _same
from gangcheck.logic.placement.quantity import QuantityError, parse_quantity

# --- CEL -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selector:
    """A compiled CEL device selector; `node` None: outside the subset gangcheck evaluates."""

    expression: str
    node: _Node | None = None

    @property
    def evaluable(self) -> bool:
        return self.node is not None

    @property
    def driver(self) -> str | None:
        """The driver the selector requires (`device.driver == "x"`, at the top level)."""
        return _named_driver(self.node) if self.node is not None else None

    def matches(self, device: Device) -> bool | CelError:
        if self.node is None:
            return CelError("not evaluable")
        value = self.node.eval(device)
        if isinstance(value, CelError) or type(value) is bool:
            return value
        return CelError(f"result is {_type_name(value)}, not bool")


def compile_selector(expression: str) -> Selector:
    """Compile a CEL selector of the subset below; anything else is not evaluable.

    Operands: `device.driver`, `device.allowMultipleAllocations`,
    `device.attributes["domain"].name` (or `["name"]`), `device.capacity["domain"].name` (or
    `["name"]`); literals: strings, integers, `true`, `false`, `quantity("40Gi")`.
    Operators: `==`, `!=` (any values; different types are unequal), `<`, `<=`, `>`, `>=`
    (integers, strings, booleans), `!`, `&&`, `||`, parentheses; `has(device.attributes[
    "domain"].name)` (and capacity); on capacities `.compareTo(quantity(...))` (an integer),
    `.isGreaterThan(...)`, `.isLessThan(...)`. kube-apiserver refuses `<` and friends
    between quantities, so they are not in the subset either.
    """
    try:
        node = _Parser(_tokens(expression)).parse()
    except _Unsupported:
        return Selector(expression)
    return Selector(expression, node)


class _Unsupported(Exception):
    """The expression is outside the evaluated subset."""


_TOKEN = re.compile(
    r"""\s*(?:(?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')"""
    r"|(?P<int>[0-9]+)(?![0-9A-Za-z_.])"
    r"|(?P<op>==|!=|<=|>=|&&|\|\||[<>!.\[\](),-])"
    r"|(?P<ident>[A-Za-z_][A-Za-z0-9_]*))",
    re.ASCII,
)
_ESCAPES = {"\\": "\\", '"': '"', "'": "'", "n": "\n", "t": "\t", "r": "\r"}
_RELATIONS = frozenset({"==", "!=", "<", "<=", ">", ">="})
_QUANTITY_METHODS = frozenset({"compareTo", "isGreaterThan", "isLessThan"})


def _tokens(expression: str) -> list[tuple[str, str]]:
    tokens, position = [], 0
    text = expression.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise _Unsupported
        kind = match.lastgroup or ""
        value = match.group(kind)
        tokens.append((kind, _unescape(value) if kind == "string" else value))
        position = match.end()
    return tokens


def _unescape(literal: str) -> str:
    body, out, index = literal[1:-1], [], 0
    while index < len(body):
        char = body[index]
        if char == "\\":
            escaped = body[index + 1 : index + 2]
            if escaped not in _ESCAPES:
                raise _Unsupported
            out.append(_ESCAPES[escaped])
            index += 2
        else:
            out.append(char)
            index += 1
    return "".join(out)


class _Node:
    def eval(self, device: Device) -> CelValue | CelError:
        raise NotImplementedError


@dataclass(frozen=True)
class _Literal(_Node):
    value: CelValue

    def eval(self, device: Device) -> CelValue | CelError:
        return self.value


@dataclass(frozen=True)
class _Field(_Node):
    """`device.driver` or `device.allowMultipleAllocations`."""

    name: str

    def eval(self, device: Device) -> CelValue | CelError:
        return device.driver if self.name == "driver" else device.multiple


@dataclass(frozen=True)
class _Lookup(_Node):
    """`device.attributes[domain].name` or `device.capacity[domain].name`."""

    capacity: bool
    domain: str
    name: str

    def eval(self, device: Device) -> CelValue | CelError:
        if self.capacity:
            found = device.capacity_of(self.domain, self.name)
            return Quantity(found.value) if found is not None else _no_key(self.name)
        value = device.attribute(self.domain, self.name)
        return value if value is not None else _no_key(self.name)


@dataclass(frozen=True)
class _Has(_Node):
    lookup: _Lookup

    def eval(self, device: Device) -> CelValue | CelError:
        return not isinstance(self.lookup.eval(device), CelError)


@dataclass(frozen=True)
class _Not(_Node):
    operand: _Node

    def eval(self, device: Device) -> CelValue | CelError:
        value = self.operand.eval(device)
        if isinstance(value, CelError):
            return value
        return (not value) if type(value) is bool else _no_overload("!_", value)


@dataclass(frozen=True)
class _Logic(_Node):
    """`&&` (`conjunction`) or `||`, commutative over errors as in CEL."""

    conjunction: bool
    left: _Node
    right: _Node

    def eval(self, device: Device) -> CelValue | CelError:
        decisive = not self.conjunction
        values = [self.left.eval(device), self.right.eval(device)]
        if any(type(v) is bool and v is decisive for v in values):
            return decisive
        for value in values:
            if isinstance(value, CelError):
                return value
            if type(value) is not bool:
                return _no_overload("_&&_" if self.conjunction else "_||_", value)
        return not decisive


@dataclass(frozen=True)
class _Relation(_Node):
    operator: str
    left: _Node
    right: _Node

    def eval(self, device: Device) -> CelValue | CelError:
        both = _operands(device, self.left, self.right)
        if isinstance(both, CelError):
            return both
        left, right = both
        if self.operator in ("==", "!="):
            return _same(left, right) == (self.operator == "==")
        if type(left) is not type(right) or not isinstance(left, bool | int | str):
            return _no_overload(f"_{self.operator}_", left, right)
        return {
            "<": left < right,  # type: ignore[operator]
            "<=": left <= right,  # type: ignore[operator]
            ">": left > right,  # type: ignore[operator]
            ">=": left >= right,  # type: ignore[operator]
        }[self.operator]


@dataclass(frozen=True)
class _Method(_Node):
    """`quantity.compareTo(q)`, `.isGreaterThan(q)`, `.isLessThan(q)`."""

    target: _Node
    method: str
    argument: _Node

    def eval(self, device: Device) -> CelValue | CelError:
        both = _operands(device, self.target, self.argument)
        if isinstance(both, CelError):
            return both
        target, argument = both
        if not isinstance(target, Quantity) or not isinstance(argument, Quantity):
            return _no_overload(self.method, target, argument)
        order = (target.nanos > argument.nanos) - (target.nanos < argument.nanos)
        return {"compareTo": order, "isGreaterThan": order > 0, "isLessThan": order < 0}[
            self.method
        ]


def _operands(device: Device, first: _Node, second: _Node) -> tuple[CelValue, CelValue] | CelError:
    """Both operands of a binary operator, evaluated; the first error, if either fails."""
    one, other = first.eval(device), second.eval(device)
    if isinstance(one, CelError):
        return one
    if isinstance(other, CelError):
        return other
    return one, other


class _Parser:
    """Recursive descent over the subset; raises _Unsupported on anything else."""

    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.index = 0

    def parse(self) -> _Node:
        node = self._or()
        if self.index != len(self.tokens):
            raise _Unsupported
        return node

    def _peek(self) -> str:
        """The next operator, or ""."""
        if self.index < len(self.tokens) and self.tokens[self.index][0] == "op":
            return self.tokens[self.index][1]
        return ""

    def _next(self, kind: str | None = None) -> str:
        if self.index >= len(self.tokens):
            raise _Unsupported
        token_kind, value = self.tokens[self.index]
        if kind is not None and token_kind != kind:
            raise _Unsupported
        self.index += 1
        return value

    def _expect(self, text: str) -> None:
        if self._next() != text:
            raise _Unsupported

    def _take(self, text: str) -> bool:
        if self._peek() == text:
            self.index += 1
            return True
        return False

    def _or(self) -> _Node:
        node = self._and()
        while self._take("||"):
            node = _Logic(False, node, self._and())
        return node

    def _and(self) -> _Node:
        node = self._relation()
        while self._take("&&"):
            node = _Logic(True, node, self._relation())
        return node

    def _relation(self) -> _Node:
        left = self._unary()
        operator = self._peek()
        if operator not in _RELATIONS:
            return left
        self.index += 1
        right = self._unary()
        if _is_quantity(left) or _is_quantity(right) or self._peek() in _RELATIONS:
            raise _Unsupported
        return _Relation(operator, left, right)

    def _unary(self) -> _Node:
        if self._take("!"):
            return _Not(self._unary())
        return self._operand()

    def _operand(self) -> _Node:
        kind, value = self.tokens[self.index] if self.index < len(self.tokens) else ("", "")
        if kind == "string":
            self.index += 1
            return _Literal(value)
        if kind == "int":
            self.index += 1
            return _Literal(int(value))
        if (kind, value) == ("op", "-"):
            self.index += 1
            return _Literal(-int(self._next("int")))
        if (kind, value) == ("op", "("):
            self.index += 1
            node = self._or()
            self._expect(")")
            return node
        if kind != "ident":
            raise _Unsupported
        self.index += 1
        if value in ("true", "false"):
            return _Literal(value == "true")
        if value == "quantity":
            return self._quantity()
        if value == "has":
            self._expect("(")
            lookup = self._device(dotted_only=True)
            self._expect(")")
            if not isinstance(lookup, _Lookup):
                raise _Unsupported
            return _Has(lookup)
        if value == "device":
            return self._methods(self._device_rest(dotted_only=False))
        raise _Unsupported

    def _quantity(self) -> _Literal:
        self._expect("(")
        text = self._next("string")
        self._expect(")")
        try:
            return _Literal(Quantity(parse_quantity(text)))
        except QuantityError as exc:
            raise _Unsupported from exc

    def _device(self, *, dotted_only: bool) -> _Node:
        if self._next("ident") != "device":
            raise _Unsupported
        return self._device_rest(dotted_only=dotted_only)

    def _device_rest(self, *, dotted_only: bool) -> _Node:
        self._expect(".")
        name = self._next("ident")
        if name in ("driver", "allowMultipleAllocations"):
            return _Field(name)
        if name not in ("attributes", "capacity"):
            raise _Unsupported
        self._expect("[")
        domain = self._next("string")
        self._expect("]")
        if self._take("."):
            return _Lookup(name == "capacity", domain, self._next("ident"))
        if dotted_only:
            raise _Unsupported
        self._expect("[")
        key = self._next("string")
        self._expect("]")
        return _Lookup(name == "capacity", domain, key)

    def _methods(self, node: _Node) -> _Node:
        if not (isinstance(node, _Lookup) and node.capacity and self._peek() == "."):
            return node
        self._expect(".")
        method = self._next("ident")
        if method not in _QUANTITY_METHODS:
            raise _Unsupported
        self._expect("(")
        argument = self._operand()
        self._expect(")")
        if not _is_quantity(argument):
            raise _Unsupported
        return _Method(node, method, argument)


def _is_quantity(node: _Node) -> bool:
    return (isinstance(node, _Lookup) and node.capacity) or (
        isinstance(node, _Literal) and isinstance(node.value, Quantity)
    )


def _named_driver(node: _Node) -> str | None:
    if isinstance(node, _Logic) and node.conjunction:
        return _named_driver(node.left) or _named_driver(node.right)
    if isinstance(node, _Relation) and node.operator == "==":
        for one, other in ((node.left, node.right), (node.right, node.left)):
            if one == _Field("driver") and isinstance(other, _Literal):
                return other.value if isinstance(other.value, str) else None
    return None


def _no_key(name: str) -> CelError:
    return CelError(f"no such key: {name}")


def _no_overload(operator: str, *values: CelValue) -> CelError:
    kinds = ", ".join(_type_name(v) for v in values)
    return CelError(f"no matching overload for {operator!r} applied to ({kinds})")


def _type_name(value: CelValue) -> str:
    if type(value) is bool:
        return "bool"
    if isinstance(value, tuple):
        return "list"
    return {int: "int", str: "string", Version: "semver", Quantity: "quantity"}.get(
        type(value), type(value).__name__
    )
