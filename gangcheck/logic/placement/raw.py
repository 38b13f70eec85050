"""Reading raw API dicts as placement does: a field that is not what it should be reads as
empty, never as an error."""

from __future__ import annotations

from collections.abc import Mapping

from gangcheck.model.objects import ReadOnlyObj as Obj


def dict_at(obj: Obj, key: str) -> Obj:
    """The mapping at `key`; empty when missing or not a mapping."""
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def list_at(obj: Obj, key: str) -> list[Obj]:
    """The mappings in the list at `key`; empty when missing or not a list."""
    value = obj.get(key)
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, Mapping)]
