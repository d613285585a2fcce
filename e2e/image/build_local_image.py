"""Build the driver image for the local e2e cluster without Docker: a rootfs assembled from this machine.

    .venv/bin/python e2e/image/build_local_image.py [--reference registry.local/dra-gpu:dev] [--no-import]

The rootfs holds
- the interpreter behind `.venv` (pyenv's CPython) at /usr/local, with its stdlib minus tests, docs, IDLE,
  tkinter and bytecode caches;
- the runtime distributions named in manifests/image/requirements.lock, copied file by file (their
  RECORD) from the `.venv` site-packages, plus the `dra_gpu` package from this checkout;
- every shared library those ELF files need outside the rootfs (found with `ldd`), at its host path, and the
  dynamic loader; libpython goes to /usr/lib/x86_64-linux-gnu, a directory the loader searches by default
  (the interpreter's RUNPATH names a pyenv directory that does not exist in the image);
- static busybox as /bin/sh, `mount` and `umount` (the plugin mounts tmpfs for MPS) and its other applets;
- `/usr/local/bin/dra-gpu`, the console script the chart runs (`python -m dra_gpu.cli.main`).

The OCI archive comes from e2e/cluster/oci_image.py and is imported into the cluster's containerd. A build is
cached under the content hash of every input file, so an unchanged tree re-imports the cached archive (or
nothing, when containerd already has that digest).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from e2e.cluster.oci_image import ImageSpec, build_archive  # noqa: E402

DEFAULT_REFERENCE = "registry.local/dra-gpu:dev"
IMAGE_PREFIX = Path("usr/local")
LIBPYTHON_DIR = Path("usr/lib/x86_64-linux-gnu")
REQUIREMENTS_LOCK = REPO_ROOT / "manifests" / "image" / "requirements.lock"
BUSYBOX = Path("/bin/busybox")
BUSYBOX_APPLETS = (
    "sh",
    "mount",
    "umount",
    "ls",
    "cat",
    "mkdir",
    "rm",
    "ps",
    "env",
    "sleep",
    "grep",
    "mountpoint",
)
# Stdlib parts the driver never imports; together more than half of the stdlib's size.
STDLIB_SKIP = {
    "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data", "site-packages",
    "unittest", "distutils", "venv", "sqlite3",
}  # fmt: skip
SKIP_DIR_NAMES = {"__pycache__", "tests", "test", "docs", "doc"}
SKIP_SUFFIXES = (".pyc", ".pyo", ".a", ".pyi")
ELF_MAGIC = b"\x7fELF"


class ImageBuildError(RuntimeError):
    """The image cannot be built; the message names the missing input and how to get it."""


@dataclass(frozen=True)
class Entry:
    """One file of the rootfs: where it goes (relative to the rootfs) and where it comes from."""

    dest: Path
    source: Path


def cache_root() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "dra-gpu" / "images" / "driver"


def venv_python() -> Path:
    python = REPO_ROOT / ".venv" / "bin" / "python"
    if not python.exists():
        raise ImageBuildError(f"{python} missing: run `make venv` first")
    return python


def base_prefix() -> Path:
    """The real interpreter's prefix (pyenv), from the venv's own interpreter."""
    out = subprocess.run(
        [str(venv_python()), "-c", "import sys; print(sys.base_prefix)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(out.stdout.strip())


def _skip(rel: Path) -> bool:
    return any(part in SKIP_DIR_NAMES for part in rel.parts[:-1]) or rel.name.endswith(SKIP_SUFFIXES)


def interpreter_entries(prefix: Path) -> Iterator[Entry]:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    binary = prefix / "bin" / version
    if not binary.exists():
        raise ImageBuildError(f"interpreter {binary} missing (prefix from .venv/pyvenv.cfg)")
    yield Entry(IMAGE_PREFIX / "bin" / version, binary)
    stdlib = prefix / "lib" / version
    for path in sorted(stdlib.rglob("*")):
        rel = path.relative_to(stdlib)
        if rel.parts[0] in STDLIB_SKIP or rel.parts[0].startswith("config-") or not path.is_file():
            continue
        if _skip(rel):
            continue
        yield Entry(IMAGE_PREFIX / "lib" / version / rel, path)
    for lib in sorted((prefix / "lib").glob("libpython*.so*")):
        if lib.is_file() and not lib.is_symlink():
            yield Entry(LIBPYTHON_DIR / lib.name, lib)


def locked_names(lock: Path = REQUIREMENTS_LOCK) -> list[str]:
    names: list[str] = []
    for line in lock.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==", line)
        if match:
            names.append(match.group(1))
    if not names:
        raise ImageBuildError(f"{lock} names no `package==version` lines; regenerate it with lock.sh")
    return names


def site_packages_entries(site_packages: Path, names: Iterable[str], version: str) -> Iterator[Entry]:
    """Files of each locked distribution, as listed in its RECORD, from the venv's site-packages."""
    dest_root = IMAGE_PREFIX / "lib" / version / "site-packages"
    for name in names:
        try:
            dist = _find_dist(site_packages, name)
        except metadata.PackageNotFoundError as err:
            raise ImageBuildError(
                f"locked package {name} is not installed in .venv: "
                f"`.venv/bin/pip install -r {REQUIREMENTS_LOCK}`"
            ) from err
        for file in dist.files or ():
            rel = Path(str(file))
            source = (site_packages / rel).resolve()
            if rel.parts[0] == ".." or not source.is_file() or _skip(rel):
                continue
            yield Entry(dest_root / rel, source)


def _find_dist(site_packages: Path, name: str) -> metadata.Distribution:
    found = list(metadata.distributions(name=name, path=[str(site_packages)]))
    if not found:
        found = list(metadata.distributions(name=name.replace("-", "_"), path=[str(site_packages)]))
    if not found:
        raise metadata.PackageNotFoundError(name)
    return found[0]


def project_entries(version: str) -> Iterator[Entry]:
    package = REPO_ROOT / "dra_gpu"
    dest_root = IMAGE_PREFIX / "lib" / version / "site-packages" / "dra_gpu"
    for path in sorted(package.rglob("*")):
        rel = path.relative_to(package)
        if path.is_file() and not _skip(rel):
            yield Entry(dest_root / rel, path)


def is_elf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == ELF_MAGIC


def shared_libraries(elf_files: Iterable[Path], inside: Sequence[Path]) -> set[Path]:
    """Host libraries (and the loader) the ELF files need, except those found under `inside` directories."""
    needed: set[Path] = set()
    for elf in elf_files:
        proc = subprocess.run(["ldd", str(elf)], capture_output=True, text=True, check=False)
        for line in proc.stdout.splitlines():
            if "not found" in line:
                raise ImageBuildError(f"{elf}: `ldd` cannot resolve {line.strip()}; install that library")
            match = re.search(r"(/\S+) \(0x", line)
            if not match:
                continue
            lib = Path(match.group(1))
            if any(lib.is_relative_to(d) for d in inside):
                continue
            needed.add(lib)
    return needed


def library_entries(libs: Iterable[Path], prefix: Path) -> Iterator[Entry]:
    for lib in sorted(libs):
        if lib.is_relative_to(prefix):
            continue  # libpython: placed by interpreter_entries
        # The path the loader asks for (a symlink, e.g. libc.so.6) gets the real file's content.
        yield Entry(Path(*lib.parts[1:]), lib.resolve())


def collect(prefix: Path) -> list[Entry]:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site_packages = REPO_ROOT / ".venv" / "lib" / version / "site-packages"
    entries = [
        *interpreter_entries(prefix),
        *site_packages_entries(site_packages, locked_names(), version),
        *project_entries(version),
    ]
    elves = [
        e.source
        for e in entries
        if e.source.suffix == ".so" or ".so." in e.source.name or e.dest.name == version
    ]
    elves = [p for p in elves if is_elf(p)]
    libs = shared_libraries(elves, inside=(site_packages.resolve(),))
    entries += library_entries(libs, prefix)
    unique: dict[Path, Entry] = {}
    for entry in entries:
        unique.setdefault(entry.dest, entry)
    return sorted(unique.values(), key=lambda e: e.dest)


def content_hash(entries: Sequence[Entry]) -> str:
    """sha256 over every input file's destination, mode and content, plus this builder and oci_image.py."""
    h = hashlib.sha256()
    for extra in (Path(__file__), REPO_ROOT / "e2e" / "cluster" / "oci_image.py", BUSYBOX):
        h.update(extra.read_bytes())
    for entry in entries:
        h.update(str(entry.dest).encode() + b"\0" + oct(entry.source.stat().st_mode & 0o777).encode())
        with entry.source.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def write_rootfs(root: Path, entries: Sequence[Entry]) -> None:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for entry in entries:
        dest = root / entry.dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(entry.source, dest)
    for d in ("tmp", "proc", "sys", "dev", "root", "etc", "run", "var/run", "bin", "sbin", "usr/bin"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    bin_dir = root / IMAGE_PREFIX / "bin"
    for alias in ("python3", "python"):
        (bin_dir / alias).symlink_to(version)
    if not BUSYBOX.exists():
        raise ImageBuildError(f"{BUSYBOX} missing: run e2e/cluster/install-host-deps.sh (busybox-static)")
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    for applet in BUSYBOX_APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    script = bin_dir / "dra-gpu"
    script.write_text(f'#!/bin/sh\nexec /{IMAGE_PREFIX}/bin/{version} -m dra_gpu.cli.main "$@"\n')
    script.chmod(0o755)
    (root / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\ndra-gpu:x:65532:65532:dra-gpu:/nonexistent:/bin/false\n"
    )
    (root / "etc" / "group").write_text("root:x:0:\ndra-gpu:x:65532:\n")


def tree_size(root: Path) -> int:
    return sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


@dataclass(frozen=True)
class BuildResult:
    reference: str
    archive: Path
    digest: str
    rootfs_bytes: int
    archive_bytes: int
    cached: bool
    seconds: float
    kind: str = "local"  # "local": assembled here; "real": the Dockerfile's image (real_image.py)


def build(reference: str = DEFAULT_REFERENCE) -> BuildResult:
    start = time.monotonic()
    entries = collect(base_prefix())
    key = content_hash(entries)
    out_dir = cache_root()
    archive = out_dir / f"{key[:16]}.tar"
    meta_path = out_dir / f"{key[:16]}.json"
    if archive.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("reference") == reference:
            return BuildResult(
                reference, archive, meta["digest"], meta["rootfs_bytes"], archive.stat().st_size, True,
                time.monotonic() - start,
            )  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="drv-img-", dir="/tmp") as tmp:
        root = Path(tmp) / "rootfs"
        write_rootfs(root, entries)
        size = tree_size(root)
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        spec = ImageSpec(
            reference,
            entrypoint=(f"/{IMAGE_PREFIX}/bin/{version}", "-m", "dra_gpu.cli.main"),
            cmd=("--help",),
            env=(
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "PYTHONUNBUFFERED=1",
                "PYTHONDONTWRITEBYTECODE=1",
            ),
            labels={"org.opencontainers.image.title": "dra-gpu", "dra-gpu.content-hash": key},
        )
        digest = build_archive(spec, root, archive)
    for old in out_dir.glob("*.tar"):
        if old != archive:
            old.unlink()
            old.with_suffix(".json").unlink(missing_ok=True)
    meta_path.write_text(json.dumps({"reference": reference, "digest": digest, "rootfs_bytes": size}) + "\n")
    return BuildResult(
        reference, archive, digest, size, archive.stat().st_size, False, time.monotonic() - start
    )


def build_for_cluster(reference: str = DEFAULT_REFERENCE, choice: str | None = None) -> BuildResult:
    """The image the e2e tests install: the Dockerfile's (`make image`) when a container tool is here, else
    the assembled one; `choice` or DRA_GPU_E2E_IMAGE (auto, real, local) decides (real_image.py)."""
    from e2e.image.real_image import build_real, wanted_kind

    if wanted_kind(choice) == "real":
        return replace(build_real(reference), kind="real")
    return build(reference)


def import_into_cluster(result: BuildResult) -> bool:
    """Import the archive into the local cluster's containerd unless it has this digest; True if imported."""
    from e2e.cluster.cluster import Cluster

    cluster = Cluster()
    if not cluster.containerd_sock.exists():
        raise ImageBuildError(
            f"no containerd at {cluster.containerd_sock}: start the cluster (make cluster-up)"
        )
    listed = cluster.ctr("images", "ls", "--quiet", "name==" + result.reference, check=False).stdout.split()
    if listed:
        current = cluster.ctr("images", "ls", "name==" + result.reference, check=False).stdout
        if result.digest in current:
            return False
    cluster.ctr("images", "import", "--no-unpack=false", str(result.archive))
    if result.digest not in cluster.ctr("images", "ls", "name==" + result.reference).stdout:
        raise ImageBuildError(f"{result.reference} not in containerd after importing {result.archive}")
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reference", default=DEFAULT_REFERENCE)
    parser.add_argument("--no-import", action="store_true", help="only build the archive")
    parser.add_argument(
        "--kind", choices=("auto", "real", "local"), default=None,
        help="real: the Dockerfile's image (needs buildah/podman/docker); local: assembled here; "
        "auto (default, or DRA_GPU_E2E_IMAGE): real when a container tool is installed",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        result = build_for_cluster(args.reference, args.kind)
        imported = False
        if not args.no_import:
            t0 = time.monotonic()
            imported = import_into_cluster(result)
            import_s = time.monotonic() - t0
        mib = 1024 * 1024
        print(
            f"[image] {result.kind} {result.reference} {result.digest} "
            f"rootfs {result.rootfs_bytes / mib:.1f} MiB, "
            f"archive {result.archive_bytes / mib:.1f} MiB, "
            f"{'cached' if result.cached else 'built'} in {result.seconds:.1f}s"
            + ("" if args.no_import else f", {'imported' if imported else 'already in containerd'}"
               f" ({import_s:.1f}s)"),
            file=sys.stderr,
        )  # fmt: skip
        print(result.archive)
    except (ImageBuildError, subprocess.CalledProcessError) as err:
        print(f"[image] ERROR: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
