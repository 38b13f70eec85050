"""The API resources gangcheck reads and writes, by group, version and plural."""

from __future__ import annotations

from dataclasses import dataclass

from gangcheck.model.names import (
    CONFIG_GROUP,
    CONFIG_VERSION,
    KUEUE_GROUP,
    KUEUE_VERSION,
    PROVREQ_GROUP,
    PROVREQ_VERSION,
)


@dataclass(frozen=True)
class Resource:
    """One served resource: enough to build its URL paths."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def collection_path(self, namespace: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            return f"{base}/namespaces/{namespace}/{self.plural}"
        return f"{base}/{self.plural}"

    def object_path(self, name: str, namespace: str | None = None) -> str:
        return f"{self.collection_path(namespace)}/{name}"


WORKLOAD = Resource(KUEUE_GROUP, KUEUE_VERSION, "workloads", "Workload")
ADMISSION_CHECK = Resource(
    KUEUE_GROUP, KUEUE_VERSION, "admissionchecks", "AdmissionCheck", namespaced=False
)
RESOURCE_FLAVOR = Resource(
    KUEUE_GROUP, KUEUE_VERSION, "resourceflavors", "ResourceFlavor", namespaced=False
)
PROVISIONING_REQUEST = Resource(
    PROVREQ_GROUP, PROVREQ_VERSION, "provisioningrequests", "ProvisioningRequest"
)
ATOMIC_CONFIG = Resource(
    CONFIG_GROUP,
    CONFIG_VERSION,
    "atomicprovisioningconfigs",
    "AtomicProvisioningConfig",
    namespaced=False,
)
POD_TEMPLATE = Resource("", "v1", "podtemplates", "PodTemplate")
POD = Resource("", "v1", "pods", "Pod")
NODE = Resource("", "v1", "nodes", "Node", namespaced=False)
SECRET = Resource("", "v1", "secrets", "Secret")
MULTIKUEUE_CLUSTER = Resource(
    KUEUE_GROUP, KUEUE_VERSION, "multikueueclusters", "MultiKueueCluster", namespaced=False
)
MULTIKUEUE_CONFIG = Resource(
    KUEUE_GROUP, KUEUE_VERSION, "multikueueconfigs", "MultiKueueConfig", namespaced=False
)
EVENT = Resource("", "v1", "events", "Event")
SERVICE_ACCOUNT = Resource("", "v1", "serviceaccounts", "ServiceAccount")
NAMESPACE = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
LEASE = Resource("coordination.k8s.io", "v1", "leases", "Lease")
CONFIG_MAP = Resource("", "v1", "configmaps", "ConfigMap")
NODE_CLAIM = Resource("karpenter.sh", "v1", "nodeclaims", "NodeClaim", namespaced=False)
NODE_POOL = Resource("karpenter.sh", "v1", "nodepools", "NodePool", namespaced=False)
MACHINE = Resource("cluster.x-k8s.io", "v1beta1", "machines", "Machine")
MACHINE_SET = Resource("cluster.x-k8s.io", "v1beta1", "machinesets", "MachineSet")
MACHINE_DEPLOYMENT = Resource(
    "cluster.x-k8s.io", "v1beta1", "machinedeployments", "MachineDeployment"
)
CLUSTER_QUEUE = Resource(
    KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", "ClusterQueue", namespaced=False
)
LOCAL_QUEUE = Resource(KUEUE_GROUP, KUEUE_VERSION, "localqueues", "LocalQueue")
JOB = Resource("batch", "v1", "jobs", "Job")
UPSTREAM_POD_GROUP_V1BETA1 = Resource("scheduling.k8s.io", "v1beta1", "podgroups", "PodGroup")
UPSTREAM_POD_GROUP_V1ALPHA2 = Resource("scheduling.k8s.io", "v1alpha2", "podgroups", "PodGroup")
PLUGINS_POD_GROUP = Resource("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup")
DEVICE_CLASS = Resource("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", namespaced=False)
RESOURCE_SLICE = Resource(
    "resource.k8s.io", "v1", "resourceslices", "ResourceSlice", namespaced=False
)
RESOURCE_CLAIM = Resource("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim")
RESOURCE_CLAIM_TEMPLATE = Resource(
    "resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate"
)
MUTATING_WEBHOOK = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    namespaced=False,
)
