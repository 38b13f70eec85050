"""A simulated cloud: plays cluster-autoscaler plus a cloud for ProvisioningRequests.

It answers requests of the configured provisioning classes and creates real Node objects in
the API server, with the delays, partial deliveries, stockouts, late failures and revocations
its ConfigMap asks for. Run it with ``python -m gangcheck_dev.simcloud --config-map NS/NAME`` or
in-process as ``SimCloud(kube, "NS/NAME").run()``.
"""

from gangcheck_dev.simcloud.cloud import SimCloud
from gangcheck_dev.simcloud.model import SimConfig

__all__ = ["SimCloud", "SimConfig", "main"]


def main(argv: list[str] | None = None) -> int:
    """The command line (``python -m gangcheck_dev.simcloud``, ``gangcheck-dev sim-cloud``)."""
    from gangcheck_dev.simcloud.__main__ import main as run  # noqa: PLC0415 - CLI only when run

    return run(argv)
