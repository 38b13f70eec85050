# syntax=docker/dockerfile:1
#
# gangcheck's controller image.
#
#   docker build -t gangcheck:0.1.0 .
#
# The base is pinned by tag. Pin it by digest as well when you build
# (python:3.11.14-slim-bookworm@sha256:...): the digest could not be looked up where this
# file was written, and a tag can be moved.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# ---- builder: the wheel of gangcheck and of every dependency, installed into a venv ----
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# README.md is optional (pyproject names it; the build only warns when it is missing): the
# wildcard lets COPY succeed either way.
COPY pyproject.toml README.m[d] ./
COPY gangcheck ./gangcheck
# The tracing extra (the OTLP/HTTP span exporter) is always in the image: traces are then
# turned on by configuration alone (tracing.otlpEndpoint or OTEL_EXPORTER_OTLP_ENDPOINT).
RUN python -m pip wheel --wheel-dir /wheels ".[tracing]" \
 && python -m venv --without-pip /opt/gangcheck \
 && python -m pip --python /opt/gangcheck/bin/python install --no-index \
        --find-links /wheels "gangcheck[tracing]" \
 && /opt/gangcheck/bin/python -c "import opentelemetry.exporter.otlp.proto.http.trace_exporter" \
 && /opt/gangcheck/bin/python -m compileall -q /opt/gangcheck \
 && /opt/gangcheck/bin/gangcheck --help > /dev/null

# ---- runtime: the venv on the same Python, no build tools, nothing written at run time --
FROM ${PYTHON_IMAGE}
# pip, setuptools and wheel are build tools: the runtime needs none of them.
RUN PIP_NO_CACHE_DIR=1 python -m pip uninstall --yes --quiet pip setuptools wheel
COPY --from=builder /opt/gangcheck /opt/gangcheck
# Bytecode was compiled in the builder; never write it (the root filesystem is read-only).
ENV PATH=/opt/gangcheck/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# 65532: the conventional "nonroot" uid/gid; no home directory or shell login is needed.
USER 65532:65532
WORKDIR /
# metrics, health (/healthz, /readyz)
EXPOSE 8080 8081
ENTRYPOINT ["gangcheck"]
CMD ["run", "--in-cluster"]
