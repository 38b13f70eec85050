"""The local test bed: a real Kubernetes control plane built from Go modules, on loopback."""

from gangcheck.testbed.launcher import ControlPlane
from gangcheck.testbed.process import Component, ComponentError

__all__ = ["Component", "ComponentError", "ControlPlane"]
