"""The Helm chart (``manifests/helm/gangcheck``), with the real helm built from its Go module.

Rendering needs no cluster: ``helm lint``; ``helm template`` for the default values and for
each reclaimer, whose RBAC must be the kustomize build's (``manifests/base`` plus the matching
``manifests/components/reclaim-*``, rendered by the test bed's kubectl) object for object;
the pod's confinement identical to the base's Deployment; the ValidatingAdmissionPolicy the
base's, following the release's ServiceAccount; and values that make no sense
refused by ``values.schema.json`` at template time, naming the value. With ``role:
dispatcher`` (a MultiKueue manager) the chart renders the dispatcher alone, with the RBAC of
``manifests/dispatcher`` object for object and its Deployment's confinement; with
``dispatcherReader.enabled`` (a worker) the read-only rights of
``manifests/dispatcher/worker/reader.yaml``.

Then ``helm install`` into the local stack: the Deployment helm created, run from the image as
its pod would be (the test bed has no kubelet; see ``gangcheck_dev.testbed.container``) with the
token of the ServiceAccount helm created, leads through its Lease and marks an AdmissionCheck
of its controller Active, which only its granted permissions allow.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from gangcheck_dev.testbed.binaries import ensure_binaries, repo_root
from gangcheck_dev.testbed.container import Image
from gangcheck_dev.testbed.deploy import find_kubectl, kustomize_objects, run_controller_container

from gangcheck.kube.client import Kube
from gangcheck.kube.resources import ADMISSION_CHECK, ATOMIC_CONFIG, LEASE, Resource
from gangcheck.settings import load_settings
from tests.e2e.conftest import Cluster
from tests.e2e.helpers import delete_quietly, eventually, is_true, unique
from tests.e2e.test_gangcheck import OUR_CONTROLLER, our_config

Obj = dict[str, Any]
CHART = repo_root() / "manifests" / "helm" / "gangcheck"
CRD_FILE = "gangcheck.io_atomicprovisioningconfigs.yaml"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
#: reclaimer value -> the kustomize component granting the same.
RECLAIMER_COMPONENTS = {
    "CordonAndTaint": (),
    "None": (),
    "DeleteNode": ("reclaim-delete-node",),
    "DeleteNodeClaim": ("reclaim-nodeclaim",),
    "DeleteMachine": ("reclaim-capi",),
}
DEPLOYMENT = Resource("apps", "v1", "deployments", "Deployment")


@pytest.fixture(scope="module")
def helm() -> Path:
    return ensure_binaries(("helm",))["helm"] / "helm"


def run_helm(
    helm: Path, *args: str, kubeconfig: str | None = None
) -> subprocess.CompletedProcess[str]:
    env_args = [f"--kubeconfig={kubeconfig}"] if kubeconfig else []
    return subprocess.run(
        [str(helm), *args, *env_args], capture_output=True, text=True, check=False
    )


def template(helm: Path, *sets: str, release: str = "gangcheck") -> list[Obj]:
    """``helm template`` as ``release`` in gangcheck-system (the kustomize base's names)."""
    args = [f"--set={s}" for s in sets]
    result = run_helm(helm, "template", release, str(CHART), "--namespace=gangcheck-system", *args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def rbac(objects: list[Obj]) -> dict[tuple[str, str], Obj]:
    """The RBAC objects by (kind, name), without labels: what they grant, to whom."""
    found = {}
    for obj in objects:
        if obj["kind"] not in RBAC_KINDS:
            continue
        meta = {k: v for k, v in obj["metadata"].items() if k in ("name", "namespace")}
        body = {k: v for k, v in obj.items() if k not in ("metadata", "apiVersion")}
        found[(obj["kind"], meta["name"])] = {"metadata": meta, **body}
    return found


def kustomize(workdir: Path, components: tuple[str, ...]) -> list[Obj]:
    return kustomize_objects(find_kubectl(), workdir, components)


def deployment(objects: list[Obj]) -> Obj:
    (found,) = [o for o in objects if o["kind"] == "Deployment"]
    return dict(found)


# -- rendering ------------------------------------------------------------------------------


def test_chart_passes_helm_lint_strict(helm: Path) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("reclaimer", sorted(RECLAIMER_COMPONENTS))
def test_rendered_rbac_is_the_kustomize_builds_for_reclaimer(
    helm: Path, tmp_path: Path, reclaimer: str
) -> None:
    ours = rbac(template(helm, f"reclaimer={reclaimer}"))
    theirs = rbac(kustomize(tmp_path, RECLAIMER_COMPONENTS[reclaimer]))
    assert ours == theirs


def test_rendered_rbac_with_karpenter_is_the_kustomize_build_with_its_component(
    helm: Path, tmp_path: Path
) -> None:
    ours = rbac(template(helm, "reclaimer=DeleteNodeClaim", "karpenter.enabled=true"))
    theirs = rbac(kustomize(tmp_path, ("reclaim-nodeclaim", "karpenter")))
    assert ours == theirs


def test_default_pod_is_confined_as_the_kustomize_deployment(helm: Path, tmp_path: Path) -> None:
    ours = deployment(template(helm))["spec"]["template"]["spec"]
    theirs = deployment(kustomize(tmp_path, ()))["spec"]["template"]["spec"]
    assert ours["securityContext"] == theirs["securityContext"]
    (our_container,), (their_container,) = ours["containers"], theirs["containers"]
    for key in ("securityContext", "resources", "livenessProbe", "readinessProbe"):
        assert our_container[key] == their_container[key], key
    assert ours["serviceAccountName"] == theirs["serviceAccountName"] == "gangcheck"
    assert [a for a in our_container["args"] if "lease" in a] == [
        a for a in their_container["args"] if "lease" in a
    ]


def test_values_choose_image_args_tracing_and_monitoring(helm: Path) -> None:
    objects = template(
        helm,
        "image.repository=registry.example/gangcheck",
        "image.digest=sha256:" + "a" * 64,
        "logLevel=DEBUG",
        "extraArgs={--workers=8}",
        "tracing.otlpEndpoint=http://collector:4318/v1/traces",
        "metrics.serviceMonitor.enabled=true",
        "replicaCount=3",
    )
    container = deployment(objects)["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example/gangcheck@sha256:" + "a" * 64
    assert "--log-level=DEBUG" in container["args"]
    assert container["args"][-1] == "--workers=8"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GANGCHECK_TRACING__OTLP_ENDPOINT"] == "http://collector:4318/v1/traces"
    kinds = {o["kind"] for o in objects}
    assert {"ServiceMonitor", "PodDisruptionBudget", "Service"} <= kinds
    assert deployment(objects)["spec"]["replicas"] == 3


def test_webhook_from_cert_manager_renders_issuer_certificate_and_ca_injection(
    helm: Path,
) -> None:
    objects = template(helm, "webhook.enabled=true", "webhook.certManager.enabled=true")
    by_kind = {o["kind"]: o for o in objects}
    assert {"Issuer", "Certificate", "MutatingWebhookConfiguration"} <= set(by_kind)
    hook = by_kind["MutatingWebhookConfiguration"]
    assert hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        "gangcheck-system/gangcheck-webhook"
    )
    secret = by_kind["Certificate"]["spec"]["secretName"]
    volumes = deployment(objects)["spec"]["template"]["spec"]["volumes"]
    assert any((v.get("secret") or {}).get("secretName") == secret for v in volumes)


def test_webhook_with_a_provided_secret_uses_it_and_its_ca(helm: Path) -> None:
    objects = template(
        helm, "webhook.enabled=true", "webhook.secretName=my-cert", "webhook.caBundle=Q0E="
    )
    hook = next(o for o in objects if o["kind"] == "MutatingWebhookConfiguration")
    assert hook["webhooks"][0]["clientConfig"]["caBundle"] == "Q0E="
    assert not any(o["kind"] in ("Issuer", "Certificate") for o in objects)
    volumes = deployment(objects)["spec"]["template"]["spec"]["volumes"]
    assert any((v.get("secret") or {}).get("secretName") == "my-cert" for v in volumes)


def test_webhook_drain_is_passed_and_fits_the_grace_period(helm: Path) -> None:
    """On SIGTERM the webhook answers webhook.drainSeconds more, well within the pod's grace
    period; 0 is passed as 0 (no drain), not replaced by the default."""
    secret = ("webhook.enabled=true", "webhook.secretName=my-cert", "webhook.caBundle=Q0E=")
    for values, drain in (((), "5"), (("webhook.drainSeconds=0",), "0")):
        pod = deployment(template(helm, *secret, *values))["spec"]["template"]["spec"]
        [container] = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["GANGCHECK_WEBHOOK__DRAIN_SECONDS"] == drain
        assert pod["terminationGracePeriodSeconds"] >= 20 + 5  # the largest drain, and room


def test_values_of_a_chart_before_the_drain_start_with_the_default_drain(helm: Path) -> None:
    """`helm upgrade --reuse-values` from a release whose chart had no webhook.drainSeconds
    renders with that release's values, where the key is absent (emulated here by setting it
    to null, which removes it): the replica must still start, with the setting's default (the
    variable not passed), not refuse an empty GANGCHECK_WEBHOOK__DRAIN_SECONDS at start."""
    secret = ("webhook.enabled=true", "webhook.secretName=my-cert", "webhook.caBundle=Q0E=")
    pod = deployment(template(helm, *secret, "webhook.drainSeconds=null"))["spec"]["template"]
    [container] = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert "GANGCHECK_WEBHOOK__DRAIN_SECONDS" not in env
    settings = load_settings(None, {k: str(v) for k, v in env.items() if v is not None})
    assert settings.webhook.drain_seconds == 5


@pytest.mark.parametrize(
    ("in_chart", "in_manifests"),
    [
        (
            "crds/gangcheck.io_atomicprovisioningconfigs.yaml",
            "crd/gangcheck.io_atomicprovisioningconfigs.yaml",
        ),
        ("files/admission-policy.yaml", "base/admission-policy.yaml"),
        ("files/fence-policy.yaml", "base/fence-policy.yaml"),
    ],
    ids=["the CRD", "the admission policy", "the fence policy"],
)
def test_chart_copy_is_the_manifests_file(in_chart: str, in_manifests: str) -> None:
    manifests = repo_root() / "manifests"
    assert (CHART / in_chart).read_text() == (manifests / in_manifests).read_text()


def test_rendered_admission_policy_is_the_kustomize_builds(helm: Path, tmp_path: Path) -> None:
    kinds = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")

    def key(o: dict[str, Any]) -> tuple[str, str]:
        return o["kind"], o["metadata"]["name"]

    ours = sorted((o for o in template(helm) if o["kind"] in kinds), key=key)
    theirs = sorted((o for o in kustomize(tmp_path, ()) if o["kind"] in kinds), key=key)
    # kustomize sets its namespace on these cluster-scoped kinds too; kubectl ignores it.
    for obj in theirs:
        obj["metadata"].pop("namespace", None)
    assert len(ours) == 10  # the four admission policies and the fence policy, with bindings
    assert ours == theirs


def test_admission_policy_follows_the_release(helm: Path) -> None:
    objects = template(helm, release="team-a")
    policies = {
        o["metadata"]["name"]: o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"
    }
    own = "team-a-gangcheck-writes-only-its-own"
    guard = "team-a-gangcheck-guards-its-records"
    assert sorted(policies) == sorted(
        ["team-a-gangcheck-fence", guard, own, f"{own}-arrivals", f"{own}-checks"]
    )
    for name in (own, f"{own}-arrivals", f"{own}-checks"):
        condition = policies[name]["spec"]["matchConditions"][0]
        assert "system:serviceaccount:gangcheck-system:team-a-gangcheck" in condition["expression"]
    # The guard of gangcheck's records names no account: every release's passes it.
    assert "serviceaccount" not in yaml.safe_dump(policies[guard])
    assert "matchConditions" not in policies["team-a-gangcheck-fence"]["spec"]  # every writer
    bindings = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert sorted(b["spec"]["policyName"] for b in bindings) == sorted(policies)


@pytest.mark.parametrize(
    ("sets", "named"),
    [
        pytest.param(["reclaimer=DeleteEverything"], "reclaimer", id="an unknown reclaimer"),
        pytest.param(["replicaCount=0"], "replicaCount", id="no replica with leader election"),
        pytest.param(
            ["leaderElection.enabled=false", "replicaCount=2"],
            "replicaCount",
            id="two replicas without leader election",
        ),
        pytest.param(["webhook.enabled=true"], "webhook", id="a webhook without a certificate"),
        pytest.param(
            ["webhook.enabled=true", "webhook.secretName=my-cert"],
            "caBundle",
            id="a provided secret without its CA",
        ),
        pytest.param(["logLevel=LOUD"], "logLevel", id="an unknown log level"),
        pytest.param(["replicas=2"], "replicas", id="a misspelt value"),
    ],
)
def test_template_refuses_nonsense_naming_the_value(
    helm: Path, sets: list[str], named: str
) -> None:
    args = [f"--set={s}" for s in sets]
    result = run_helm(helm, "template", "gangcheck", str(CHART), *args)
    assert result.returncode != 0, f"rendered although {sets}"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert named in result.stderr, result.stderr


# -- the MultiKueue dispatcher (role: dispatcher), and its reader in the workers ----------------

DISPATCHER_MANIFESTS = repo_root() / "manifests" / "dispatcher"


def manifest_objects(path: Path) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_chart_as_a_dispatcher_passes_helm_lint_strict(helm: Path) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART), "--set=role=dispatcher")
    assert result.returncode == 0, result.stdout + result.stderr


def test_dispatcher_role_renders_the_dispatchers_rbac_and_nothing_of_the_controller(
    helm: Path,
) -> None:
    objects = template(helm, "role=dispatcher")
    assert sorted(o["kind"] for o in objects) == sorted(
        ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service"]
        + ["Role", "RoleBinding"] * 2  # Kueue's Secrets, its Lease
    )
    assert rbac(objects) == rbac(manifest_objects(DISPATCHER_MANIFESTS / "rbac.yaml"))
    # the metrics Service: the kustomize manifests' (name, selector, port) too
    (chart,) = [o for o in objects if o["kind"] == "Service"]
    (ours,) = manifest_objects(DISPATCHER_MANIFESTS / "service.yaml")
    assert chart["metadata"]["name"] == ours["metadata"]["name"]
    assert chart["spec"]["ports"] == ours["spec"]["ports"]
    # the chart's selector adds the release (app.kubernetes.io/instance)
    assert ours["spec"]["selector"].items() <= chart["spec"]["selector"].items()
    kustomization = yaml.safe_load((DISPATCHER_MANIFESTS / "kustomization.yaml").read_text())
    assert "service.yaml" in kustomization["resources"]


@pytest.mark.parametrize("role", ["controller", "dispatcher"])
def test_the_service_monitor_reaches_the_metrics_port_of_the_roles_pods(
    helm: Path, role: str
) -> None:
    """Before, role: dispatcher rendered no metrics Service and no ServiceMonitor: its
    nominations and fallbacks could not be scraped by prometheus-operator."""
    objects = template(helm, f"role={role}", "metrics.serviceMonitor.enabled=true")
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    services = [o for o in objects if o["kind"] == "Service"]
    (service,) = [o for o in services if o["metadata"]["name"].endswith("-metrics")]
    pods = deployment(objects)["spec"]["template"]
    wanted = monitor["spec"]["selector"]["matchLabels"]
    assert wanted.items() <= service["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= pods["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    (container,) = pods["spec"]["containers"]
    assert "metrics" in [p["name"] for p in container["ports"]]
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


def test_dispatcher_pod_is_confined_and_run_as_the_manifests_deployment(helm: Path) -> None:
    ours = deployment(
        template(helm, "role=dispatcher", "dispatcher.atOnce=2", "dispatcher.roundWaitSeconds=15")
    )
    theirs = deployment(manifest_objects(DISPATCHER_MANIFESTS / "deployment.yaml"))
    assert ours["metadata"]["name"] == theirs["metadata"]["name"] == "gangcheck-dispatcher"
    pod, their_pod = ours["spec"]["template"]["spec"], theirs["spec"]["template"]["spec"]
    assert pod["securityContext"] == their_pod["securityContext"]
    assert pod["serviceAccountName"] == their_pod["serviceAccountName"]
    (container,), (their_container,) = pod["containers"], their_pod["containers"]
    assert container["resources"] == their_container["resources"]
    for key in ("allowPrivilegeEscalation", "readOnlyRootFilesystem", "capabilities"):
        assert container["securityContext"][key] == their_container["securityContext"][key], key
    args = container["args"]
    assert args[:3] == ["run", "--in-cluster", "--role=dispatcher"]
    assert "--dispatch-at-once=2" in args
    assert "--round-wait=15" in args and "--round-wait-max=1800" in args
    assert "--lease-name=gangcheck-dispatcher" in args  # the Lease its Role grants
    selector = ours["spec"]["selector"]["matchLabels"]
    assert selector["app.kubernetes.io/component"] == "dispatcher"


def test_dispatcher_reader_is_the_workers_manifest(helm: Path) -> None:
    objects = [
        o
        for o in template(helm, "dispatcherReader.enabled=true")
        if "dispatcher" in o["metadata"]["name"]
    ]
    assert rbac(objects) == rbac(manifest_objects(DISPATCHER_MANIFESTS / "worker" / "reader.yaml"))
    assert not [o for o in template(helm) if "dispatcher" in o["metadata"]["name"]]


@pytest.mark.parametrize(
    ("sets", "named"),
    [
        pytest.param(["role=manager"], "role", id="an unknown role"),
        pytest.param(["role=dispatcher", "dispatcher.atOnce=0"], "atOnce", id="no worker at once"),
        pytest.param(
            ["role=dispatcher", "dispatcher.roundWaitSeconds=0"],
            "roundWaitSeconds",
            id="no wait between rounds",
        ),
        pytest.param(
            ["role=dispatcher", "webhook.enabled=true", "webhook.certManager.enabled=true"],
            "webhook",
            id="a webhook for the dispatcher",
        ),
    ],
)
def test_template_refuses_dispatcher_nonsense_naming_the_value(
    helm: Path, sets: list[str], named: str
) -> None:
    result = run_helm(helm, "template", "gangcheck", str(CHART), *(f"--set={s}" for s in sets))
    assert result.returncode != 0, f"rendered although {sets}"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert named in result.stderr, result.stderr


# -- installed ------------------------------------------------------------------------------


@contextlib.contextmanager
def installed(helm: Path, cluster: Cluster, release: str, *sets: str) -> Iterator[None]:
    """``helm install`` of the chart as ``release`` into the namespace of the same name."""
    result = run_helm(
        helm,
        "install",
        release,
        str(CHART),
        f"--namespace={release}",
        "--create-namespace",
        *(f"--set={s}" for s in sets),
        kubeconfig=cluster.kubeconfig,
    )
    assert result.returncode == 0, result.stderr
    try:
        yield
    finally:
        run_helm(helm, "uninstall", release, f"--namespace={release}", "--wait",
                 kubeconfig=cluster.kubeconfig)  # fmt: skip
        subprocess.run(
            [str(find_kubectl()), f"--kubeconfig={cluster.kubeconfig}", "delete", "namespace",
             release, "--wait=false", "--ignore-not-found"],
            capture_output=True, check=False,
        )  # fmt: skip


@pytest.mark.timeout(180)
async def test_helm_install_gives_a_controller_that_leads_and_serves_its_checks(
    helm: Path,
    kube: Kube,
    cluster: Cluster,
    controller_image: Image,
    tmp_path: Path,
) -> None:
    release = unique("gangcheck-helm")
    repository, _, tag = controller_image.tag.partition(":")
    with installed(
        helm, cluster, release, f"image.repository={repository}", f"image.tag={tag}",
        "reclaimer=DeleteNode",
    ):  # fmt: skip
        installed_deployment = await kube.get(DEPLOYMENT, release, release)
        process = run_controller_container(
            Path(cluster.kubeconfig),
            deployment=installed_deployment,
            image=controller_image.id,
            workdir=tmp_path,
            name=release,
        )
        check = unique("helm-check")
        try:

            async def leading() -> str | None:
                lease = await kube.get(LEASE, release, release)
                return str((lease.get("spec") or {}).get("holderIdentity") or "") or None

            holder = await eventually(leading, timeout=60, what=f"a holder of Lease {release}")
            assert holder.startswith(f"{release}-"), holder
            spec = our_config(deadline=60)
            await kube.create(ATOMIC_CONFIG, {"metadata": {"name": check}, "spec": spec})
            await kube.create(
                ADMISSION_CHECK,
                {
                    "metadata": {"name": check},
                    "spec": {
                        "controllerName": OUR_CONTROLLER,
                        "parameters": {
                            "apiGroup": "gangcheck.io",
                            "kind": "AtomicProvisioningConfig",
                            "name": check,
                        },
                    },
                },
            )

            async def active() -> bool:
                return is_true(await kube.get(ADMISSION_CHECK, check), "Active")

            await eventually(active, timeout=60, what=f"AdmissionCheck {check} Active")
            assert process.running, process.log_tail(40)
        finally:
            process.stop()
            await delete_quietly(kube, ADMISSION_CHECK, check)
            await delete_quietly(kube, ATOMIC_CONFIG, check)
    cluster.record(f"helm install {release}: its Deployment's container led and served a check")
