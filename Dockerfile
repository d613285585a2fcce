# syntax=docker/dockerfile:1
# dra-gpu: one image for the kubelet plugin (DaemonSet, runs as root: it needs the node's device nodes,
# mounts in the kubelet's plugin directory, MIG and MPS control) and the admission webhook (runs as the
# unprivileged user 65532). Build: `make image` (manifests/image/build.sh).
#
# Verifiable: the base is pinned by digest (build.sh passes the local Debian base by its digest when this one
# cannot be pulled); Python dependencies come from manifests/image/requirements.lock and the build backend from
# build-requirements.lock, exact versions with the sha256 of every allowed file, installed with
# --require-hashes and --no-deps (nothing is re-resolved; regenerate both with manifests/image/lock.sh).
# Reproducible: build.sh passes SOURCE_DATE_EPOCH (the commit's time) and buildah/podman --timestamp, and the
# bytecode is hash-checked, so two builds of one commit on one base give the same layers (make image-verify).
# The tag says what the digest is (python 3.11, Debian bookworm); the digest alone decides what is pulled.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
# The time every generated file claims (the wheel's zip entries; useradd's password-change day below); build.sh
# passes the commit's time. A fixed PYTHONHASHSEED keeps set constants in one order in the bytecode.
ARG SOURCE_DATE_EPOCH=0
ENV PYTHONHASHSEED=0
# Behind a TLS-intercepting proxy: the CA bundle pip must trust, a path inside the build. build.sh mounts the
# host's bundle there for buildah/podman (never copied into a layer); empty (the default) is ignored by pip.
ARG PIP_CERT=
COPY manifests/image/requirements.lock manifests/image/build-requirements.lock /tmp/
# Locked dependencies as binary wheels only: nothing is compiled or re-resolved during the build.
# --no-compile: pip's bytecode would embed the files' mtimes at install time; it is compiled once, below.
RUN python -m venv /opt/dra-gpu \
 && /opt/dra-gpu/bin/pip install --no-deps --only-binary=:all: --require-hashes --no-compile \
        -r /tmp/requirements.lock \
 && python -m venv /opt/build \
 && /opt/build/bin/pip install --no-deps --only-binary=:all: --require-hashes -r /tmp/build-requirements.lock
COPY pyproject.toml README.md /src/
COPY dra_gpu /src/dra_gpu
# The project as a wheel built by the locked backend, installed without touching the locked dependencies;
# `pip check` proves the lock is complete. Then what the driver never runs leaves the runtime venv: pip and
# setuptools, and the kubernetes client's asyncio copy (kubernetes/aio, 68 MB; dra-gpu uses the sync client).
# Bytecode is compiled once, here, checked-hash: a .pyc holds its source's hash, not its mtime, so it is the
# same in every build and still valid (Python checks the hash) whatever mtimes the layers give the sources.
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /tmp/wheels /src \
 && /opt/dra-gpu/bin/pip install --no-deps --no-compile /tmp/wheels/dra_gpu-*.whl \
 && /opt/dra-gpu/bin/pip check \
 && /opt/dra-gpu/bin/python -m pip uninstall -q -y pip setuptools \
 && rm -rf /opt/dra-gpu/lib/python3*/site-packages/kubernetes/aio \
 && /opt/dra-gpu/bin/python -m compileall -q --invalidation-mode checked-hash /opt/dra-gpu/lib

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
# SOURCE_DATE_EPOCH: useradd writes it, not today's date, as the password-change day in /etc/shadow.
ARG SOURCE_DATE_EPOCH=0
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
