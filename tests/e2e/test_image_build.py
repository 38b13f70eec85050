"""What `make image` (``hack/image.sh build``) leaves in docker: the image and its base, and no
image of the Dockerfile's builder stage (its build venv and tools, ~250 MB), which docker's
classic builder keeps, untagged, unless it is removed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from uuid import uuid4

from gangcheck_dev.testbed.binaries import repo_root
from gangcheck_dev.testbed.container import Image


def _docker(*args: str) -> str:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"docker {' '.join(args[:3])}: {result.stderr}"
    return result.stdout


def _made_by(image_id: str) -> str:
    return _docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", image_id)


def test_the_build_leaves_no_builder_image(controller_image: Image) -> None:
    images = set(_docker("images", "--all", "--quiet", "--no-trunc").split())
    assert controller_image.id in images
    # The builder stage is the only one that makes /opt/build (the runtime copies /opt/gangcheck).
    builders = [image for image in images if "/opt/build" in _made_by(image)]
    assert builders == []
    labelled = _docker("images", "--all", "--quiet", "--filter", "label=io.gangcheck.stage=builder")
    assert labelled.split() == []


def _leftovers_removed(previous: str, new: str) -> None:
    """Runs ``remove_leftovers`` of hack/image.sh as the build runs it, after moving its tag."""
    script = repo_root() / "hack" / "image.sh"
    body = re.search(r"^remove_leftovers\(\) \{.*?^\}$", script.read_text(), re.M | re.S)
    assert body is not None, "hack/image.sh has no remove_leftovers"
    program = f"set -euo pipefail\nbuilder_label=io.gangcheck.stage=builder\n{body.group(0)}\n"
    result = subprocess.run(
        ["bash", "-c", f'{program}remove_leftovers "$1" "$2"', "-", previous, new],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def _probe_image(base: str, tmp_path: Path) -> str:
    """A one-layer image of the base, no tag: what the tag named before a build moved it."""
    (tmp_path / "Dockerfile").write_text(f"FROM {base}\nLABEL io.gangcheck.probe={uuid4().hex}\n")
    iid = tmp_path / "iid"
    _docker("build", "--quiet", "--network", "none", "--iidfile", str(iid), str(tmp_path))
    return iid.read_text().strip()


def test_the_image_a_session_holds_outlives_a_build_that_moves_the_tag(
    controller_image: Image, tmp_path: Path
) -> None:
    """Two test sessions from two checkouts: the second's build moves ``gangcheck:<version>``
    to its image and removes the one the tag named before, which the first still runs (its
    containerised tests then failed with "No such image"). Held by a session's tag, it stays;
    with no tag left, it goes."""
    assert controller_image.hold
    held_by = _docker("image", "inspect", "--format", "{{json .RepoTags}}", controller_image.id)
    assert controller_image.hold in held_by

    held = _probe_image(controller_image.base, tmp_path)
    hold = f"gangcheck:held-probe-{uuid4().hex[:8]}"
    _docker("tag", held, hold)
    try:
        _leftovers_removed(held, controller_image.id)
        assert held in set(_docker("images", "--quiet", "--no-trunc").split())
    finally:
        _docker("image", "rm", hold)  # the image goes with its last tag

    loose = _probe_image(controller_image.base, tmp_path)
    _leftovers_removed(loose, controller_image.id)
    assert loose not in set(_docker("images", "--all", "--quiet", "--no-trunc").split())
