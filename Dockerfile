# gangcheck's controller image.
#
#   docker build -t gangcheck:0.1.0 .                       # on the public Python base
#   hack/image.sh build                                     # offline, on a local Debian base
#
# BASE_IMAGE is any Debian-like image whose python3 is CPython 3.11 with its venv module (the
# default, or the debootstrapped base of hack/image.sh). The default is pinned by digest: the
# OCI index digest that Docker's official-images record (github.com/docker-library/repo-info,
# repos/python/remote/3.11.15-slim-bookworm.md) gives for the build of 2026-08-05; it was
# not pulled where this file was written (no registry was reachable). The tag is kept for
# people; the digest decides. To move to a newer build or patch release, take the digest from
# that record, or resolve it yourself, and replace both:
#   docker buildx imagetools inspect python:3.11-slim-bookworm     # "Digest: sha256:..."
# The Python dependencies are the exact, hashed versions of requirements/image.lock
# (regenerate with hack/lock.sh). With requirements/wheels/ present in the build context, they
# are installed from there and the build needs no network (docs/install.md).
ARG BASE_IMAGE=python:3.11.15-slim-bookworm@sha256:d29f48a31a8b408ed19272ca1e7b10ebae13b240a27e862d3d4217c528e2e0c3

# ---- builder: gangcheck and its locked dependencies, installed into a venv -------------------
FROM ${BASE_IMAGE} AS builder
# hack/image.sh removes the image this stage leaves behind (docker's classic builder keeps it).
LABEL io.gangcheck.stage=builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# The dependencies first: their layer stays cached while only gangcheck's code changes.
COPY requirements/ ./requirements/
# /opt/build: the pip that ensurepip bundles and the build backend (requirements/build.lock).
# /opt/gangcheck: the runtime venv, without pip. Every package is checked against its hash.
RUN if [ -d requirements/wheels ]; then \
        export PIP_NO_INDEX=1 PIP_FIND_LINKS=/src/requirements/wheels; \
    fi \
 && python3 -m venv /opt/build \
 && /opt/build/bin/pip install --quiet --require-hashes --only-binary=:all: \
        -r requirements/build.lock \
 && python3 -m venv --without-pip /opt/gangcheck \
 && /opt/build/bin/pip --python /opt/gangcheck/bin/python install --quiet --require-hashes \
        --only-binary=:all: --no-deps -r requirements/image.lock
# README.md is optional (pyproject names it; the build only warns when it is missing): the
# wildcard lets COPY succeed either way.
COPY pyproject.toml README.m[d] ./
COPY gangcheck ./gangcheck
RUN /opt/build/bin/pip wheel --quiet --no-deps --no-build-isolation --no-index \
        --wheel-dir /wheels . \
 && /opt/build/bin/pip --python /opt/gangcheck/bin/python install --quiet --no-deps \
        --no-index /wheels/gangcheck-*.whl \
 && /opt/gangcheck/bin/python -c "import opentelemetry.exporter.otlp.proto.http.trace_exporter" \
 && /opt/gangcheck/bin/python -m compileall -q /opt/gangcheck \
 && /opt/gangcheck/bin/gangcheck --version

# ---- runtime: the venv on the same Python, no build tools, nothing written at run time -------
FROM ${BASE_IMAGE}
# pip (and setuptools, wheel where the base has them) are build tools: the runtime needs none.
RUN if python3 -m pip --version >/dev/null 2>&1; then \
        PIP_NO_CACHE_DIR=1 python3 -m pip uninstall --yes --quiet pip setuptools wheel; \
    fi
COPY --from=builder /opt/gangcheck /opt/gangcheck
# Bytecode was compiled in the builder; never write it (the root filesystem is read-only).
ENV PATH=/opt/gangcheck/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# 65532: the conventional "nonroot" uid/gid; no home directory or shell login is needed.
USER 65532:65532
WORKDIR /
# metrics, health (/healthz, /readyz), webhook
EXPOSE 8080 8081 9443
ENTRYPOINT ["gangcheck"]
CMD ["run", "--in-cluster"]
