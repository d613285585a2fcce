"""The driver image from the Dockerfile (`make image`), as an archive the local cluster's containerd imports.

build_local_image.py assembles an image from this machine's interpreter without a container tool; this module
builds the image users get: manifests/image/build.sh with buildah, podman or docker (a local Debian base when
the default base cannot be pulled), written out as an archive by the same script (DRA_GPU_OCI_OUT).

Which one the e2e tests use: DRA_GPU_E2E_IMAGE=real (the Dockerfile image, fail without a container tool),
local (the assembled one) or auto (the default: real when a container tool is installed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

from e2e.image.build_local_image import REPO_ROOT, BuildResult, ImageBuildError, cache_root

BUILD_SCRIPT = REPO_ROOT / "manifests" / "image" / "build.sh"
CHOICES = ("auto", "real", "local")
BUILD_TIMEOUT_S = 1800.0


def container_tool() -> str | None:
    """The tool build.sh would use: docker with a reachable daemon, else buildah, else podman."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "info"], capture_output=True, check=False, timeout=30)
        if probe.returncode == 0:
            return "docker"
    for tool in ("buildah", "podman"):
        if shutil.which(tool):
            return tool
    return None


def wanted_kind(choice: str | None = None) -> str:
    """'real' or 'local', from `choice` or DRA_GPU_E2E_IMAGE (auto: real when a container tool exists)."""
    value = (choice or os.environ.get("DRA_GPU_E2E_IMAGE") or "auto").strip().lower()
    if value not in CHOICES:
        raise ImageBuildError(f"DRA_GPU_E2E_IMAGE={value!r}: use one of {', '.join(CHOICES)}")
    if value == "auto":
        return "real" if container_tool() else "local"
    return value


def archive_digest(archive: Path) -> str:
    """The manifest digest of a single-image archive: OCI layout (index.json) or `docker save` (manifest.json
    has no digest: the config digest names the image there, as containerd lists it for such imports)."""
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        if "index.json" in names:
            member = tar.extractfile("index.json")
            assert member is not None
            index = json.load(member)
            return str(index["manifests"][0]["digest"])
        member = tar.extractfile("manifest.json")
        if member is None:
            raise ImageBuildError(f"{archive} is neither an OCI archive nor a `docker save` archive")
        config = str(json.load(member)[0]["Config"])
        return "sha256:" + Path(config).name.removesuffix(".json")


def config_digest(archive: Path) -> str:
    """The image ID (config digest) of a single-image archive, which the CRI reports as imageID."""
    with tarfile.open(archive) as tar:

        def read(name: str) -> Any:
            member = tar.extractfile(name)
            if member is None:
                raise ImageBuildError(f"{archive} has no {name}")
            return json.load(member)

        if "index.json" not in tar.getnames():
            return archive_digest(archive)  # `docker save`: the config digest already
        descriptor = read("index.json")["manifests"][0]
        while descriptor["mediaType"].endswith("image.index.v1+json"):
            descriptor = read("blobs/sha256/" + descriptor["digest"].split(":", 1)[1])["manifests"][0]
        manifest = read("blobs/sha256/" + descriptor["digest"].split(":", 1)[1])
        return str(manifest["config"]["digest"])


def _bytes(text: str) -> int:
    """'241 MB' / '1.2 GB' / '252645135' -> bytes (decimal units, as buildah and docker print them)."""
    parts = text.split()
    if not parts:
        return 0
    units = {"B": 1, "KB": 10**3, "kB": 10**3, "MB": 10**6, "GB": 10**9}
    try:
        return int(float(parts[0]) * units.get(parts[1] if len(parts) > 1 else "B", 1))
    except ValueError:
        return 0


def build_real(reference: str) -> BuildResult:
    """Build the Dockerfile's image as `reference` and write it as an OCI archive in the image cache."""
    if container_tool() is None:
        raise ImageBuildError(
            "no container tool for the Dockerfile image: run `e2e/cluster/install-host-deps.sh image` "
            "(buildah, debootstrap) or set DRA_GPU_E2E_IMAGE=local"
        )
    start = time.monotonic()
    out_dir = cache_root().parent / "real"
    out_dir.mkdir(parents=True, exist_ok=True)
    archive = out_dir / "dra-gpu-oci.tar"
    env = {**os.environ, "DRA_GPU_OCI_OUT": str(archive)}
    proc = subprocess.run(
        [str(BUILD_SCRIPT), reference], env=env, capture_output=True, text=True, check=False,
        timeout=BUILD_TIMEOUT_S,
    )  # fmt: skip
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        raise ImageBuildError(f"{BUILD_SCRIPT} {reference} exited {proc.returncode}:\n{tail}")
    size = 0
    for line in proc.stderr.splitlines():  # "[image] image size 241 MB" (docker: a byte count)
        if "image size" in line:
            size = _bytes(line.split("image size", 1)[1])
    return BuildResult(
        reference, archive, archive_digest(archive), size, archive.stat().st_size, False,
        time.monotonic() - start,
    )  # fmt: skip
