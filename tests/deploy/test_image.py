"""The container image inputs: the Dockerfile copies only what exists and .dockerignore lets through, the lock
files pin every runtime dependency exactly with the hashes pip enforces, the base is pinned by digest, the
build is set up to be reproducible, and the build script says why it cannot build."""

from __future__ import annotations

import fnmatch
import hashlib
import json
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


def _requirements(path: Path) -> list[str]:
    """The lock's requirements, each with its continuation lines (`\\` then `    --hash=...`) joined."""
    joined = re.sub(r"\\\n\s*", " ", path.read_text())
    return [
        " ".join(line.split()) for line in joined.splitlines() if line.strip() and not line.startswith("#")
    ]


PIN = re.compile(
    r"(?P<name>[A-Za-z0-9_.\-]+)==(?P<version>[A-Za-z0-9_.+!\-]+)(?: ?;[^-]*)?(?P<hashes>( --hash=\S+)*)"
)


def _lock(path: Path) -> dict[str, str]:
    pins = {}
    for requirement in _requirements(path):
        pin = PIN.fullmatch(requirement.strip())
        assert pin, f"{path.name}: not an exact pin with hashes: {requirement}"
        pins[_normalize(pin["name"])] = pin["version"]
    return pins


@pytest.mark.parametrize("lock", ["requirements.lock", "build-requirements.lock"])
def test_every_locked_requirement_carries_sha256_hashes(lock: str) -> None:
    """pip --require-hashes refuses the whole install if one requirement lacks a hash: every line has them."""
    requirements = _requirements(IMAGE_DIR / lock)
    assert requirements, f"{lock} is empty"
    for requirement in requirements:
        hashes = re.findall(r"--hash=(\S+)", requirement)
        assert hashes, f"{lock}: {requirement.split()[0]} has no --hash: run manifests/image/lock.sh"
        for value in hashes:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", value), f"{lock}: {value} is not a sha256"


def _dockerfile_runs() -> list[str]:
    """Each RUN instruction of the Dockerfile as one line."""
    joined = re.sub(r"\\\n\s*", " ", (REPO / "Dockerfile").read_text())
    return [line for line in joined.splitlines() if line.startswith("RUN ")]


def test_dockerfile_installs_the_locks_with_require_hashes() -> None:
    installs = [
        part.strip()
        for run in _dockerfile_runs()
        for part in run.split("&&")
        if re.search(r"pip install .*-r ", part)
    ]
    assert {Path(p.split("-r ")[1].split()[0]).name for p in installs} == {
        "requirements.lock",
        "build-requirements.lock",
    }
    for install in installs:
        assert "--require-hashes" in install, f"installed without --require-hashes: {install}"
        assert "--no-deps" in install, f"installed with dependency resolution: {install}"


def test_base_image_is_pinned_by_digest() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", dockerfile, re.M)
    assert base, "the Dockerfile names no default base (ARG PYTHON_IMAGE=...)"
    assert re.fullmatch(r"[a-z0-9./:_-]+@sha256:[0-9a-f]{64}", base.group(1)), (
        f"not pinned by digest: {base[1]}"
    )
    assert all(
        line.split()[1] == "${PYTHON_IMAGE}" for line in dockerfile.splitlines() if line.startswith("FROM ")
    )
    # A base given by tag (the local Debian one, or PYTHON_IMAGE=name:tag) is resolved to its digest first.
    assert "pinned as" in (IMAGE_DIR / "build.sh").read_text()


def test_bytecode_is_compiled_once_with_source_hashes() -> None:
    """Timestamp .pyc files embed each source's mtime at install time, so two builds would differ: the runtime
    venv is installed without pip's bytecode and compiled checked-hash."""
    runs = " ".join(_dockerfile_runs())
    runtime_installs = re.findall(r"/opt/dra-gpu/bin/pip install [^&]*", runs)
    assert runtime_installs
    for install in runtime_installs:
        assert "--no-compile" in install, f"pip compiles timestamp bytecode here: {install}"
    assert re.search(r"compileall [^&]*--invalidation-mode checked-hash [^&]*/opt/dra-gpu", runs)


def test_build_sets_the_time_of_every_file_and_date() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    stages = dockerfile.split("\nFROM ")[1:]
    assert len(stages) == 2
    for stage in stages:  # an ARG does not cross a FROM
        assert "ARG SOURCE_DATE_EPOCH" in stage
    build = (IMAGE_DIR / "build.sh").read_text()
    assert '--build-arg "SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH"' in build
    assert '--timestamp "$SOURCE_DATE_EPOCH"' in build
    assert "log -1 --format=%ct" in build, "SOURCE_DATE_EPOCH defaults to the commit's time"
    # A cached step keeps the dates of the build that made it (buildah's cache key ignores --timestamp).
    assert "buildah bud --isolation chroot --layers=false" in build
    assert "podman build --isolation chroot --layers=false" in build


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
    for tool in ("bash", "sed", "awk", "git", "printf", "dirname"):
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
        # Reproducible bytecode: flags 0b11 in the .pyc header = checked-hash (a timestamp .pyc has 0).
        flags = run(
            "python", "-c",
            "import glob, struct; f = sorted(glob.glob('/opt/dra-gpu/lib/python3*/site-packages/dra_gpu/"
            "__pycache__/*.pyc'))[0]; print(struct.unpack('<I', open(f, 'rb').read()[4:8])[0])",
        )  # fmt: skip
        assert flags.strip() == "3", "the image's bytecode is not checked-hash: rebuild it with `make image`"
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True, check=False, timeout=120)


def _uv() -> Path | None:
    """The uv `make lock` uses (pinned in the Makefile, installed into the cache), when it is there."""
    makefile = (REPO / "Makefile").read_text()
    version = re.search(r"^UV_VERSION := (\S+)$", makefile, re.M)
    cache = Path(os.environ.get("DRA_GPU_CACHE", Path.home() / ".cache" / "dra-gpu"))
    uv = cache / f"uv-{version[1] if version else '?'}" / "bin" / "uv"
    return uv if uv.exists() else None


@pytest.mark.skipif(_uv() is None, reason="uv is not installed in the cache: run `make lock-check` once")
def test_lock_check_refuses_a_build_lock_without_hashes(tmp_path: Path) -> None:
    """`make lock-check` fails, naming the file and the fix, when a lock lost its hashes (e.g. edited by
    hand), and passes on the same copy with the hashes in place."""
    (tmp_path / "manifests" / "image").mkdir(parents=True)
    for name in ("pyproject.toml", "uv.lock", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    for name in ("lock.sh", "requirements.lock", "build-requirements.lock"):
        shutil.copy(IMAGE_DIR / name, tmp_path / "manifests" / "image" / name)
    cache = Path(os.environ.get("DRA_GPU_CACHE", Path.home() / ".cache" / "dra-gpu"))
    env = {"UV_CACHE_DIR": str(cache / "uv-cache"), **os.environ, "UV": str(_uv()), "PY": sys.executable}

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(tmp_path / "manifests" / "image" / "lock.sh"), "--check"],
            capture_output=True, text=True, timeout=120, check=False, env=env,
        )  # fmt: skip

    assert check().returncode == 0, check().stderr
    build_lock = tmp_path / "manifests" / "image" / "build-requirements.lock"
    build_lock.write_text(re.sub(r" \\\n\s*--hash=\S+", "", build_lock.read_text()))
    out = check()
    assert out.returncode == 1
    assert "build-requirements.lock has requirements without --hash: run make lock" in out.stderr
    assert "setuptools==" in out.stderr


def test_provenance_names_the_image_its_base_its_inputs_and_layers(tmp_path: Path) -> None:
    """The build record (manifests/image/provenance.py, written by build.sh): an in-toto statement whose
    subject is the image ID, whose dependencies are the pinned base and the sha256 of each input file, and
    whose byproducts are the layers a rebuild must reproduce (verify.sh compares them)."""
    (tmp_path / "a.lock").write_text("x==1\n")
    out = tmp_path / "record.json"
    layers = ["sha256:" + "1" * 64, "sha256:" + "2" * 64]
    subprocess.run(
        [
            sys.executable, str(IMAGE_DIR / "provenance.py"), "--repo", str(tmp_path), "--image", "dra-gpu:t",
            "--image-id", "sha256:" + "a" * 64, "--revision", "abc1234", "--tree-clean", "true",
            "--source-date-epoch", "1700000000", "--tool", "buildah", "--tool-version", "buildah 1.28",
            "--base", "localhost/base@sha256:" + "b" * 64, "--base-digest", "sha256:" + "b" * 64,
            "--diff-id", layers[0], "--diff-id", layers[1], "--material", "a.lock", "--out", str(out),
        ],
        check=True, timeout=60,
    )  # fmt: skip
    record = json.loads(out.read_text())
    assert record["_type"] == "https://in-toto.io/Statement/v1"
    assert record["predicateType"] == "https://slsa.dev/provenance/v1"
    assert record["subject"] == [{"name": "dra-gpu:t", "digest": {"sha256": "a" * 64}}]
    build = record["predicate"]["buildDefinition"]
    assert build["externalParameters"]["sourceDateEpoch"] == 1700000000
    assert build["externalParameters"]["treeClean"] is True
    assert build["resolvedDependencies"] == [
        {"uri": "localhost/base@sha256:" + "b" * 64, "digest": {"sha256": "b" * 64}},
        {"uri": "a.lock", "digest": {"sha256": hashlib.sha256(b"x==1\n").hexdigest()}},
    ]
    byproducts = record["predicate"]["runDetails"]["byproducts"]
    assert ["sha256:" + b["digest"]["sha256"] for b in byproducts] == layers


def test_verify_without_a_build_record_says_to_build_first(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(IMAGE_DIR / "verify.sh"), "dra-gpu:nothing-built"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "DRA_GPU_IMAGE_META": str(tmp_path)},
    )  # fmt: skip
    assert out.returncode == 1
    assert "no build record" in out.stderr and "make image" in out.stderr
