"""What kind/e2e.sh installs besides gangcheck, from the Go modules the local test bed pins.

    python kind/manifests.py crds               the test bed's CRDs (Kueue, ProvisioningRequest,
                                                the scheduler-plugins PodGroup, ours), as YAML
    python kind/manifests.py kwok-stages        the test bed's kwok Stages, as YAML
    python kind/manifests.py autoscaler-config  cluster-autoscaler's kwok provider ConfigMaps
                                                for the e2e suite's node groups, as YAML
    python kind/manifests.py module kueue|kwok  "DIR VERSION" of that module (its manifests)

Every file comes from the Go module cache (``go mod download``, run in ``hack/<wrapper>``), at
the versions the test bed builds and installs: the same CRDs, the same Stages, the same node
groups. Needs gangcheck-dev (``make install``) and Go.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.e2e.conftest: the e2e suite's node groups

from gangcheck_dev.testbed import crds, nodes  # noqa: E402
from gangcheck_dev.testbed.stack import (  # noqa: E402
    KUEUE_MODULE,
    KWOK_MODULE,
    KWOK_STAGES,
)

#: The test bed's wrapper module (hack/<wrapper>) that pins each module.
MODULES = {"kueue": (KUEUE_MODULE, "kueue"), "kwok": (KWOK_MODULE, "kwok")}


def _dump(docs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False)


def _stages() -> list[dict[str, Any]]:
    folder = crds.module_dir(KWOK_MODULE, wrapper="kwok")
    docs = []
    for stage in KWOK_STAGES:
        docs.extend(d for d in yaml.safe_load_all((folder / stage).read_text()) if d)
    return docs


def _node_groups() -> list[dict[str, Any]]:
    from tests.e2e.conftest import E2E_NODE_GROUPS  # noqa: PLC0415 - only this command needs pytest

    return nodes.autoscaler_configmaps(E2E_NODE_GROUPS, "kube-system")


def _module(name: str) -> str:
    module, wrapper = MODULES[name]
    folder = crds.module_dir(module, wrapper=wrapper)
    return f"{folder} {folder.name.rsplit('@', 1)[1]}"


def main(argv: list[str]) -> int:
    match argv:
        case ["crds"]:
            print(_dump(crds.load_crds(crds.crd_files())), end="")
        case ["kwok-stages"]:
            print(_dump(_stages()), end="")
        case ["autoscaler-config"]:
            print(_dump(_node_groups()), end="")
        case ["module", name] if name in MODULES:
            print(_module(name))
        case _:
            print(__doc__, file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
