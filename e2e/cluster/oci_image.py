"""Build single-layer OCI image archives from local files, for a cluster that has no registry.

`ctr -n k8s.io images import` reads the archive (OCI image layout in a tar) and names the image after the
`io.containerd.image.name` annotation, so pods can use it with `imagePullPolicy: Never`.

    python3 oci_image.py NAME:TAG OUT.tar ROOTFS_DIR [--entrypoint /pause] [--cmd sh]

Layer and archive are written deterministically (sorted entries, fixed mtimes, root ownership), so the same
input gives the same image digest and a re-import is a no-op.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

FIXED_MTIME = 0
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"


@dataclass(frozen=True)
class ImageSpec:
    """What goes into the image config besides the layer."""

    reference: str  # e.g. registry.local/pause:3.10
    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    env: Sequence[str] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
    architecture: str = "amd64"
    os: str = "linux"
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def tag(self) -> str:
        name, sep, tag = self.reference.rpartition(":")
        if not sep or "/" in tag or not name:
            raise ValueError(
                f"image reference {self.reference!r} needs a tag, like registry.local/pause:3.10"
            )
        return tag


def _layer_tar(rootfs: Path, exclude: Sequence[str] = ()) -> bytes:
    """An uncompressed tar of rootfs with root ownership and fixed times (paths relative, sorted).

    exclude: relative paths left out, with everything under them."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        entries = sorted(p for p in rootfs.rglob("*"))
        for path in entries:
            rel = path.relative_to(rootfs).as_posix()
            if any(rel == ex or rel.startswith(ex + "/") for ex in exclude):
                continue
            info = tar.gettarinfo(str(path), arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = FIXED_MTIME
            if stat.S_ISREG(os.lstat(path).st_mode):
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def _gzip(data: bytes) -> bytes:
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=FIXED_MTIME, compresslevel=6) as gz:
        gz.write(data)
    return out.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def build_archive(spec: ImageSpec, rootfs: Path, out: Path, exclude: Sequence[str] = ()) -> str:
    """Write the OCI archive for rootfs (less the relative paths in exclude) to out; return the manifest
    digest."""
    if not rootfs.is_dir():
        raise FileNotFoundError(f"rootfs {rootfs} is not a directory")
    raw_layer = _layer_tar(rootfs, exclude)
    layer = _gzip(raw_layer)
    config = {
        "architecture": spec.architecture,
        "os": spec.os,
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "Env": list(spec.env),
            **({"Entrypoint": list(spec.entrypoint)} if spec.entrypoint else {}),
            **({"Cmd": list(spec.cmd)} if spec.cmd else {}),
            **({"Labels": dict(spec.labels)} if spec.labels else {}),
        },
        # diff_ids are digests of the uncompressed layer.
        "rootfs": {"type": "layers", "diff_ids": [_digest(raw_layer)]},
    }
    config_bytes = _canonical(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": _digest(config_bytes), "size": len(config_bytes)},
        "layers": [{"mediaType": MEDIA_LAYER_GZIP, "digest": _digest(layer), "size": len(layer)}],
    }
    manifest_bytes = _canonical(manifest)
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": _digest(manifest_bytes),
                "size": len(manifest_bytes),
                "platform": {"architecture": spec.architecture, "os": spec.os},
                "annotations": {
                    "io.containerd.image.name": spec.reference,
                    "org.opencontainers.image.ref.name": spec.tag,
                },
            }
        ],
    }
    files: list[tuple[str, bytes]] = [
        ("oci-layout", _canonical({"imageLayoutVersion": "1.0.0"})),
        ("index.json", _canonical(index)),
    ]
    for blob in (config_bytes, manifest_bytes, layer):
        files.append((f"blobs/sha256/{_digest(blob).removeprefix('sha256:')}", blob))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            info.mtime = FIXED_MTIME
            tar.addfile(info)
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            info.mtime = FIXED_MTIME
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(out)
    return _digest(manifest_bytes)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("reference")
    parser.add_argument("out", type=Path)
    parser.add_argument("rootfs", type=Path)
    parser.add_argument("--entrypoint", action="append", default=[])
    parser.add_argument("--cmd", action="append", default=[])
    args = parser.parse_args(argv)
    digest = build_archive(ImageSpec(args.reference, args.entrypoint, args.cmd), args.rootfs, args.out)
    print(digest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
