"""Allocation: a member's claims from the devices one node reaches, given what is in use
(see the package doc)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gangcheck.logic.placement.dra.cel import Selector
from gangcheck.logic.placement.dra.model import (
    ALL,
    BLOCKING_TAINT_EFFECTS,
    MAX_CONSTRAINT_CHOICES,
    AttributeValue,
    CelError,
    Claim,
    ClaimNeeds,
    CounterSetId,
    Device,
    DeviceClass,
    DeviceId,
    Inventory,
    NodeDevices,
    Request,
    Scalar,
    Shortfall,
    Usage,
    _base,
    _fatal,
    _not_evaluable,
    _plural,
    _quoted,
    _same,
    _scalars,
    _short_expression,
    _where,
)


@dataclass(frozen=True)
class DeviceRoom:
    """A node's devices and what is in use: what is left once one more member is placed."""

    devices: NodeDevices
    usage: Usage

    def take(self, needs: ClaimNeeds) -> DeviceRoom | Shortfall:
        outcome = allocate(needs, self.devices, self.usage)
        return outcome if isinstance(outcome, Shortfall) else DeviceRoom(self.devices, outcome)


# --- allocation ------------------------------------------------------------------------------


def allocate(needs: ClaimNeeds, devices: NodeDevices, usage: Usage) -> Usage | Shortfall:
    """What is in use once one member with `needs` is placed on `devices`' node, or why it
    cannot be (see the module doc for how devices are chosen)."""
    if needs.problem is not None:
        return needs.problem
    for shared in needs.shared:
        if not devices.reaches(shared.scope):
            return Shortfall(
                f"claim {_quoted(shared.name)}: allocated ResourceClaim "
                f"{_quoted(shared.claim)} is not usable on this node"
            )
    ledger = _Ledger(devices.inventory, usage)
    for claim in needs.claims:
        outcome = _allocate_claim(claim, devices, ledger)
        if isinstance(outcome, Shortfall):
            return outcome
        ledger = outcome
    return ledger.freeze()


def most_members(needs: ClaimNeeds, devices: NodeDevices, usage: Usage) -> int | None:
    """At most how many members with `needs` the node's free devices could serve, each taking
    its fewest devices (distinct, and not in use before); None when that bounds nothing: a
    device there allows multiple allocations, or a member may take none."""
    fewest = sum(
        min((0 if alt.admin else 1 if alt.mode == ALL else alt.count) for alt in alts)
        for claim in needs.claims
        for alts in claim.requests
        if alts
    )
    if fewest <= 0 or any(device.multiple for device in devices.devices):
        return None
    free = sum(1 for d in devices.devices if d.id not in usage.taken and d.id not in usage.shared)
    return free // fewest


class _Ledger:
    """What is in use while one member's claims are allocated: the Usage it started from,
    untouched, and what this allocation added (copied cheaply when a choice is tried)."""

    def __init__(self, inventory: Inventory, usage: Usage) -> None:
        self.inventory = inventory
        self.base = usage
        self.taken: set[DeviceId] = set()
        self.shared: dict[DeviceId, dict[str, int]] = {}
        """Capacity consumed on the devices this allocation touched (totals, base included)."""
        self.counters: dict[CounterSetId, dict[str, int]] = {}
        """Counters consumed in the sets this allocation touched (totals, base included)."""
        self.claimed: set[DeviceId] = set()

    def copy(self) -> _Ledger:
        other = _Ledger(self.inventory, self.base)
        other.taken = set(self.taken)
        other.shared = {k: dict(v) for k, v in self.shared.items()}
        other.counters = {k: dict(v) for k, v in self.counters.items()}
        other.claimed = set(self.claimed)
        return other

    def freeze(self) -> Usage:
        """The usage now: the base with this allocation's additions."""
        base = self.base
        return Usage(
            base.taken | self.taken if self.taken else base.taken,
            {**base.shared, **self.shared} if self.shared else base.shared,
            {**base.counters, **self.counters} if self.counters else base.counters,
        )

    def _is_taken(self, device: Device) -> bool:
        return device.id in self.taken or device.id in self.base.taken

    def _is_shared(self, device: Device) -> bool:
        return device.id in self.shared or device.id in self.base.shared

    def _spent(self, device: Device) -> Mapping[str, int]:
        found = self.shared.get(device.id)
        return found if found is not None else self.base.shared.get(device.id, {})

    def _used(self, set_id: CounterSetId) -> Mapping[str, int]:
        found = self.counters.get(set_id)
        return found if found is not None else self.base.counters.get(set_id, {})

    def in_use(self, device: Device) -> bool:
        return self._is_taken(device) or self._is_shared(device)

    def available(self, device: Device, request: Request) -> bool:
        """Usable by `request`: not in this claim yet, and unused or allowing more allocations
        (admin access ignores other claims)."""
        if device.id in self.claimed:
            return False
        if request.admin:
            return True
        if self._is_taken(device):
            return False
        return device.multiple or not self._is_shared(device)

    def counters_left(self, device: Device) -> bool:
        if device.multiple and self._is_shared(device):
            return True  # counted when it was first allocated
        for set_name, needed in device.consumes.items():
            set_id = (device.driver, device.pool, set_name)
            total = self.inventory.counter_total(set_id)
            used = self._used(set_id)
            if any(total.get(c, 0) - used.get(c, 0) < v for c, v in needed.items()):
                return False
        return True

    def capacity_left(self, device: Device, consumed: Mapping[str, int]) -> bool:
        spent = self._spent(device) if device.multiple else {}
        return all(
            spent.get(name, 0) + amount <= device.capacity[name].value
            for name, amount in consumed.items()
        )

    def use(
        self, device: Device, consumed: Mapping[str, int], *, shared: bool, claim: bool = False
    ) -> None:
        if not self.in_use(device):
            for set_name, needed in device.consumes.items():
                set_id = (device.driver, device.pool, set_name)
                used = self.counters.setdefault(set_id, dict(self._used(set_id)))
                for counter, value in needed.items():
                    used[counter] = used.get(counter, 0) + value
        if shared:
            spent = self.shared.setdefault(device.id, dict(self._spent(device)))
            for name, amount in consumed.items():
                spent[name] = spent.get(name, 0) + amount
        else:
            self.taken.add(device.id)
        if claim:
            self.claimed.add(device.id)


def _allocate_claim(claim: Claim, devices: NodeDevices, ledger: _Ledger) -> _Ledger | Shortfall:
    choices = _constraint_choices(claim, devices)
    if isinstance(choices, Shortfall):
        return choices
    first: Shortfall | None = None
    for choice in choices:
        run = _ClaimRun(claim, devices, choice, ledger.copy())
        run.ledger.claimed = set()
        outcome = run.allocate()
        if outcome is None:
            return run.ledger
        if outcome.fatal:
            return outcome
        first = first or outcome
    assert first is not None
    return first


def _constraint_choices(
    claim: Claim, devices: NodeDevices
) -> list[tuple[Scalar | None, ...]] | Shortfall:
    """One value per `matchAttribute` constraint (None for distinct ones), combinations in
    device order; a Shortfall when no device of the node has a matched attribute."""
    options: list[list[Scalar | None]] = []
    for constraint in claim.constraints:
        if constraint.distinct:
            options.append([None])
            continue
        values: list[Scalar | None] = []
        for device in devices.devices:
            for value in _scalars(device.attributes.get(constraint.attribute)):
                if not any(_same(value, v) for v in values):
                    values.append(value)
        if not values:
            return Shortfall(
                f"claim {_quoted(claim.name)}: no device of the node has attribute "
                f"{_quoted(constraint.attribute)} (matchAttribute)"
            )
        options.append(values)
    return list(itertools.islice(itertools.product(*options), MAX_CONSTRAINT_CHOICES))


class _ClaimRun:
    """One claim allocated on one node, for one choice of `matchAttribute` values."""

    def __init__(
        self,
        claim: Claim,
        devices: NodeDevices,
        choice: tuple[Scalar | None, ...],
        ledger: _Ledger,
    ) -> None:
        self.claim, self.devices, self.choice, self.ledger = claim, devices, choice, ledger
        self.seen: dict[int, list[AttributeValue]] = {}
        """Values taken so far, per `distinctAttribute` constraint."""

    def allocate(self) -> Shortfall | None:
        """Every request of the claim into `ledger` (None), or why not."""
        for alternatives in self.claim.requests:
            failures: list[Shortfall] = []
            for request in alternatives:
                ledger, seen = self.ledger, self.seen
                self.ledger, self.seen = ledger.copy(), {k: list(v) for k, v in seen.items()}
                outcome = self._request(request)
                if outcome is None:
                    break
                self.ledger, self.seen = ledger, seen
                if outcome.fatal:
                    return outcome
                failures.append(outcome)
            else:
                return self._no_alternative(alternatives, failures)
        return None

    def _no_alternative(
        self, alternatives: Sequence[Request], failures: Sequence[Shortfall]
    ) -> Shortfall:
        if len(failures) == 1:
            return failures[0]
        parent = _where(self.claim.name, _base(alternatives[0].name))
        return Shortfall(
            f"{parent}: no subrequest can be satisfied",
            f"{parent}: no subrequest can be satisfied ({'; '.join(map(str, failures))})",
        )

    def _request(self, request: Request) -> Shortfall | None:
        where = _where(self.claim.name, request.name)
        device_class = self.devices.inventory.classes.get(request.device_class)
        if device_class is None:
            return _fatal(f"{where}: DeviceClass {_quoted(request.device_class)} not found")
        for selector in device_class.selectors:
            if not selector.evaluable:
                owner = (
                    f"claim {_quoted(self.claim.name)}: DeviceClass {_quoted(device_class.name)}"
                )
                return _not_evaluable(owner, selector.expression)
        if request.mode == ALL:
            return self._all(request, device_class, where)
        kind = f"class {_quoted(request.device_class)}"
        got = 0
        for device in self.devices.devices:
            if got == request.count:
                break
            if not self.ledger.available(device, request):
                continue  # kube-scheduler checks this first, selectors next
            selected = _selected(self.devices.inventory, device, device_class, request)
            if isinstance(selected, CelError):
                return _cel_failure(where, device, selected)
            consumed = self._qualifies(request, device) if selected else None
            if consumed is not None:
                self._take(request, device, consumed)
                got += 1
        if got < request.count:
            return Shortfall(
                f"{where}: too few free devices of {kind}",
                f"{where}: {_plural(request.count, 'device')} of {kind} needed, {got} free",
            )
        return None

    def _all(self, request: Request, device_class: DeviceClass, where: str) -> Shortfall | None:
        kind = f"class {_quoted(request.device_class)}"
        if self.devices.pending:
            pool = _quoted(self.devices.pending[0])
            text = f"{where}: all devices of {kind} needed, pool {pool} is being updated or invalid"
            return Shortfall(text)
        matching = []
        for device in self.devices.devices:
            selected = _selected(self.devices.inventory, device, device_class, request)
            if isinstance(selected, CelError):
                return _cel_failure(where, device, selected)
            if selected and _consumption(device, request) is not None:
                matching.append(device)
        if not matching:
            return Shortfall(f"{where}: all devices of {kind} needed, none on the node")
        free = 0
        for device in matching:
            available = self.ledger.available(device, request)
            consumed = self._qualifies(request, device) if available else None
            if consumed is not None:
                self._take(request, device, consumed)
                free += 1
        if free < len(matching):
            return Shortfall(
                f"{where}: not all devices of {kind} are free",
                f"{where}: all {_plural(len(matching), 'device')} of {kind} needed, {free} free",
            )
        return None

    def _qualifies(self, request: Request, device: Device) -> dict[str, int] | None:
        """What `device` would consume for `request`, or None when it does not qualify:
        taints, constraints, capacity, counters (selectors and use are checked before)."""
        for taint in device.taints:
            if taint.effect in BLOCKING_TAINT_EFFECTS and not any(
                t.tolerates(taint) for t in request.tolerations
            ):
                return None
        for index, constraint in enumerate(self.claim.constraints):
            if not constraint.covers(request.name):
                continue
            value = device.attributes.get(constraint.attribute)
            if value is None:
                return None
            if constraint.distinct:
                if any(_same(value, v) for v in self.seen.get(index, [])):
                    return None
            elif not any(_same(self.choice[index], v) for v in _scalars(value)):
                return None
        consumed = _consumption(device, request)
        if consumed is None or not self.ledger.capacity_left(device, consumed):
            return None
        return consumed if self.ledger.counters_left(device) else None

    def _take(self, request: Request, device: Device, consumed: Mapping[str, int]) -> None:
        for index, constraint in enumerate(self.claim.constraints):
            value = device.attributes.get(constraint.attribute)
            if constraint.distinct and constraint.covers(request.name) and value is not None:
                self.seen.setdefault(index, []).append(value)
        if request.admin:
            self.ledger.claimed.add(device.id)
        else:
            self.ledger.use(device, consumed, shared=device.multiple, claim=True)


def _selected(
    inventory: Inventory, device: Device, device_class: DeviceClass, request: Request
) -> bool | CelError:
    """Whether the class's, then the request's, selectors hold (memoised per inventory)."""
    key = (device.id, device_class.name, tuple(s.expression for s in request.selectors))
    if key not in inventory._matches:
        inventory._matches[key] = _evaluate(device, (*device_class.selectors, *request.selectors))
    return inventory._matches[key]


def _cel_failure(where: str, device: Device, error: CelError) -> Shortfall:
    return Shortfall(
        f"{where}: CEL selector fails: {error.message}",
        f"{where}: CEL selector fails on device {_quoted(device)}: {error.message}",
        fatal=True,
    )


def _evaluate(device: Device, selectors: Sequence[Selector]) -> bool | CelError:
    for selector in selectors:
        outcome = selector.matches(device)
        if isinstance(outcome, CelError):
            return CelError(f"{outcome.message} (in {_short_expression(selector.expression)})")
        if not outcome:
            return False
    return True


def _consumption(device: Device, request: Request) -> dict[str, int] | None:
    """Capacity one allocation of `request` consumes on `device`; None if it cannot have it."""
    if any(name not in device.capacity for name in request.capacity):
        return None
    consumed = {}
    for name, capacity in device.capacity.items():
        amount = capacity.consumed(request.capacity.get(name))
        if amount is None or amount > capacity.value:
            return None
        consumed[name] = amount
    return consumed
