"""The soak's invariants, read from the simulated hardware (simulator state, MPS daemon records and their
liveness locks) and the filesystem (CDI specs, the plugin directory, /proc/mounts), compared with what the
kubelet knows (kubelet_view), never with the plugin's own records:

- every prepared claim's CDI spec, MIG instances, MPS daemon (running, serving its own device, with its
  limits), compute mode and time-slice are there, and are its own;
- no whole GPU has both MPS clients and a claim given the bare device (consumable shares of both modes);
- nothing exists that no live claim explains: CDI specs, MIG instances, MPS daemons, pipe directories, tmpfs
  mounts, non-default compute modes and time-slices, checkpoint and registry entries;
- a refused claim left nothing (it explains nothing, so anything of it shows up as unexplained);
- the checkpoint stays bounded: its size grows with the claims the node holds, not with the run's length.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_gpu.hardware.sim_tools.mps_records import pipe_dir_key
from tests.soak.kubelet_view import MAY_RUN_MPS, MPS_KINDS, DeviceFacts, Phase, SoakClaim
from tests.soak.soak_node import SoakNode

CONTAINER_MPS_DIR = "/tmp/nvidia-mps"
TIMESLICE_CODES = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
EXCLUSIVE_PROCESS = 3
CHECKPOINT_BASE_BYTES = 2048
SOAK_FILLER = r"\.soak-filler"  # the soak's own (a full disk)
CDI_FILES = re.compile(rf"k8s\.gpu\.nvidia\.com-claim_[0-9a-f-]+\.json|{SOAK_FILLER}")
PLUGIN_FILES = re.compile(
    r"checkpoint\.json|checkpoint\.lock|dra\.sock|node\.lock|gpu-[A-Za-z0-9-]+\.lock|mps|"
    r"sharing-registry\.json|sharing-registry\.json\.lock|device-health\.json|" + SOAK_FILLER + "|"
    # KNOWN, NOT FIXED: a write killed between creating its temp file and renaming it leaves the temp file
    # (named by the dead writer's pid, so never reused); one small file per unlucky kill. Tolerated here.
    r"\.checkpoint\.json\.tmp-\d+-\d+|\.sharing-registry\.json\.\d+\.tmp|\.device-health\.json\.tmp-\d+-\d+"
)
CHECKPOINT_BYTES_PER_CLAIM = 8192


@dataclass(frozen=True)
class Violation:
    rule: str  # a short name, stable across runs (shrinking keeps the same rule failing)
    detail: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.detail}"


def _spec_path(node: SoakNode, uid: str) -> Path:
    return node.node.cdi_root / f"k8s.gpu.nvidia.com-claim_{uid}.json"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def _mps_pipe_dirs(spec: Mapping[str, Any]) -> list[str]:
    """Host paths of the MPS pipe directories the claim's containers use: CUDA_MPS_PIPE_DIRECTORY (default
    /tmp/nvidia-mps), through the spec's mount of /tmp/nvidia-mps."""
    edits = [spec.get("containerEdits") or {}] + [
        d.get("containerEdits") or {} for d in spec.get("devices") or ()
    ]
    found = set()
    for part in edits:
        env = dict(str(e).partition("=")[::2] for e in part.get("env") or ())
        pipe = env.get("CUDA_MPS_PIPE_DIRECTORY", CONTAINER_MPS_DIR)
        for mount in part.get("mounts") or ():
            if mount.get("containerPath") == CONTAINER_MPS_DIR and pipe.startswith(CONTAINER_MPS_DIR):
                found.add(mount["hostPath"] + pipe.removeprefix(CONTAINER_MPS_DIR))
    return sorted(found)


def check(node: SoakNode, claims: Sequence[SoakClaim], facts: Mapping[str, DeviceFacts]) -> list[Violation]:
    out: list[Violation] = []
    state = node.node.sim_state()
    gpus = {g.uuid: g for g in state.gpus}
    lost_uuids = {state.gpus[i].uuid for i in node.lost_gpus}
    explained = [c for c in claims if c.explained]
    by_uid = {c.uid: c for c in claims}
    daemons = node.live_daemons()
    referenced: dict[str, SoakClaim] = {}  # daemon key -> the claim whose spec mounts its pipe directory
    # whole GPU -> {mounts an MPS pipe: a claim that does}: a GPU's MPS clients and a claim given the bare
    # device cannot both work (EXCLUSIVE_PROCESS refuses the bare one's context); admin access only looks
    modes: dict[str, dict[bool, int]] = {}

    # ---- every prepared claim has what it was given, and it is its own
    for claim in claims:
        if claim.phase is not Phase.PREPARED:
            continue
        spec = _read_json(_spec_path(node, claim.uid))
        if spec is None:
            out.append(Violation("spec-missing", f"claim {claim.index} ({claim.kind}) prepared, no CDI spec"))
            continue
        wanted = sorted(cdi.split("=", 1)[1] for d in claim.answer or () for cdi in d[3])
        have = sorted(d["name"] for d in spec.get("devices") or ())
        if wanted != have:
            out.append(
                Violation("spec-devices", f"claim {claim.index}: spec devices {have}, answer {wanted}")
            )
        on_lost = bool(claim.gpu_uuids(facts) & lost_uuids) or claim.hardware_lost
        for device in claim.devices(facts):
            if device.mig_placement is None or on_lost:
                continue
            placements = {(gi.profile_id, gi.start) for gi in gpus[device.gpu_uuid].gpu_instances}
            if device.mig_placement not in placements:
                out.append(
                    Violation("mig-missing", f"claim {claim.index}: no MIG instance for {device.name}")
                )
        sharing = claim.sharing()
        whole_uuids = {d.gpu_uuid for d in claim.devices(facts) if d.type != "mig"}
        mounts = _mps_pipe_dirs(spec)
        if claim.kind != "admin":
            for uuid in whole_uuids:
                modes.setdefault(uuid, {}).setdefault(bool(mounts), claim.index)
        if claim.kind in MPS_KINDS and not mounts:
            out.append(Violation("mps-not-mounted", f"claim {claim.index} ({claim.kind}): no MPS pipe mount"))
        for host_dir in mounts:
            try:
                key = pipe_dir_key(host_dir)
            except OSError:
                out.append(Violation("mps-pipe-missing", f"claim {claim.index}: pipe dir {host_dir} is gone"))
                continue
            referenced[key] = claim
            record = daemons.get(key)
            if record is None:
                # a killed daemon cannot be started again while the plugin directory is full or its GPU is
                # off the bus (the plugin reports it as a sharing problem); judged once that ends
                if not on_lost and "checkpoint" not in node.fillers:
                    out.append(
                        Violation("mps-daemon-missing", f"claim {claim.index} ({claim.kind}): no daemon")
                    )
                continue
            visible = set(record.get("visible_devices") or ())
            if whole_uuids and not visible <= whole_uuids | _mig_uuids(gpus, whole_uuids):
                out.append(
                    Violation("mps-wrong-device", f"claim {claim.index}: daemon serves {sorted(visible)}")
                )
            if claim.kind == "mps":
                pct = (sharing.get("mpsConfig") or {}).get("defaultActiveThreadPercentage")
                if record.get("default_active_thread_percentage") != pct:
                    out.append(
                        Violation(
                            "mps-limit",
                            f"claim {claim.index}: daemon thread % "
                            f"{record.get('default_active_thread_percentage')}, claim {pct}",
                        )
                    )
        if claim.kind in MPS_KINDS - {"mig-mps"}:
            for uuid in whole_uuids - lost_uuids:
                if gpus[uuid].compute_mode != EXCLUSIVE_PROCESS:
                    out.append(
                        Violation("compute-mode", f"claim {claim.index}: GPU {uuid} not EXCLUSIVE_PROCESS")
                    )
        interval = (sharing.get("timeSlicingConfig") or {}).get("interval")
        if sharing.get("strategy") == "TimeSlicing":
            for uuid in whole_uuids:
                if gpus[uuid].timeslice != TIMESLICE_CODES[interval or "Default"]:
                    out.append(
                        Violation(
                            "timeslice", f"claim {claim.index}: GPU {uuid} timeslice {gpus[uuid].timeslice}"
                        )
                    )

    for uuid, by_mode in sorted(modes.items()):
        if len(by_mode) == 2:
            out.append(
                Violation(
                    "share-modes-mixed",
                    f"GPU {uuid}: claim {by_mode[True]} is an MPS client, "
                    f"claim {by_mode[False]} has the bare device",
                )
            )

    # ---- nothing exists that no live claim explains
    live_uids = {c.uid for c in explained}
    for path in sorted(node.node.cdi_root.glob("k8s.gpu.nvidia.com-claim_*.json")):
        uid = path.name.removeprefix("k8s.gpu.nvidia.com-claim_").removesuffix(".json")
        if uid not in live_uids:
            owner = by_uid.get(uid)
            out.append(Violation("spec-leaked", f"CDI spec of {_who(owner, uid)}"))
    mig_owned = {
        (d.gpu_uuid, *d.mig_placement)
        for c in explained
        for d in c.devices(facts)
        if d.mig_placement is not None
    }
    # A GPU off the bus cannot be changed: what the plugin must undo there waits until it is back (judged
    # then, within the settle time).
    for gpu in state.gpus:
        if gpu.uuid in lost_uuids:
            continue
        for gi in gpu.gpu_instances:
            if (gpu.uuid, gi.profile_id, gi.start) not in mig_owned:
                out.append(Violation("mig-leaked", f"MIG instance {gi.profile_id}@{gi.start} on {gpu.uuid}"))
    mps_claims = [c for c in explained if c.kind in MAY_RUN_MPS]
    doubtful_mps = [c for c in mps_claims if c.phase is Phase.IN_DOUBT]
    unreferenced = [k for k in daemons if k not in referenced]
    if len(unreferenced) > len(doubtful_mps):
        out.append(
            Violation(
                "mps-daemon-leaked", f"{len(unreferenced)} daemon(s) no prepared claim mounts: {unreferenced}"
            )
        )
    mps_uuids = {u for c in mps_claims for u in c.gpu_uuids(facts)} | lost_uuids
    for key, record in daemons.items():
        # (a MIG device gone with its GPU's reset is nobody's: its daemon is judged by the pipe mounts above)
        stray = {v for v in record.get("visible_devices") or () if _parent(gpus, v) not in mps_uuids | {None}}
        if stray:
            out.append(
                Violation("mps-daemon-leaked", f"daemon {key} serves {sorted(stray)}: no MPS claim there")
            )
    pipe_root = node.node.plugin_dir / "mps"
    pipe_dirs = sorted(p.name for p in pipe_root.iterdir()) if pipe_root.exists() else []
    if len(pipe_dirs) > len(mps_claims):
        out.append(
            Violation("pipe-dir-leaked", f"{len(pipe_dirs)} pipe directories, {len(mps_claims)} MPS claims")
        )
    for mount in _mounts_under(node.node.plugin_dir):
        inside = Path(mount).relative_to(pipe_root).parts[0] if mount.startswith(f"{pipe_root}/") else None
        if inside is None or inside not in pipe_dirs:
            out.append(Violation("mount-leaked", f"mount {mount} outside any pipe directory"))
    if len(_mounts_under(node.node.plugin_dir)) > 2 * len(mps_claims):  # a server's shm, a claim's shm
        out.append(Violation("mount-leaked", f"{len(_mounts_under(node.node.plugin_dir))} tmpfs mounts"))
    may_exclusive = mps_uuids | {u for c in explained if c.kind == "consumable" for u in c.gpu_uuids(facts)}
    may_timeslice = {
        d.gpu_uuid
        for c in explained
        if c.sharing().get("strategy") == "TimeSlicing"
        for d in c.devices(facts)
        if d.type != "mig"
    }
    for gpu in state.gpus:
        if gpu.uuid in lost_uuids:
            continue
        if gpu.compute_mode != 0 and gpu.uuid not in may_exclusive:
            out.append(Violation("compute-mode-leaked", f"GPU {gpu.uuid} compute mode {gpu.compute_mode}"))
        if gpu.timeslice != 0 and gpu.uuid not in may_timeslice:
            out.append(Violation("timeslice-leaked", f"GPU {gpu.uuid} timeslice {gpu.timeslice}"))

    # ---- no stray files (a write cut short by a kill, a temp file never renamed): the directories would fill
    for directory, allowed in ((node.node.cdi_root, CDI_FILES), (node.node.plugin_dir, PLUGIN_FILES)):
        for name in sorted(os.listdir(directory)):
            if not allowed.fullmatch(name):
                out.append(Violation("file-leaked", f"{directory}/{name}"))

    # ---- the plugin's files hold nothing but live claims, and stay bounded
    checkpoint = node.checkpoint()
    for uid in sorted(set(checkpoint.get("claims") or {}) - live_uids):
        out.append(Violation("checkpoint-leaked", f"checkpoint entry of {_who(by_uid.get(uid), uid)}"))
    limit = CHECKPOINT_BASE_BYTES + CHECKPOINT_BYTES_PER_CLAIM * len(explained)
    if node.checkpoint_bytes() > limit:
        out.append(
            Violation("checkpoint-size", f"{node.checkpoint_bytes()} bytes for {len(explained)} claims")
        )
    registry = _read_json(node.node.plugin_dir / "sharing-registry.json") or {}
    for uuid, served in (registry.get("sharedMps") or {}).items():
        for client in served.get("clients") or {}:
            if client.split("/")[0] not in live_uids:
                out.append(Violation("registry-leaked", f"shares client {client} on {uuid}"))
    return out


def _who(claim: SoakClaim | None, uid: str) -> str:
    return f"claim {claim.index} ({claim.kind}, {claim.phase.value})" if claim else f"unknown claim {uid}"


def _mig_uuids(gpus: Mapping[str, Any], parents: set[str]) -> set[str]:
    return {ci.uuid for p in parents for gi in gpus[p].gpu_instances for ci in gi.compute_instances}


def _parent(gpus: Mapping[str, Any], device_uuid: str) -> str | None:
    for gpu in gpus.values():
        if gpu.uuid == device_uuid:
            return str(gpu.uuid)
        for gi in gpu.gpu_instances:
            if any(ci.uuid == device_uuid for ci in gi.compute_instances):
                return str(gpu.uuid)
    return None


def _mounts_under(directory: Path) -> list[str]:
    prefix = f"{directory}/"
    return [
        line.split()[1]
        for line in Path("/proc/mounts").read_text().splitlines()
        if line.split()[1].startswith(prefix)
    ]
