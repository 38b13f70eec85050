"""The inventory: ResourceSlices, DeviceClasses and allocated ResourceClaims read into
pools of devices and what is in use."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from gangcheck.logic.placement.dra.allocation import _Ledger
from gangcheck.logic.placement.dra.cel import compile_selector
from gangcheck.logic.placement.dra.model import (
    AttributeValue,
    Device,
    DeviceCapacity,
    DeviceClass,
    Inventory,
    NodeScope,
    Pool,
    Problem,
    Usage,
    Version,
    _expressions,
    _int,
    _quoted,
)
from gangcheck.logic.placement.quantity import QuantityError, parse_quantity
from gangcheck.logic.placement.raw import dict_at, list_at
from gangcheck.logic.placement.taints import taint_of
from gangcheck.model.objects import ReadOnlyObj as Obj

# --- the inventory ---------------------------------------------------------------------------


def build_inventory(
    slices: Iterable[Obj], device_classes: Iterable[Obj] = (), claims: Iterable[Obj] = ()
) -> Inventory:
    """The devices of `slices`, with `device_classes` to select them and the allocations of
    `claims` (ResourceClaims, any namespace) in use; see the module doc."""
    problems: list[Problem] = []
    classes = {}
    for obj in device_classes:
        name = str(dict_at(obj, "metadata").get("name") or "")
        selectors = tuple(compile_selector(e) for e in _expressions(dict_at(obj, "spec")))
        for selector in selectors:
            if not selector.evaluable:
                message = f"CEL selector gangcheck cannot evaluate: {selector.expression}"
                problems.append(Problem("DeviceClass", name, message))
        classes[name] = DeviceClass(name, selectors)
    slices = list(slices)
    problems.extend(_unknown_drivers(slices, classes.values()))
    pools = []
    for (driver, pool_name), members in sorted(_newest_slices(slices).items()):
        pool = _pool(driver, pool_name, members, problems)
        if pool.problem:
            problems.append(Problem("ResourcePool", str(pool), pool.problem))
        pools.append(pool)
    inventory = Inventory(tuple(pools), classes, Usage(), ())
    used = _allocated(inventory, claims)
    return Inventory(inventory.pools, classes, used, tuple(problems))


def with_claims(inventory: Inventory, claims: Iterable[Obj]) -> Inventory:
    """The same devices with what `claims` hold in use instead; what was worked out of the
    devices alone (CEL matches, the index by node, counter sets) is kept."""

    def same_devices(used: Usage, problems: tuple[Problem, ...]) -> Inventory:
        return Inventory(
            inventory.pools,
            inventory.classes,
            used,
            problems,
            inventory._matches,
            inventory._counter_sets,
            inventory._by_node,
            inventory._reach,
        )

    return same_devices(_allocated(same_devices(Usage(), ()), claims), inventory.problems)


def _newest_slices(slices: Iterable[Obj]) -> dict[tuple[str, str], list[Obj]]:
    pools: dict[tuple[str, str], list[Obj]] = {}
    for obj in slices:
        spec = dict_at(obj, "spec")
        pool = dict_at(spec, "pool")
        key = (str(spec.get("driver") or ""), str(pool.get("name") or ""))
        kept = pools.setdefault(key, [])
        generation = _int(pool.get("generation"))
        newest = _int(dict_at(dict_at(kept[0], "spec"), "pool").get("generation")) if kept else None
        if newest is None or generation == newest:
            kept.append(obj)
        elif generation > newest:
            kept[:] = [obj]
    return pools


def _pool(driver: str, name: str, slices: list[Obj], problems: list[Problem]) -> Pool:
    slices = sorted(slices, key=lambda s: str(dict_at(s, "metadata").get("name") or ""))
    expected = _int(dict_at(dict_at(slices[0], "spec"), "pool").get("resourceSliceCount"))
    scopes = tuple(
        scope
        for spec in (dict_at(s, "spec") for s in slices)
        for scope in (
            map(_scope, list_at(spec, "devices"))
            if spec.get("perDeviceNodeSelection") is True
            else (_scope(spec),)
        )
    )
    if len(slices) != expected:
        problem = f"being updated: {len(slices)} of {expected} ResourceSlices seen"
        return Pool(driver, name, scopes=scopes, problem=problem)
    devices: list[Device] = []
    counters: dict[str, Mapping[str, int]] = {}
    problem = ""
    for obj in slices:
        spec, slice_name = dict_at(obj, "spec"), str(dict_at(obj, "metadata").get("name") or "")
        for counter_set in list_at(spec, "sharedCounters"):
            set_name = str(counter_set.get("name") or "")
            if set_name in counters:
                problem = problem or f"invalid: counter set {_quoted(set_name)} is defined twice"
            counters[set_name] = _counters(counter_set)
        per_device = spec.get("perDeviceNodeSelection") is True
        for raw in list_at(spec, "devices"):
            try:
                scope = _scope(raw) if per_device else _scope(spec)
                devices.append(_device(driver, name, raw, scope))
            except QuantityError as exc:
                what = f"device {_quoted(raw.get('name') or '')}: {exc}"
                problems.append(Problem("ResourceSlice", slice_name, what))
    names = Counter(d.name for d in devices)
    duplicate = next((n for n, count in names.items() if count > 1), None)
    if duplicate is not None:
        problem = problem or f"invalid: device name {_quoted(duplicate)} is used twice"
    for device in devices:
        unknown = _unknown_counter(device, counters)
        if unknown:
            problem = (
                problem or f"invalid: device {_quoted(device.name)} consumes unknown {unknown}"
            )
    if problem:
        return Pool(driver, name, scopes=scopes, problem=problem)
    return Pool(driver, name, tuple(devices), counters, scopes)


def _unknown_counter(device: Device, counters: Mapping[str, Mapping[str, int]]) -> str:
    for set_name, consumed in device.consumes.items():
        if set_name not in counters:
            return f"counter set {_quoted(set_name)}"
        missing = [c for c in consumed if c not in counters[set_name]]
        if missing:
            return f"counter {_quoted(missing[0])} of counter set {_quoted(set_name)}"
    return ""


def _device(driver: str, pool: str, raw: Obj, scope: NodeScope) -> Device:
    """A Device of a slice's device entry; QuantityError on a malformed quantity."""
    attributes = {}
    for key, value in dict_at(raw, "attributes").items():
        parsed = _attribute(value)
        if parsed is not None:
            attributes[key if "/" in key else f"{driver}/{key}"] = parsed
    return Device(
        driver=driver,
        pool=pool,
        name=str(raw.get("name") or ""),
        attributes=attributes,
        capacity={str(k): _capacity(v) for k, v in dict_at(raw, "capacity").items()},
        consumes={
            str(c.get("counterSet") or ""): _counters(c) for c in list_at(raw, "consumesCounters")
        },
        multiple=raw.get("allowMultipleAllocations") is True,
        taints=tuple(taint_of(t) for t in list_at(raw, "taints")),
        scope=scope,
    )


def _attribute(raw: object) -> AttributeValue | None:
    if not isinstance(raw, Mapping):
        return None
    if isinstance(raw.get("bool"), bool):
        return bool(raw["bool"])
    if isinstance(raw.get("int"), int):
        return int(raw["int"])
    if isinstance(raw.get("string"), str):
        return str(raw["string"])
    if isinstance(raw.get("version"), str):
        return Version(str(raw["version"]))
    for key, kind in (("bools", bool), ("ints", int), ("strings", str)):
        if isinstance(raw.get(key), list):
            return tuple(kind(v) for v in raw[key])
    if isinstance(raw.get("versions"), list):
        return tuple(Version(str(v)) for v in raw["versions"])
    return None


def _capacity(raw: object) -> DeviceCapacity:
    raw = raw if isinstance(raw, Mapping) else {}
    policy = dict_at(raw, "requestPolicy")
    limits = dict_at(policy, "validRange")

    def optional(obj: Obj, key: str) -> int | None:
        return None if obj.get(key) is None else parse_quantity(obj[key])

    return DeviceCapacity(
        value=parse_quantity(raw.get("value", "0")),
        default=optional(policy, "default"),
        valid_values=tuple(parse_quantity(v) for v in policy.get("validValues") or ()),
        minimum=optional(limits, "min"),
        maximum=optional(limits, "max"),
        step=optional(limits, "step"),
    )


def _counters(raw: Obj) -> dict[str, int]:
    counters = dict_at(raw, "counters")
    return {
        str(name): parse_quantity(dict_at(counters, name).get("value", "0")) for name in counters
    }


def _scope(raw: Obj) -> NodeScope:
    selector = raw.get("nodeSelector")
    return NodeScope(
        node_name=str(raw.get("nodeName") or ""),
        all_nodes=raw.get("allNodes") is True,
        node_selector=selector if isinstance(selector, Mapping) else None,
    )


def _unknown_drivers(slices: Sequence[Obj], classes: Iterable[DeviceClass]) -> list[Problem]:
    """Slices whose driver no DeviceClass names (`device.driver == "..."` in a selector);
    none when some class names no driver at all (it may select any)."""
    named: set[str] = set()
    for device_class in classes:
        drivers = {s.driver for s in device_class.selectors if s.driver is not None}
        if not drivers:
            return []
        named |= drivers
    problems = []
    for obj in slices:
        driver = str(dict_at(obj, "spec").get("driver") or "")
        if driver not in named:
            name = str(dict_at(obj, "metadata").get("name") or "")
            message = f"driver {_quoted(driver)} is not selected by any DeviceClass"
            problems.append(Problem("ResourceSlice", name, message))
    return problems


def _allocated(inventory: Inventory, claims: Iterable[Obj]) -> Usage:
    devices = {d.id: d for pool in inventory.pools for d in pool.devices}
    ledger = _Ledger(inventory, Usage())
    seen: set[tuple[str, str]] = set()
    for claim in claims:
        meta = dict_at(claim, "metadata")
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if key in seen:
            continue
        seen.add(key)
        allocation = dict_at(dict_at(claim, "status"), "allocation")
        for result in list_at(dict_at(allocation, "devices"), "results"):
            if result.get("adminAccess") is True:
                continue
            device_id = (
                str(result.get("driver") or ""),
                str(result.get("pool") or ""),
                str(result.get("device") or ""),
            )
            consumed = {}
            for name, value in dict_at(result, "consumedCapacity").items():
                try:
                    consumed[str(name)] = parse_quantity(value)
                except QuantityError:
                    continue
            device = devices.get(device_id) or Device(*device_id)
            shared = bool(result.get("shareID") or consumed or device.multiple)
            ledger.use(device, consumed, shared=shared)
    return ledger.freeze()
