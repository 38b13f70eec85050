"""What the caches keep of a Pod or a Node: what the controller reads, not the rest."""

from __future__ import annotations

from typing import Any

from gangcheck.logic.placement.fit import node_view, pod_requests
from gangcheck.logic.podgroups.podgroup import pod_template
from gangcheck.model.objects import pod_of
from gangcheck.reconcile.ingest import trim_node, trim_pod

Obj = dict[str, Any]


def pod(labels: dict[str, str] | None = None) -> Obj:
    container = {
        "name": "c",
        "image": "trainer:1",
        "env": [{"name": "X", "value": "1" * 1000}],
        "resources": {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "1"}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u",
            "labels": labels or {},
            "annotations": {"a": "b"},
            "resourceVersion": "7",
            "managedFields": [{"manager": "kubelet"}] * 20,
        },
        "spec": {
            "nodeName": "n1",
            "containers": [container],
            "initContainers": [{**container, "restartPolicy": "Always"}],
            "volumes": [{"name": "v", "emptyDir": {}}],
            "tolerations": [{"key": "k", "operator": "Exists"}],
            "overhead": {"cpu": "100m"},
        },
        "status": {"phase": "Running", "containerStatuses": [{"name": "c"}], "conditions": []},
    }


def test_a_pod_keeps_what_a_fit_counts_and_drops_the_rest() -> None:
    full = pod()
    kept = trim_pod(full)
    assert pod_requests(kept["spec"]) == pod_requests(full["spec"])
    assert kept["spec"]["tolerations"] == full["spec"]["tolerations"]
    assert kept["status"] == {"phase": "Running", "conditions": []}
    assert "managedFields" not in kept["metadata"]
    assert kept["metadata"]["annotations"] == {"a": "b"}
    assert "volumes" not in kept["spec"] and "image" not in kept["spec"]["containers"][0]


def test_a_pod_keeps_all_its_typed_view_reads() -> None:
    full = pod()
    full["metadata"].update(
        creationTimestamp="2026-01-01T00:00:00Z",
        deletionTimestamp="2026-01-01T00:01:00Z",
        ownerReferences=[{"kind": "DaemonSet", "name": "d", "uid": "d", "controller": True}],
        annotations={"autoscaling.x-k8s.io/consume-provisioning-request": "r"},
    )
    full["spec"]["schedulingGates"] = [{"name": "gangcheck.io/provisioning"}]
    full["status"]["nominatedNodeName"] = "n2"
    view = pod_of(trim_pod(full))
    assert view == pod_of(full)
    assert (view.node_name, view.nominated_node_name, view.phase) == ("n1", "n2", "Running")
    assert view.deleting and view.daemonset and view.gated and view.consumes == "r"
    assert (view.created, view.resource_version, view.ref.key) == (
        "2026-01-01T00:00:00Z",
        "7",
        "ns/p",
    )


def test_a_pod_group_member_keeps_its_whole_spec_for_its_gang_s_template() -> None:
    full = pod({"scheduling.x-k8s.io/pod-group": "g"})
    assert pod_template(pod_of(trim_pod(full))) == pod_template(pod_of(full))


def test_a_node_keeps_what_a_fit_reads_and_not_its_images() -> None:
    full = {
        "metadata": {"name": "n1", "resourceVersion": "3", "managedFields": [{}]},
        "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}], "providerID": "x://1"},
        "status": {
            "allocatable": {"cpu": "8", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
            "images": [{"names": ["big"], "sizeBytes": 1}] * 50,
        },
    }
    kept = trim_node(full)
    assert node_view(kept) == node_view(full)
    assert "images" not in kept["status"] and kept["spec"] == full["spec"]
