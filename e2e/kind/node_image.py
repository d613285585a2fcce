"""Assemble a kind node image from the binaries e2e/cluster/build.sh made, for a machine with no registry.

kind's published node images (kindest/node) and the images they carry come from registries this machine cannot
reach. This builds the same thing from parts that are here, following kind's own recipe (its module's
images/base/Dockerfile and pkg/build/nodeimage):

1. a Debian bookworm root filesystem (debootstrap, with the packages kind's base image installs), cached;
2. kind's base files from the pinned kind module (entrypoint, systemd units, containerd config, ...), our
   containerd, runc and CNI plugins, and kubeadm, kubelet and kubectl;
3. the images kubeadm runs (kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, etcd,
   coredns, pause) as OCI archives under /kind/images, built from our binaries, imported by a oneshot unit
   that runs before the kubelet (kind imports them at image build time, which needs a running containerd);
4. `docker import` of that tree, with kind's entrypoint.

    python3 e2e/kind/node_image.py [--kubernetes-version v1.37.2] [--rebuild]

Prints the image reference (dra-gpu/kind-node:<version>-<recipe digest>). A second run with the same inputs
finds the image and does nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))

from e2e.cluster.oci_image import ImageSpec, build_archive  # noqa: E402
from tests.support.control_plane import cache_dir, read_versions  # noqa: E402

RELEASE = "bookworm"
MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
# kind's base image package list, less what only rootless or storage tests use (fuse-overlayfs, nfs-common,
# open-iscsi).
PACKAGES = (
    "systemd,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,"
    "e2fsprogs,bash,ca-certificates,curl,jq,procps"
)
ROOTFS_RECIPE = f"debootstrap --variant=minbase --include={PACKAGES} {RELEASE}"
# kind's containerd config names this sandbox image; kubeadm's own list is for its preflight pull only.
PAUSE_REF = "registry.k8s.io/pause:3.10"
# What kind's base image carries (e2e/kind/cni.py uses ptp, as kindnetd does).
CNI_PLUGINS = ("ptp", "host-local", "loopback", "portmap")
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
IMPORT_UNIT = """[Unit]
Description=Import the node image's container images (kind node images carry them; nothing is pulled)
After=containerd.service
Requires=containerd.service
Before=kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -euc 'for f in /kind/images/*.tar; do ctr --namespace k8s.io images import "$f"; done'

[Install]
RequiredBy=kubelet.service
"""


def log(msg: str) -> None:
    print(f"[kind-node] {msg}", file=sys.stderr, flush=True)


def run(argv: Sequence[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), check=True, text=True, **kw)  # type: ignore[call-overload,no-any-return]


def module_dir(module: str) -> Path:
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local", "GOWORK": "off"}
    out = run(["go", "mod", "download", "-json", module], capture_output=True, env=env, cwd="/tmp").stdout
    return Path(json.loads(out)["Dir"])


def base_rootfs(cache: Path) -> Path:
    """The Debian root filesystem tarball, made once per recipe."""
    digest = hashlib.sha256(ROOTFS_RECIPE.encode()).hexdigest()[:12]
    tarball = cache / "images" / "kind-base" / f"debian-{RELEASE}-kind-{digest}.tar"
    if tarball.exists():
        return tarball
    tarball.parent.mkdir(parents=True, exist_ok=True)
    if shutil.which("debootstrap") is None:
        raise SystemExit("debootstrap is not installed: run e2e/cluster/install-host-deps.sh kind")
    with tempfile.TemporaryDirectory(prefix="kind-base-", dir="/tmp") as tmp:
        root = Path(tmp) / "root"
        log(f"debootstrap {RELEASE} (minbase + kind's packages) ...")
        with open(Path(tmp) / "debootstrap.log", "w") as out:
            proc = subprocess.run(
                ["debootstrap", "--variant=minbase", f"--include={PACKAGES}", RELEASE, str(root), MIRROR],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        if proc.returncode != 0:
            sys.stderr.write((Path(tmp) / "debootstrap.log").read_text()[-3000:])
            raise SystemExit("debootstrap failed")
        for junk in (
            "var/cache/apt",
            "var/lib/apt/lists",
            "usr/share/doc",
            "usr/share/man",
            "usr/share/locale",
        ):
            shutil.rmtree(root / junk, ignore_errors=True)
        for name in ("etc/hostname", "etc/resolv.conf"):
            (root / name).unlink(missing_ok=True)
        run(["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-cf", f"{tarball}.tmp", "."])
        Path(f"{tarball}.tmp").replace(tarball)
    return tarball


def copy_tree(src: Path, dest: Path, mode: int) -> None:
    for path in sorted(src.rglob("*")):
        target = dest / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            target.chmod(0o755)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            target.chmod(mode)


def install_kind_base_files(root: Path, kind_src: Path) -> None:
    """What kind's base Dockerfile COPYs and RUNs, on our root filesystem."""
    files = kind_src / "images" / "base" / "files"
    copy_tree(files / "usr" / "local" / "bin", root / "usr" / "local" / "bin", 0o755)
    copy_tree(files / "kind", root / "kind", 0o644)
    copy_tree(files / "kind" / "bin", root / "kind" / "bin", 0o755)
    copy_tree(files / "etc", root / "etc", 0o644)
    # systemd in a container: no tmpfiles setup, no units wanted by default but the ones enabled below.
    for pattern in (
        "lib/systemd/system/sysinit.target.wants/systemd-tmpfiles-setup.service",
        "lib/systemd/system/multi-user.target.wants/*",
        "etc/systemd/system/*.wants/*",
        "lib/systemd/system/local-fs.target.wants/*",
        "lib/systemd/system/sockets.target.wants/*udev*",
        "lib/systemd/system/sockets.target.wants/*initctl*",
        "lib/systemd/system/basic.target.wants/*",
    ):
        for path in root.glob(pattern):
            path.unlink()
    with open(root / "etc" / "systemd" / "journald.conf", "a") as conf:
        conf.write("ReadKMsg=no\n")
    init = root / "sbin" / "init"
    init.unlink(missing_ok=True)
    init.symlink_to("/usr/lib/systemd/systemd")
    (root / "etc" / "kubernetes" / "manifests").mkdir(parents=True, exist_ok=True)


def install_binaries(root: Path, bin_dir: Path) -> None:
    def put(src: Path, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        dest.chmod(0o755)

    for name in ("containerd", "containerd-shim-runc-v2", "ctr"):
        put(bin_dir / name, root / "usr" / "local" / "bin" / name)
    put(bin_dir / "runc", root / "usr" / "local" / "sbin" / "runc")
    for name in CNI_PLUGINS:
        put(bin_dir / "cni" / name, root / "opt" / "cni" / "bin" / name)
    for name in ("kubeadm", "kubelet", "kubectl"):
        put(bin_dir / name, root / "usr" / "bin" / name)
    # kind's base generates this from `ctr oci spec`: its default spec, without rlimits (the kubelet sets
    # them) and with the hook that mounts the node's product_uuid/product_name into containers.
    spec = json.loads(run([str(bin_dir / "ctr"), "oci", "spec"], capture_output=True).stdout)
    spec.pop("rlimits", None)
    spec.get("process", {}).pop("rlimits", None)
    spec.setdefault("hooks", {}).setdefault("createContainer", []).append(
        {"path": "/kind/bin/mount-product-files.sh"}
    )
    (root / "etc" / "containerd" / "cri-base.json").write_text(json.dumps(spec, indent=2))


def build_images(root: Path, bin_dir: Path, version: str, etcd_tag: str, coredns: Path | None) -> None:
    images = root / "kind" / "images"
    images.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kind-img-", dir="/tmp") as tmp:

        def image(ref: str, binary: Path, entry: str, name: str, entrypoint: Sequence[str] = ()) -> None:
            rootfs = Path(tmp) / name
            dest = rootfs / entry.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(binary, dest)
            dest.chmod(0o755)
            for d in ("tmp", "etc", "var"):
                (rootfs / d).mkdir(exist_ok=True)
            build_archive(ImageSpec(ref, entrypoint=tuple(entrypoint)), rootfs, images / f"{name}.tar")

        # kubeadm's static pods run the command by name; the binaries are static, so no base is needed.
        for name in CONTROL_PLANE:
            image(f"registry.k8s.io/{name}:{version}", bin_dir / name, f"/usr/local/bin/{name}", name)
        image(f"registry.k8s.io/etcd:{etcd_tag}", bin_dir / "etcd", "/usr/local/bin/etcd", "etcd")
        if coredns is not None:
            image(
                f"registry.k8s.io/coredns/coredns:{coredns.name}",
                coredns / "coredns",
                "/coredns",
                "coredns",
                entrypoint=("/coredns",),
            )
        pause = Path(tmp) / "pause"
        pause.mkdir()
        run(["gcc", "-static", "-O2", "-o", str(pause / "pause"), str(REPO / "e2e" / "cluster" / "pause.c")])
        build_archive(ImageSpec(PAUSE_REF, entrypoint=("/pause",)), pause, images / "pause.tar")
    # kube-proxy programs iptables/nftables: its image is the node's own Debian tree plus the binary (as the
    # upstream image is Debian's iptables image plus the binary).
    proxy_bin = root / "usr" / "local" / "bin" / "kube-proxy"
    shutil.copyfile(bin_dir / "kube-proxy", proxy_bin)
    proxy_bin.chmod(0o755)
    build_archive(
        ImageSpec(f"registry.k8s.io/kube-proxy:{version}"),
        root,
        images / "kube-proxy.tar",
        exclude=("kind/images",),
    )
    proxy_bin.unlink()
    unit = root / "etc" / "systemd" / "system" / "dra-gpu-kind-images.service"
    unit.write_text(IMPORT_UNIT)


def enable_units(root: Path) -> None:
    run(
        [
            "chroot",
            str(root),
            "systemctl",
            "enable",
            "kubelet.service",
            "containerd.service",
            "undo-mount-hacks.service",
            "dra-gpu-kind-images.service",
        ],
        capture_output=True,
    )
    run(["chroot", str(root), "systemctl", "mask", "systemd-binfmt.service"], capture_output=True)


def recipe_digest(bin_dir: Path, kind_version: str, coredns: Path | None) -> str:
    h = hashlib.sha256()
    h.update(ROOTFS_RECIPE.encode())
    h.update(kind_version.encode())
    h.update(Path(__file__).read_bytes())
    h.update((REPO / "e2e" / "cluster" / "oci_image.py").read_bytes())
    for stamp in sorted((bin_dir / ".stamps").glob("*")):
        h.update(stamp.name.encode() + stamp.read_bytes())
    if coredns is not None:
        h.update(coredns.name.encode())
    return h.hexdigest()[:12]


def image_exists(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kubernetes-version", default=os.environ.get("KUBERNETES_VERSION"))
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args(argv)
    pinned = read_versions()
    version = args.kubernetes_version or pinned["KUBERNETES_VERSION"]
    cache = cache_dir()
    bin_dir = cache / "k8s" / version / "bin"
    missing = [
        b for b in ("kubeadm", "kube-proxy", "kubelet", "etcd", "containerd") if not (bin_dir / b).exists()
    ]
    if missing:
        raise SystemExit(f"missing {', '.join(missing)} in {bin_dir}: run e2e/cluster/build.sh all kind")
    kind_version = pinned["KIND_VERSION"]
    coredns_dir = cache / "coredns" / pinned.get("COREDNS_VERSION", "unset")
    coredns = coredns_dir if (coredns_dir / "coredns").exists() else None
    ref = f"dra-gpu/kind-node:{version}-{recipe_digest(bin_dir, kind_version, coredns)}"
    if image_exists(ref) and not args.rebuild:
        print(ref)
        return 0
    tarball = base_rootfs(cache)
    kind_src = module_dir(f"sigs.k8s.io/kind@{kind_version}")
    etcd_tag = pinned["ETCD_VERSION"].lstrip("v") + "-0"
    with tempfile.TemporaryDirectory(prefix="kind-node-", dir="/tmp") as tmp:
        root = Path(tmp) / "root"
        root.mkdir()
        with tarfile.open(tarball) as tar:
            tar.extractall(root, numeric_owner=True, filter="fully_trusted")
        install_kind_base_files(root, kind_src)
        install_binaries(root, bin_dir)
        (root / "kind" / "version").write_text(version)
        log("building the control-plane images ...")
        build_images(root, bin_dir, version, etcd_tag, coredns)
        enable_units(root)
        log(f"docker import -> {ref}")
        tar = subprocess.Popen(
            ["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-c", "."], stdout=subprocess.PIPE
        )
        # kind's image also sets STOPSIGNAL SIGRTMIN+3, which `docker import` (20.10) refuses; kind removes
        # its nodes with `docker rm -f`, so no stop signal is ever sent.
        changes = [
            'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]',
            "ENV container=docker",
            # run.sh tags kubeadm's etcd and CoreDNS images from these: the image is the one place that knows.
            f"LABEL dra-gpu.kubernetes-version={version} dra-gpu.etcd-image-tag={etcd_tag}"
            f" dra-gpu.coredns-image-tag={coredns.name if coredns else ''}",
        ]
        cmd = ["docker", "import"]
        for change in changes:
            cmd += ["--change", change]
        run([*cmd, "-", ref], stdin=tar.stdout, stdout=subprocess.DEVNULL)
        if tar.wait() != 0:
            raise SystemExit("tar of the node root failed")
    print(ref)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
