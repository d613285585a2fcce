"""NVIDIA's published DRA examples, applied unchanged but for the container image.

Used by e2e/test_nvidia_conformance.py.

The manifests live byte-for-byte in tests/conformance/nvidia/<example>/ with our own expect.yaml next to them;
catalog.yaml says which ones run, which are expected to fail (work in progress) and which use features dra-gpu
does not implement. This module holds
- the catalog loader and the rendering of the docs table (pure, unit-tested);
- the stand-in image: NVIDIA's manifests run `bash -c "nvidia-smi -L; ... sleep 9999 & wait"` (ubuntu) or
  `bash -c "... /tmp/sample --benchmark ... & wait"` (cuda-sample), and the local cluster has no registry. The
  stand-in is the local busybox image plus `/bin/bash` (busybox sh under that name) and `/tmp/sample` (prints
  the container report, then idles like the benchmark would), with the report as its default command for
  manifests that rely on the image's entrypoint;
- ConformanceRun, the example runner of e2e/lib/example_runner.py with that image, reading each running
  container's report with `kubectl exec` (NVIDIA's commands print nothing we can parse).
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from e2e.lib.container_report import REPORT_COMMAND, ContainerReport, parse_report
from e2e.lib.example_runner import ExampleRun
from e2e.lib.expectations import Observed, phase
from e2e.lib.images import mapping_from_dict, substitute_images
from e2e.lib.kubectl import Kubectl

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFORMANCE_DIR = REPO_ROOT / "tests" / "conformance" / "nvidia"
CATALOG = CONFORMANCE_DIR / "catalog.yaml"
STAND_IN_IMAGE = "registry.local/nvidia-examples:1"
STATUSES = ("run", "xfail", "unverified", "unsupported")
MAKE_E2E_HARDWARE = "dgx-h100"  # the simulated node of `make e2e` (E2ESettings.hardware by default)
TABLE_BEGIN = "<!-- nvidia-conformance-table:begin (generated from tests/conformance/nvidia/catalog.yaml) -->"
TABLE_END = "<!-- nvidia-conformance-table:end -->"

# `bash` as NVIDIA's images provide it: busybox's POSIX shell runs every command line of the examples.
BASH_STAND_IN = '#!/bin/sh\nexec /bin/sh "$@"\n'
# The cuda-sample benchmark: report what the container got, then run until stopped (examples `wait` on it).
SAMPLE_STAND_IN = f"#!/bin/sh\n{REPORT_COMMAND}\nexec sleep 2147483647\n"


class CatalogError(ValueError):
    """catalog.yaml does not fit its format; the message names the entry and field."""


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    files: Mapping[str, str]  # copy (in the example's folder) -> upstream path
    nvidia: str  # what NVIDIA says each pod gets
    status: str  # run | xfail | unsupported
    reason: str = ""

    @property
    def folder(self) -> Path:
        return CONFORMANCE_DIR / self.name


def load_catalog(path: Path = CATALOG) -> list[CatalogEntry]:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("examples"), list):
        raise CatalogError(f"{path}: needs a top-level `examples:` list")
    out: list[CatalogEntry] = []
    for i, raw in enumerate(data["examples"]):
        where = f"{path}: examples[{i}]"
        if not isinstance(raw, dict):
            raise CatalogError(f"{where}: must be a mapping")
        for key in ("name", "files", "nvidia", "status"):
            if key not in raw:
                raise CatalogError(f"{where}: missing `{key}`")
        if raw["status"] not in STATUSES:
            raise CatalogError(f"{where}.status: {raw['status']!r}, use one of {', '.join(STATUSES)}")
        if raw["status"] != "run" and not raw.get("reason"):
            raise CatalogError(f"{where}.reason: a `{raw['status']}` example needs a reason")
        files = raw["files"]
        if not isinstance(files, dict) or not files:
            raise CatalogError(f"{where}.files: a mapping copy -> upstream path, at least one")
        out.append(
            CatalogEntry(
                name=str(raw["name"]),
                files={str(k): str(v) for k, v in files.items()},
                nvidia=str(raw["nvidia"]),
                status=str(raw["status"]),
                reason=str(raw.get("reason") or ""),
            )
        )
    names = [e.name for e in out]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise CatalogError(f"{path}: examples listed twice: {duplicates}")
    return out


def substitute_stand_in(docs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The manifests with every container image replaced by the stand-in image, nothing else changed
    (substitute_images also pins `imagePullPolicy: IfNotPresent`, the default for a tagged image anyway)."""
    return substitute_images(docs, mapping_from_dict({}, default=STAND_IN_IMAGE))[0]


def render_table(entries: Iterable[CatalogEntry], hardware: Mapping[str, str]) -> str:
    """The Markdown table of docs/differences-from-nvidia.md (between TABLE_BEGIN and TABLE_END)."""
    lines = [
        "| NVIDIA example | NVIDIA says | dra-gpu | simulated node |",
        "|---|---|---|---|",
    ]
    for e in entries:
        node = hardware.get(e.name, "-")
        if e.status == "run" and node == MAKE_E2E_HARDWARE:
            ours = "the same; `make e2e` asserts it from inside the pods"
        elif e.status == "run":
            ours = (
                f"the same; `make e2e` asserts it from inside the pods, with the host plugin switched to a "
                f"simulated {node} set up as NVIDIA's instructions say (its expect.yaml); skipped on kind"
            )
        elif e.status == "xfail":
            ours = f"expected failure for now: {e.reason}"
        elif e.status == "unverified":
            ours = f"not verified, skipped: {e.reason}"
        else:
            ours = f"not supported, skipped: {e.reason}"
        sources = ", ".join(f"`{p.removeprefix('demo/specs/')}`" for p in e.files.values())
        lines.append(f"| {e.name} ({sources}) | {e.nvidia} | {ours} | {node} |")
    return "\n".join(lines)


def expected_hardware(entries: Iterable[CatalogEntry]) -> dict[str, str]:
    """example -> the simulated node its expect.yaml is written for (examples that run or xfail)."""
    from tests.deploy.expect_model import load_expectation

    return {
        e.name: load_expectation(e.folder / "expect.yaml").hardware
        for e in entries
        if (e.folder / "expect.yaml").exists()
    }


def table_in(doc: str) -> str | None:
    """The generated table in a document, or None without the markers."""
    if TABLE_BEGIN not in doc or TABLE_END not in doc:
        return None
    return doc.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0].strip("\n")


# ------------------------------------------------------------------------------------------- stand-in image


def _stand_in_rootfs(root: Path) -> None:
    from e2e.cluster.cluster import _busybox_rootfs

    _busybox_rootfs(root)
    for path, text in ((root / "bin" / "bash", BASH_STAND_IN), (root / "tmp" / "sample", SAMPLE_STAND_IN)):
        path.write_text(text)
        path.chmod(0o755)


def import_stand_in_image(kind_cluster: str | None = None) -> None:
    """Build the stand-in image and import it into the local cluster's containerd, or load it into the nodes
    of the named kind cluster (`kind load image-archive`)."""
    from e2e.cluster.cluster import Cluster, ClusterError
    from e2e.cluster.oci_image import ImageSpec, build_archive

    with tempfile.TemporaryDirectory(prefix="nvidia-examples-", dir="/tmp") as tmp:
        root = Path(tmp) / "rootfs"
        _stand_in_rootfs(root)
        archive = Path(tmp) / "image.tar"
        build_archive(ImageSpec(STAND_IN_IMAGE, cmd=("sh", "-c", REPORT_COMMAND)), root, archive)
        if kind_cluster:
            subprocess.run(
                ["kind", "load", "image-archive", "--name", kind_cluster, str(archive)],
                check=True,
                capture_output=True,
            )
            return
        cluster = Cluster()
        # Always import: the reference may name an older build.
        cluster.ctr("images", "import", "--no-unpack=false", str(archive), check=False)
        if STAND_IN_IMAGE not in cluster.ctr("images", "ls", "-q").stdout.split():
            cluster.ctr("images", "import", str(archive))
        if STAND_IN_IMAGE not in cluster.ctr("images", "ls", "-q").stdout.split():
            raise ClusterError(f"image {STAND_IN_IMAGE} missing after `ctr images import {archive}`")


# ------------------------------------------------------------------------------------------------- runner


def unserved_api_versions(docs: Iterable[Mapping[str, Any]], kubectl: Kubectl) -> list[str]:
    """apiVersions of the manifests the cluster does not serve (e.g. resource.k8s.io/v1beta1 if off)."""
    served = set(kubectl.run("api-versions").stdout.split())
    wanted = {str(d.get("apiVersion")) for d in docs if d.get("apiVersion")}
    return sorted(v for v in wanted if v not in served and "/" in v)


def raw_documents(entry: CatalogEntry, manifests: Iterable[str]) -> list[dict[str, Any]]:
    return [
        d
        for name in manifests
        for d in yaml.safe_load_all((entry.folder / name).read_text())
        if isinstance(d, dict)
    ]


class ConformanceRun(ExampleRun):
    """ExampleRun on NVIDIA's manifests: stand-in image, container reports read with `kubectl exec`."""

    def documents(self) -> list[list[dict[str, Any]]]:
        out = []
        for name in self.exp.manifests:
            docs = [d for d in yaml.safe_load_all((self.folder / name).read_text()) if isinstance(d, dict)]
            out.append(substitute_stand_in(docs))
        return out

    def _exec_report(self, pod: str, container: str) -> ContainerReport:
        result = self.kubectl.run(
            "exec", "-n", self.namespace, pod, "-c", container, "--", "sh", "-c", REPORT_COMMAND, check=False
        )
        return parse_report(result.stdout) if result.returncode == 0 else ContainerReport()

    def observe(self) -> Observed:
        # Running containers are asked directly; ExampleRun.observe falls back to the logs of the others (the
        # stand-in image's default command and /tmp/sample print the report themselves).
        for pod in self.kubectl.items("pods", self.namespace):
            if phase(pod) != "Running":
                continue
            running = {
                s["name"]
                for s in (pod.get("status") or {}).get("containerStatuses") or []
                if "running" in (s.get("state") or {})
            }
            for name in sorted(running):
                key = f"{pod['metadata']['name']}/{name}"
                if not self._reports.get(key, ContainerReport()).complete:
                    report = self._exec_report(pod["metadata"]["name"], name)
                    if report.complete:
                        self._reports[key] = report
        return super().observe()


def consumable_shares_modes(slice_devices: Mapping[Any, Mapping[str, Any]]) -> set[str]:
    """The --consumable-shares modes the published whole-GPU devices show (NVIDIA's three): `integer` with a
    `shares` capacity, else `unlimited` when the memory request policy defaults to 0, else `memory`. Devices
    without allowMultipleAllocations, and our own `gpu-share` devices, show none."""
    modes: set[str] = set()
    for dev in slice_devices.values():
        if not dev.get("allowMultipleAllocations"):
            continue
        if ((dev.get("attributes") or {}).get("type") or {}).get("string") != "gpu":
            continue
        capacity = dev.get("capacity") or {}
        if "shares" in capacity:
            modes.add("integer")
            continue
        default = str(((capacity.get("memory") or {}).get("requestPolicy") or {}).get("default", ""))
        modes.add("unlimited" if default in ("0", "0Mi", "0Gi") else "memory")
    return modes
