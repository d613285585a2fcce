"""The container image inputs: the Dockerfile copies only what exists and .dockerignore lets through, the lock
files pin every runtime dependency exactly, and the build script says why it cannot build."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from .manifest_walk import REPO

IMAGE_DIR = REPO / "manifests" / "image"


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lock(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        pin = re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+!\-]+", line)
        assert pin, f"{path.name}: not an exact pin: {line}"
        name, version = line.split("==")
        pins[_normalize(name)] = version
    return pins


def _requirement_name(spec: str) -> str:
    match = re.match(r"[A-Za-z0-9_.\-]+", spec)
    assert match, spec
    return _normalize(match.group(0))


def test_runtime_lock_pins_every_dependency() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    pins = _lock(IMAGE_DIR / "requirements.lock")
    missing = {_requirement_name(d) for d in project["project"]["dependencies"]} - set(pins)
    assert not missing, f"requirements.lock lacks {sorted(missing)}: run manifests/image/lock.sh"
    assert "pytest" not in pins and "mypy" not in pins, "dev tools do not belong in the image"


def test_build_lock_pins_the_build_backend() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    pins = _lock(IMAGE_DIR / "build-requirements.lock")
    for requirement in project["build-system"]["requires"]:
        assert _requirement_name(requirement) in pins, f"build-requirements.lock lacks {requirement}"


def _dockerignore_allows(path: str) -> bool:
    allowed = True
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        rule = raw.strip()
        if not rule or rule.startswith("#"):
            continue
        negate = rule.startswith("!")
        pattern = rule.lstrip("!").rstrip("/")
        if (
            fnmatch.fnmatch(path, pattern)
            or path.startswith(pattern + "/")
            or fnmatch.fnmatch(path, pattern.replace("**/", "*/"))
        ):
            allowed = negate
    return allowed


def test_dockerfile_copies_only_existing_allowed_files() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    copies = [
        line.split()[1:-1]
        for line in dockerfile.splitlines()
        if line.startswith("COPY ") and "--from=" not in line
    ]
    assert copies, "the Dockerfile copies nothing from the build context"
    build_script = (IMAGE_DIR / "build.sh").read_text()
    for sources in copies:
        for src in sources:
            if src.startswith("build/"):
                # Staged into the (git-ignored) build/ directory by build.sh before it runs the build.
                staged = str(Path(src).parent)
                assert f'"$REPO/{staged}' in build_script, f"build.sh never stages {src}"
            else:
                assert (REPO / src).exists(), f"Dockerfile copies {src}, which does not exist"
            assert _dockerignore_allows(src), f".dockerignore excludes {src}, which the Dockerfile copies"
    assert re.search(r"^USER 65532", dockerfile, re.M), "the image's default user must be non-root"
    assert "org.opencontainers.image.version" in dockerfile


def test_build_script_explains_a_missing_builder(tmp_path: Path) -> None:
    # A PATH with the script's own tools but no docker, podman or buildah.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "sed", "head", "git", "printf", "dirname"):
        for base in ("/usr/bin", "/bin"):
            if Path(base, tool).exists():
                (bin_dir / tool).symlink_to(Path(base, tool))
                break
    out = subprocess.run(
        [str(IMAGE_DIR / "build.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PATH": str(bin_dir)},
    )
    assert out.returncode == 1
    for line in ("docker is not installed", "podman is not installed", "buildah is not installed"):
        assert line in out.stderr, out.stderr


def _pyproject_version() -> str:
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def test_cli_prints_its_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dra_gpu.cli.main", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == f"dra-gpu {_pyproject_version()}"


@pytest.mark.skipif(shutil.which("buildah") is None, reason="no buildah: `make image` has not run here")
def test_built_image_runs_both_entry_points() -> None:
    """The image `make image` built (buildah storage) runs `dra-gpu --version`, the webhook's and the plugin's
    entry points, as its default non-root user; skipped when that image is not there."""
    image = f"dra-gpu:{_pyproject_version()}"
    if (
        subprocess.run(
            ["buildah", "inspect", "--type", "image", image], capture_output=True, check=False
        ).returncode
        != 0
    ):
        pytest.skip(f"no image {image}: run `make image`")
    ctr = subprocess.run(
        ["buildah", "from", "--quiet", image], capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()
    try:

        def run(*argv: str) -> str:
            return subprocess.run(
                ["buildah", "run", "--isolation", "chroot", ctr, "--", *argv],
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            ).stdout

        assert run("dra-gpu", "--version").strip() == f"dra-gpu {_pyproject_version()}"
        assert "--tls-cert-file" in run("dra-gpu", "webhook", "--help")
        assert "--nvidia-cdi-hook-path" in run("dra-gpu", "kubelet-plugin", "--help")
        assert run("nvidia-ctk", "--version").startswith("NVIDIA Container Toolkit CLI version")
        assert run("id", "-u").strip() == "65532"
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True, check=False, timeout=120)
