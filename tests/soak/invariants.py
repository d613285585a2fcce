"""The soak's invariants, read from the simulated hardware (simulator state, MPS daemon records and their
liveness locks) and the filesystem (CDI specs, the plugin directory, /proc/mounts), compared with what the
kubelet and the scheduler know (kubelet_view: each claim's allocation and phase), never with the plugin's own
records:

- every prepared claim's CDI spec names its allocated devices, and its device nodes give exactly those
  (the GPU, or the MIG device at the allocated placement); its MIG instances, MPS daemon (running, serving
  its own device, with its config's limits), compute mode and time-slice are there;
- no whole GPU has both MPS clients and a claim given the bare device (consumable shares of both modes);
- nothing exists that no live claim explains, matched claim by claim: a claim not prepared and not in doubt
  has no CDI spec, checkpoint or registry entry, daemon directory, /dev/shm of its own, and no daemon runs
  for it; a GPU's shares server (directory, daemon, mounts) exists only while a share of that GPU is live; a
  non-default compute mode only on a GPU with a live whole-GPU MPS claim (a consumable share that takes the
  bare device explains none); a MIG instance only where a live claim has its placement;
- a refused claim left nothing (it explains nothing, so anything of it shows up as unexplained);
- the checkpoint stays bounded: its size grows with the claims the node holds, not with the run's length.

`ASYNC_RULES` are the ones the plugin repairs later rather than at once (a killed daemon restarted by the
next reconcile pass, a GPU's settings put back once it is back): only those may take time to heal, and only
while a fault that calls for such a repair is recent (tests/soak/run.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_gpu.hardware.sim_tools.device_nodes import visible_devices
from dra_gpu.hardware.sim_tools.mps_records import pipe_dir_key
from tests.soak.kubelet_view import MPS_KINDS, DeviceFacts, Phase, SoakClaim
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
SHARES_KINDS = frozenset({"fraction", "consumable-mps", "consumable-memory"})
OWN_DAEMON_KINDS = frozenset({"mps", "mig-mps"})
WHOLE_GPU_MPS = SHARES_KINDS | {"mps"}  # their GPU is in EXCLUSIVE_PROCESS while they are live
SHARES_DIR = "shares-"
ASYNC_RULES = frozenset(
    {
        "mps-daemon-missing",
        "mps-limit",
        "compute-mode",
        "compute-mode-leaked",
        "timeslice-leaked",
        "mig-leaked",
        "caps-not-largest-share",
    }
)


@dataclass(frozen=True)
class Violation:
    rule: str  # a short name, stable across runs (shrinking keeps the same rule failing)
    detail: str
    claim: int | None = None  # the index of the claim it is about, where it is about one

    def __str__(self) -> str:
        return f"[{self.rule}] {self.detail}"


def _spec_path(node: SoakNode, uid: str) -> Path:
    return node.node.cdi_root / f"k8s.gpu.nvidia.com-claim_{uid}.json"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def _edits(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [spec.get("containerEdits") or {}] + [
        d.get("containerEdits") or {} for d in spec.get("devices") or ()
    ]


def _mps_pipe_dirs(spec: Mapping[str, Any]) -> list[str]:
    """Host paths of the MPS pipe directories the claim's containers use: CUDA_MPS_PIPE_DIRECTORY (default
    /tmp/nvidia-mps), through the spec's mount of /tmp/nvidia-mps."""
    found = set()
    for part in _edits(spec):
        env = dict(str(e).partition("=")[::2] for e in part.get("env") or ())
        pipe = env.get("CUDA_MPS_PIPE_DIRECTORY", CONTAINER_MPS_DIR)
        for mount in part.get("mounts") or ():
            if mount.get("containerPath") == CONTAINER_MPS_DIR and pipe.startswith(CONTAINER_MPS_DIR):
                found.add(mount["hostPath"] + pipe.removeprefix(CONTAINER_MPS_DIR))
    return sorted(found)


def _device_nodes(spec: Mapping[str, Any]) -> set[str]:
    return {str(n["path"]) for part in _edits(spec) for n in part.get("deviceNodes") or ()}


def _allocated_uuids(claim: SoakClaim, facts: Mapping[str, DeviceFacts], gpus: Mapping[str, Any]) -> set[str]:
    """The GPU and MIG device UUIDs the claim's allocation names (a MIG device by its placement)."""
    found: set[str] = set()
    for device in claim.devices(facts):
        if device.mig_placement is None:
            found.add(device.gpu_uuid)
            continue
        for gi in gpus[device.gpu_uuid].gpu_instances:
            if (gi.profile_id, gi.start) == device.mig_placement:
                found.update(ci.uuid for ci in gi.compute_instances)
    return found


def check(node: SoakNode, claims: Sequence[SoakClaim], facts: Mapping[str, DeviceFacts]) -> list[Violation]:
    out: list[Violation] = []
    state = node.node.sim_state()
    gpus = {g.uuid: g for g in state.gpus}
    lost_uuids = {state.gpus[i].uuid for i in node.lost_gpus}
    explained = [c for c in claims if c.explained]
    by_uid = {c.uid: c for c in claims}
    daemons = node.live_daemons()
    # whole GPU -> {mounts an MPS pipe: a claim that does}: a GPU's MPS clients and a claim given the bare
    # device cannot both work (EXCLUSIVE_PROCESS refuses the bare one's context); admin access only looks
    modes: dict[str, dict[bool, int]] = {}

    # ---- every prepared claim has what it was given, and it is its own
    for claim in claims:
        if claim.phase is not Phase.PREPARED:
            continue
        spec = _read_json(_spec_path(node, claim.uid))
        if spec is None:
            out.append(
                Violation(
                    claim=claim.index,
                    rule="spec-missing",
                    detail=f"claim {claim.index} ({claim.kind}) prepared, no CDI spec",
                )
            )
            continue
        wanted = sorted(cdi.split("=", 1)[1] for d in claim.answer or () for cdi in d[3])
        allocated = sorted({f"{claim.uid}-{r['device']}" for r in claim.results})
        have = sorted(d["name"] for d in spec.get("devices") or ())
        if not wanted == have == allocated:
            out.append(
                Violation(
                    claim=claim.index,
                    rule="spec-devices",
                    detail=f"claim {claim.index}: spec devices {have}, answer {wanted}, "
                    f"allocated {allocated}",
                )
            )
        on_lost = bool(claim.gpu_uuids(facts) & lost_uuids) or claim.hardware_lost
        for device in claim.devices(facts):
            if device.mig_placement is None or on_lost:
                continue
            placements = {(gi.profile_id, gi.start) for gi in gpus[device.gpu_uuid].gpu_instances}
            if device.mig_placement not in placements:
                out.append(
                    Violation(
                        claim=claim.index,
                        rule="mig-missing",
                        detail=f"claim {claim.index}: no MIG instance for {device.name}",
                    )
                )
        own = _allocated_uuids(claim, facts, gpus)
        if not on_lost:
            # admin access observes (NVML): the GPU's own node, whatever its MIG mode
            monitors = claim.kind == "admin"
            reachable = set(visible_devices(state, _device_nodes(spec), whole_gpus=monitors))
            if reachable != own:
                out.append(
                    Violation(
                        claim=claim.index,
                        rule="spec-device-nodes",
                        detail=f"claim {claim.index} ({claim.kind}): its device nodes give "
                        f"{sorted(reachable)}, allocated {sorted(own)}",
                    )
                )
        sharing = claim.sharing()
        whole_uuids = {d.gpu_uuid for d in claim.devices(facts) if d.type != "mig"}
        mounts = _mps_pipe_dirs(spec)
        if claim.kind != "admin":
            for uuid in whole_uuids:
                modes.setdefault(uuid, {}).setdefault(bool(mounts), claim.index)
        if claim.kind in MPS_KINDS and not mounts:
            out.append(
                Violation(
                    claim=claim.index,
                    rule="mps-not-mounted",
                    detail=f"claim {claim.index} ({claim.kind}): no MPS pipe mount",
                )
            )
        for host_dir in mounts:
            try:
                key = pipe_dir_key(host_dir)
            except OSError:
                out.append(
                    Violation(
                        claim=claim.index,
                        rule="mps-pipe-missing",
                        detail=f"claim {claim.index}: pipe dir {host_dir} is gone",
                    )
                )
                continue
            record = daemons.get(key)
            if record is None:
                # a killed daemon cannot be started again while the plugin directory is full or its GPU is
                # off the bus (the plugin reports it as a sharing problem); judged once that ends
                if not on_lost and "checkpoint" not in node.fillers:
                    out.append(
                        Violation(
                            claim=claim.index,
                            rule="mps-daemon-missing",
                            detail=f"claim {claim.index} ({claim.kind}): no daemon",
                        )
                    )
                continue
            visible = set(record.get("visible_devices") or ())
            if not on_lost and visible != own:
                out.append(
                    Violation(
                        claim=claim.index,
                        rule="mps-wrong-device",
                        detail=f"claim {claim.index} ({claim.kind}): its daemon serves {sorted(visible)}, "
                        f"allocated {sorted(own)}",
                    )
                )
            if claim.kind in OWN_DAEMON_KINDS:
                out += _own_limits(claim, record, sharing)
        if claim.kind in WHOLE_GPU_MPS:
            for uuid in whole_uuids - lost_uuids:
                if gpus[uuid].compute_mode != EXCLUSIVE_PROCESS:
                    out.append(
                        Violation(
                            claim=claim.index,
                            rule="compute-mode",
                            detail=f"claim {claim.index}: GPU {uuid} not EXCLUSIVE_PROCESS",
                        )
                    )
        interval = (sharing.get("timeSlicingConfig") or {}).get("interval")
        if sharing.get("strategy") == "TimeSlicing":
            for uuid in whole_uuids:
                if gpus[uuid].timeslice != TIMESLICE_CODES[interval or "Default"]:
                    out.append(
                        Violation(
                            claim=claim.index,
                            rule="timeslice",
                            detail=f"claim {claim.index}: GPU {uuid} timeslice {gpus[uuid].timeslice}",
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

    out += _leaks(node, explained, by_uid, facts, state, daemons, lost_uuids)
    return out


def _own_limits(claim: SoakClaim, record: Mapping[str, Any], sharing: Mapping[str, Any]) -> list[Violation]:
    """The claim's own daemon holds its config's limits as its defaults (the caps of every server)."""
    config = sharing.get("mpsConfig") or {}
    out = []
    pct = config.get("defaultActiveThreadPercentage")
    if record.get("default_active_thread_percentage") != pct:
        held = record.get("default_active_thread_percentage")
        out.append(
            Violation("mps-limit", f"claim {claim.index}: daemon thread % {held}, claim {pct}", claim.index)
        )
    pinned = config.get("defaultPinnedDeviceMemoryLimit")
    if pinned is not None:
        from dra_gpu.config.quantity import MIB, parse_quantity

        wanted = f"{parse_quantity(pinned) // MIB}M"
        held_pinned = sorted(set((record.get("default_pinned_mem_limits") or {}).values()))
        if held_pinned != [wanted]:
            out.append(
                Violation(
                    "mps-limit",
                    f"claim {claim.index}: daemon pinned {held_pinned}, claim {wanted}",
                    claim.index,
                )
            )
    return out


def _leaks(
    node: SoakNode,
    explained: Sequence[SoakClaim],
    by_uid: Mapping[str, SoakClaim],
    facts: Mapping[str, DeviceFacts],
    state: Any,
    daemons: Mapping[str, Mapping[str, Any]],
    lost_uuids: set[str],
) -> list[Violation]:
    """Nothing exists that no live claim explains, claim by claim."""
    out: list[Violation] = []
    live_uids = {c.uid for c in explained}
    for path in sorted(node.node.cdi_root.glob("k8s.gpu.nvidia.com-claim_*.json")):
        uid = path.name.removeprefix("k8s.gpu.nvidia.com-claim_").removesuffix(".json")
        if uid not in live_uids:
            out.append(Violation("spec-leaked", f"CDI spec of {_who(by_uid.get(uid), uid)}"))
    mig_owned = {
        (d.gpu_uuid, *d.mig_placement)
        for c in explained
        for d in c.devices(facts)
        if d.mig_placement is not None
    }
    # A GPU off the bus cannot be changed: what the plugin must undo there waits until it is back (judged
    # then, within the time repairs may take).
    for gpu in state.gpus:
        if gpu.uuid in lost_uuids:
            continue
        for gi in gpu.gpu_instances:
            if (gpu.uuid, gi.profile_id, gi.start) not in mig_owned:
                out.append(Violation("mig-leaked", f"MIG instance {gi.profile_id}@{gi.start} on {gpu.uuid}"))

    # ---- MPS, claim by claim: daemon directories, the shares servers' per-claim /dev/shm, mounts, daemons
    own_daemon_uids = {c.uid for c in explained if c.kind in OWN_DAEMON_KINDS}
    shares_by_gpu: dict[str, set[str]] = {}
    for claim in explained:
        if claim.kind in SHARES_KINDS:
            for uuid in claim.gpu_uuids(facts):
                shares_by_gpu.setdefault(uuid.lower(), set()).add(claim.uid)
    pipe_root = node.node.plugin_dir / "mps"
    allowed_dirs: set[str] = set()
    allowed_mounts: set[str] = set()
    dir_keys: dict[str, str] = {}
    for directory in sorted(pipe_root.iterdir()) if pipe_root.is_dir() else ():
        name = directory.name
        for where in (directory / "clients" / "pipe", directory / "stage", directory / "pipe"):
            with contextlib.suppress(OSError):  # not there (yet, or any more)
                dir_keys[pipe_dir_key(str(where))] = name
        if name.startswith(SHARES_DIR):
            gpu = name.removeprefix(SHARES_DIR)
            holders = shares_by_gpu.get(gpu, set())
            if not holders:
                out.append(
                    Violation("pipe-dir-leaked", f"shares server directory {name}: no live share there")
                )
                continue
            allowed_dirs.add(name)
            allowed_mounts.add(str(directory / "shm"))
            for claim_dir in (
                sorted((directory / "claims").iterdir()) if (directory / "claims").is_dir() else ()
            ):
                if claim_dir.name not in holders:
                    owner = by_uid.get(claim_dir.name)
                    out.append(
                        Violation("shm-leaked", f"/dev/shm of {_who(owner, claim_dir.name)} on {name}")
                    )
                else:
                    allowed_mounts.add(str(claim_dir / "shm"))
            continue
        uid = name[:36]
        if uid not in own_daemon_uids:
            out.append(
                Violation("pipe-dir-leaked", f"daemon directory {name} of {_who(by_uid.get(uid), uid)}")
            )
            continue
        allowed_dirs.add(name)
        allowed_mounts.add(str(directory / "shm"))
    for mount in _mounts_under(node.node.plugin_dir):
        if mount not in allowed_mounts:
            out.append(Violation("mount-leaked", f"mount {mount}"))
    for key in daemons:
        if dir_keys.get(key) not in allowed_dirs:
            where = dir_keys.get(key, "no directory")
            out.append(Violation("mps-daemon-leaked", f"daemon {key} ({where}) runs for no live claim"))

    # ---- GPU-wide settings: only where a live claim asked for them
    may_exclusive = {u for c in explained if c.kind in WHOLE_GPU_MPS for u in c.gpu_uuids(facts)}
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


def _mounts_under(directory: Path) -> list[str]:
    prefix = f"{directory}/"
    return [
        line.split()[1]
        for line in Path("/proc/mounts").read_text().splitlines()
        if line.split()[1].startswith(prefix)
    ]
