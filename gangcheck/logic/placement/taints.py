"""Taints and the tolerations that let a pod (or a device request) past them.

The same rules for node taints (kube-scheduler's TaintToleration) and DRA device taints:
Equal and Exists; an empty key with Exists tolerates every taint; an empty effect matches
every effect; operators newer than Equal/Exists tolerate nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str

    @property
    def short(self) -> str:
        return f"{self.key}:{self.effect}"

    def __str__(self) -> str:
        value = f"={self.value}" if self.value else ""
        return f"{self.key}{value}:{self.effect}"


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.operator in ("", "Equal") and self.value == taint.value


def taint_of(raw: Mapping[str, Any]) -> Taint:
    return Taint(
        str(raw.get("key") or ""), str(raw.get("value") or ""), str(raw.get("effect") or "")
    )


def toleration_of(raw: Mapping[str, Any]) -> Toleration:
    return Toleration(
        key=str(raw.get("key") or ""),
        operator=str(raw.get("operator") or "Equal"),
        value=str(raw.get("value") or ""),
        effect=str(raw.get("effect") or ""),
    )
