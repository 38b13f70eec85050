"""The local test bed: a real Kubernetes control plane built from Go modules, on loopback.

``ControlPlane()`` is etcd + kube-apiserver; ``ControlPlane(components=FULL_STACK,
node_groups=[NodeGroup(...)])`` adds kube-scheduler, kube-controller-manager, kwok, Kueue and
cluster-autoscaler (see :mod:`gangcheck_dev.testbed.stack`).
"""

from gangcheck_dev.testbed.launcher import ControlPlane
from gangcheck_dev.testbed.nodes import DEFAULT_NODE_GROUPS, NodeGroup, Taint, kwok_node
from gangcheck_dev.testbed.process import Component, ComponentError
from gangcheck_dev.testbed.stack import FULL_STACK

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
