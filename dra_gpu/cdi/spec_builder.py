"""Build the per-claim CDI spec (pure).

One transient spec per claim, `<cdi root>/k8s.gpu.nvidia.com-claim_<claimUID>.json`, kind
`k8s.gpu.nvidia.com/claim`, one CDI device per allocated device named `<claimUID>-<device>` (CDI names are
cached by runtimes and must never be reused, hence the claim UID). Visibility comes from device nodes only: no
`NVIDIA_VISIBLE_DEVICES` (nvidia-conventions §9).

Layout of the edits:
- spec-level `containerEdits`: what every container using any device of the claim needs: the driver's control
  nodes and libraries (`DriverEdits`), plus informative env `DRA_GPU_CLAIM=<ns>/<name>` and
  `DRA_GPU_DEVICES=<uuids>`.
- per-device `containerEdits`: `/dev/nvidia<minor>` of the (parent) GPU, for MIG the two capability nodes
  `/dev/nvidia-caps/nvidia-cap<N>`, and the edits of the device's sharing group (MPS pipe/shm, env).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_gpu.sharing.interface import CdiDeviceNode, CdiEdits, CdiMount

CDI_VENDOR = "k8s.gpu.nvidia.com"
CDI_CLASS = "claim"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"
# 0.5.0 brought device names that start with a digit (claim UIDs do) and `hostPath` on device nodes;
# 0.6.0 is read by every containerd 2.x / CRI-O in support and leaves room for annotations.
CDI_VERSION = "0.6.0"
READ_ONLY_BIND = ("ro", "nosuid", "nodev", "bind")


@dataclass(frozen=True)
class CdiHook:
    hook_name: str  # "createContainer", ...
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()


@dataclass(frozen=True)
class DriverEdits:
    """Edits common to every GPU container on this node: control device nodes, driver libraries and tools."""

    device_nodes: tuple[CdiDeviceNode, ...] = ()
    mounts: tuple[CdiMount, ...] = ()
    hooks: tuple[CdiHook, ...] = ()
    env: tuple[str, ...] = ()
    source: str = "driver-root"  # "driver-root" (own discovery) or "nvidia-ctk"


@dataclass(frozen=True)
class ClaimDevice:
    """One allocated device as the container should see it."""

    name: str  # DRA device name, "gpu-0"
    uuids: tuple[str, ...]  # GPU or MIG UUID(s), informative
    device_nodes: tuple[CdiDeviceNode, ...]  # its own nodes: /dev/nvidia<minor>, MIG capability nodes
    group_edits: CdiEdits = field(default_factory=CdiEdits)


def cdi_device_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def cdi_device_id(claim_uid: str, device: str) -> str:
    return f"{CDI_KIND}={cdi_device_name(claim_uid, device)}"


def spec_file_name(claim_uid: str, extension: str = "json") -> str:
    return f"{CDI_VENDOR}-{CDI_CLASS}_{claim_uid}.{extension}"


def claim_uid_from_file_name(name: str) -> str | None:
    prefix = f"{CDI_VENDOR}-{CDI_CLASS}_"
    for extension in (".json", ".yaml"):
        if name.startswith(prefix) and name.endswith(extension):
            return name[len(prefix) : -len(extension)] or None
    return None


def host_path_under(driver_root: str, path: str) -> str | None:
    """Host path of `path` (absolute, as the container sees it) when the driver lives under another root."""
    root = driver_root.rstrip("/")
    return None if root in ("", "/") else f"{root}{path}"


def device_node(driver_root: str, path: str) -> CdiDeviceNode:
    return CdiDeviceNode(path=path, host_path=host_path_under(driver_root, path))


def gpu_device_nodes(driver_root: str, minor: int) -> tuple[CdiDeviceNode, ...]:
    return (device_node(driver_root, f"/dev/nvidia{minor}"),)


def mig_capability_nodes(driver_root: str, cap_minors: Sequence[int]) -> tuple[CdiDeviceNode, ...]:
    return tuple(device_node(driver_root, f"/dev/nvidia-caps/nvidia-cap{n}") for n in cap_minors)


def _node_json(node: CdiDeviceNode) -> dict[str, Any]:
    out: dict[str, Any] = {"path": node.path}
    if node.host_path is not None and node.host_path != node.path:
        out["hostPath"] = node.host_path
    return out


def _mount_json(mount: CdiMount) -> dict[str, Any]:
    return {
        "hostPath": mount.host_path,
        "containerPath": mount.container_path,
        "options": list(mount.options),
    }


def _hook_json(hook: CdiHook) -> dict[str, Any]:
    out: dict[str, Any] = {"hookName": hook.hook_name, "path": hook.path}
    if hook.args:
        out["args"] = list(hook.args)
    if hook.env:
        out["env"] = list(hook.env)
    return out


def _edits_json(
    env: Sequence[str],
    device_nodes: Sequence[CdiDeviceNode],
    mounts: Sequence[CdiMount],
    hooks: Sequence[CdiHook] = (),
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if env:
        out["env"] = list(dict.fromkeys(env))
    nodes = list({n.path: n for n in device_nodes}.values())  # one entry per container path
    if nodes:
        out["deviceNodes"] = [_node_json(n) for n in nodes]
    unique_mounts = list({m.container_path: m for m in mounts}.values())
    if unique_mounts:
        out["mounts"] = [_mount_json(m) for m in unique_mounts]
    if hooks:
        out["hooks"] = [_hook_json(h) for h in hooks]
    return out


def build_claim_spec(
    claim_uid: str,
    claim_ref: str,
    devices: Sequence[ClaimDevice],
    driver: DriverEdits,
    extra_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The CDI spec (JSON-ready dict) for one claim."""
    uuids = [u for d in devices for u in d.uuids]
    env = [f"DRA_GPU_CLAIM={claim_ref}", f"DRA_GPU_DEVICES={','.join(uuids)}", *driver.env]
    env += [f"{k}={v}" for k, v in sorted((extra_env or {}).items())]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [
            {
                "name": cdi_device_name(claim_uid, d.name),
                "containerEdits": _edits_json(
                    d.group_edits.env,
                    (*d.device_nodes, *d.group_edits.device_nodes),
                    d.group_edits.mounts,
                ),
            }
            for d in devices
        ],
        "containerEdits": _edits_json(env, driver.device_nodes, driver.mounts, driver.hooks),
    }
