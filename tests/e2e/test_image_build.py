"""What `make image` (``hack/image.sh build``) leaves in docker: the image and its base, and no
image of the Dockerfile's builder stage (its build venv and tools, ~250 MB), which docker's
classic builder keeps, untagged, unless it is removed."""

from __future__ import annotations

import subprocess

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
