# syntax=docker/dockerfile:1
# dra-gpu: one image for the kubelet plugin (DaemonSet, runs as root: it needs the node's device nodes,
# mounts in the kubelet's plugin directory, MIG and MPS control) and the admission webhook (runs as the
# unprivileged user 65532). Build: `make image` (manifests/image/build.sh).
#
# Reproducible inputs: the base image is a build argument (pin it by digest in release builds, e.g.
# --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:...), and Python dependencies come from
# manifests/image/requirements.lock and the build backend from build-requirements.lock (exact versions,
# installed with --no-deps so nothing is re-resolved; regenerate both with manifests/image/lock.sh).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
# Behind a TLS-intercepting proxy: the CA bundle pip must trust, a path inside the build. build.sh mounts the
# host's bundle there for buildah/podman (never copied into a layer); empty (the default) is ignored by pip.
ARG PIP_CERT=
COPY manifests/image/requirements.lock manifests/image/build-requirements.lock /tmp/
# Locked dependencies as binary wheels only: nothing is compiled or re-resolved during the build.
RUN python -m venv /opt/dra-gpu \
 && /opt/dra-gpu/bin/pip install --no-deps --only-binary=:all: -r /tmp/requirements.lock \
 && python -m venv /opt/build \
 && /opt/build/bin/pip install --no-deps --only-binary=:all: -r /tmp/build-requirements.lock
COPY pyproject.toml README.md /src/
COPY dra_gpu /src/dra_gpu
# The project as a wheel built by the locked backend, installed without touching the locked dependencies;
# `pip check` proves the lock is complete. Then what the driver never runs leaves the runtime venv: pip and
# setuptools, and the kubernetes client's asyncio copy (kubernetes/aio, 68 MB; dra-gpu uses the sync client).
# Bytecode is compiled once, here.
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /tmp/wheels /src \
 && /opt/dra-gpu/bin/pip install --no-deps /tmp/wheels/dra_gpu-*.whl \
 && /opt/dra-gpu/bin/pip check \
 && /opt/dra-gpu/bin/python -m pip uninstall -q -y pip setuptools \
 && rm -rf /opt/dra-gpu/lib/python3*/site-packages/kubernetes/aio \
 && /opt/dra-gpu/bin/python -m compileall -q /opt/dra-gpu/lib

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="dra-gpu" \
      org.opencontainers.image.description="Kubernetes DRA driver for NVIDIA GPUs (gpu.nvidia.com): kubelet plugin and admission webhook" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
# No packages are added: `mount` (for the MPS shared-memory tmpfs) is part of the Debian base, and no NVIDIA
# libraries are baked in: the plugin uses the driver installed on the node (mounted from nvidiaDriverRoot), so
# one image serves every driver version.
RUN groupadd --system --gid 65532 dra-gpu \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin dra-gpu
COPY --from=build /opt/dra-gpu /opt/dra-gpu
# NVIDIA Container Toolkit's nvidia-ctk (the plugin runs `nvidia-ctk cdi generate` for the common CDI edits) and
# nvidia-cdi-hook (named by those edits; the plugin copies it onto the node, where the runtime runs it), built
# from NVIDIA's Go module at the pinned version and staged here by build.sh (e2e/cluster/build.sh nvidia-ctk).
COPY build/image/nvidia/nvidia-ctk build/image/nvidia/nvidia-cdi-hook /usr/bin/
ENV PATH=/opt/dra-gpu/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# Non-root by default (the webhook); the chart runs the kubelet plugin with runAsUser: 0 and privileged.
USER 65532:65532
CMD ["dra-gpu", "--help"]
