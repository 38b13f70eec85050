"""The local test bed: a real Kubernetes control plane built from Go modules, on loopback.

``ControlPlane()`` is etcd + kube-apiserver; ``ControlPlane(components=FULL_STACK,
node_groups=[NodeGroup(...)])`` adds kube-scheduler, kube-controller-manager, kwok, Kueue and
cluster-autoscaler (see :mod:`gangcheck.testbed.stack`).
"""

from gangcheck.testbed.launcher import ControlPlane
from gangcheck.testbed.nodes import DEFAULT_NODE_GROUPS, NodeGroup, Taint, kwok_node
from gangcheck.testbed.process import Component, ComponentError
from gangcheck.testbed.stack import FULL_STACK

__all__ = [
    "DEFAULT_NODE_GROUPS",
    "FULL_STACK",
    "Component",
    "ComponentError",
    "ControlPlane",
    "NodeGroup",
    "Taint",
    "kwok_node",
]
