"""When gangcheck may not do what serving its Karpenter class takes (403): what it says, and how
long it waits before trying again.

Requests of the Karpenter class are served only with the rights of
``manifests/components/karpenter`` (NodePools read, NodeClaims written, the requests' status
patched). Without them every pass is refused. That is said once, naming the component and
what was refused, and again only when what is refused changes; the passes back off, doubling
up to ``cap`` seconds, and come back to their interval once a pass is allowed again.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

COMPONENT = "manifests/components/karpenter"
REASON = "KarpenterNotPermitted"
#: The longest wait between passes while refused.
CAP_SECONDS = 60.0


def not_permitted(action: str) -> str:
    """The message for a refused ``action`` (``list karpenter.sh NodeClaims``, ...)."""
    return (
        f"gangcheck may not {action} (403 Forbidden): the Karpenter backend's RBAC is not "
        f"installed; install {COMPONENT} (or the chart with karpenter.enabled=true)"
    )


@dataclass
class Denials:
    """What the passes were last refused (None: allowed), and how many were refused in a row."""

    interval: float
    cap: float = CAP_SECONDS
    message: str | None = None
    refused: int = 0

    def refuse(self, message: str) -> bool:
        """A pass was refused; True when that is news (the first refusal, or another one)."""
        news = message != self.message
        self.message = message
        self.refused += 1
        return news

    def allow(self) -> bool:
        """A pass went through; True when it ends a refusal."""
        ended = self.message is not None
        self.message = None
        self.refused = 0
        return ended

    @property
    def delay(self) -> float:
        """Seconds before the next pass: the interval, doubled per refusal in a row, capped."""
        if not self.refused:
            return self.interval
        return min(self.cap, self.interval * 2.0**self.refused)
