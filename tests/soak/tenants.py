"""What each tenant gets, checked where its workload looks: the simulated CUDA client run in a prepared
claim's container view (its CDI spec's mounts, env and device nodes; tests/plugin/claim_view.py), never the
driver's own records.

For every prepared claim (admin access only observes, and is left out):
- the device its client opens is the allocated GPU or MIG device (for an MPS client, the device its server
  runs on), and it is an MPS client exactly when the claim's sharing makes it one;
- its SMs and pinned memory are its share: the full device without limits, the MPS config's thread
  percentage and pinned memory, or, for a share of its GPU's shares server, its own share;
- a client that raises its env limits, or drops them, gets no more than the largest share on its GPU (the
  largest of the claims prepared there or in doubt) or, behind a claim's own daemon, its MPS config;
- on a whole GPU whose MPS server runs, a client that leaves its pipe directory is refused (compute mode
  EXCLUSIVE_PROCESS).

`caps_violations` reads the same from the daemons' side: every cap a shares daemon was ever sent (its
defaults: the next server's caps; a running server's own) is at most the largest share of the claims on its
GPU while it was sent, and every running server's caps equal that largest share once no claim there is in
doubt. The simulated daemon records each command, so "a client connecting at any moment" is judged from
every command, not only from the moments the soak looks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_gpu.config.quantity import MIB, parse_quantity
from dra_gpu.hardware.sim_tools.mps_control import multiprocessors, sms_for_percentage
from dra_gpu.hardware.sim_tools.mps_records import pipe_dir_key
from dra_gpu.hardware.simulator.state import SimState
from tests.plugin.claim_view import claim_edits
from tests.soak.invariants import Violation
from tests.soak.kubelet_view import DeviceFacts, Phase, SoakClaim
from tests.soak.soak_node import SoakNode
from tests.support.container_view import sim_client

SHARES_KINDS = frozenset({"fraction", "consumable-mps", "consumable-memory"})  # clients of the GPU's server
OWN_DAEMON_KINDS = frozenset({"mps", "mig-mps"})  # a daemon of the claim's own, limits from its config
WHOLE_GPU_MPS = SHARES_KINDS | {"mps"}  # their GPU is in EXCLUSIVE_PROCESS while they are prepared
# what a tenant that raises its limits in its pod spec asks for, and one that drops them
RAISED = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1000G"}
DROPPED = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": ""}
NOWHERE = "/tmp/dra-gpu-soak-no-mps"  # a pipe directory no daemon serves: the client runs outside MPS
MPS_DIR = "/tmp/nvidia-mps"  # where a claim's container sees its daemon's clients directory
BUSY = "busy or unavailable"  # CUDA's refusal in EXCLUSIVE_PROCESS (cudaErrorDevicesUnavailable)
CAP_COMMANDS = {
    "set_default_active_thread_percentage": "compute",
    "set_active_thread_percentage": "compute",
    "set_default_device_pinned_mem_limit": "memory",
    "set_device_pinned_mem_limit": "memory",
}


@dataclass(frozen=True)
class Share:
    """What a prepared claim's workload must get."""

    gpu: str  # the physical GPU
    devices: frozenset[str]  # the GPU or MIG device UUIDs it may run on
    mps: bool  # an MPS client
    shares_server: bool  # of its GPU's shares server (its own limits in its env; caps: the largest share)
    compute: int  # percent of its device's SMs
    memory_mib: int | None  # pinned device memory limit; None: none


def _mib(text: str) -> int:
    return parse_quantity(text) // MIB


def _mig_uuid(state: SimState, device: DeviceFacts) -> str | None:
    assert device.mig_placement is not None
    profile_id, start = device.mig_placement
    for gpu in state.gpus:
        if gpu.uuid != device.gpu_uuid:
            continue
        for gi in gpu.gpu_instances:
            if (gi.profile_id, gi.start) == (profile_id, start) and gi.compute_instances:
                return gi.compute_instances[0].uuid
    return None


def expected_share(claim: SoakClaim, facts: Mapping[str, DeviceFacts], state: SimState) -> Share | None:
    """What the claim's workload must get; None for admin access (it observes, it runs nothing) and for a
    MIG device that does not exist (judged by the invariants)."""
    if claim.kind == "admin":
        return None
    devices = claim.devices(facts)
    uuids: set[str] = set()
    for device in devices:
        if device.mig_placement is None:
            uuids.add(device.gpu_uuid)
            continue
        mig = _mig_uuid(state, device)
        if mig is None:
            return None
        uuids.add(mig)
    gpu = devices[0].gpu_uuid
    mps_config = claim.sharing().get("mpsConfig") or {}
    consumed: dict[str, str] = dict(claim.results[0].get("consumedCapacity") or {})
    compute, memory = 100, None
    if claim.kind in ("mps", "mig-mps", "consumable-mps"):
        compute = int(mps_config.get("defaultActiveThreadPercentage", 100))
        pinned = mps_config.get("defaultPinnedDeviceMemoryLimit")
        memory = _mib(pinned) if pinned else None
    if claim.kind == "fraction":
        compute, memory = int(consumed["compute"]), _mib(consumed["memory"])
    if claim.kind == "consumable-memory":
        memory = _mib(consumed["memory"])
    mps = claim.kind in SHARES_KINDS | OWN_DAEMON_KINDS
    return Share(gpu, frozenset(uuids), mps, claim.kind in SHARES_KINDS, compute, memory)


def largest_shares(
    claims: Iterable[SoakClaim], facts: Mapping[str, DeviceFacts], state: SimState
) -> dict[str, tuple[int, int]]:
    """GPU -> the largest (compute %, pinned MiB) of the shares-server claims among `claims` there: the caps
    its server may hold while those claims are live."""
    largest: dict[str, tuple[int, int]] = {}
    for claim in claims:
        if claim.kind not in SHARES_KINDS:
            continue
        share = expected_share(claim, facts, state)
        if share is None:
            continue
        gpu_mib = _gpu_memory_mib(state, share.gpu)
        memory = gpu_mib if share.memory_mib is None else min(share.memory_mib, gpu_mib)
        compute, mib = largest.get(share.gpu, (0, 0))
        largest[share.gpu] = (max(compute, share.compute), max(mib, memory))
    return largest


def _gpu_memory_mib(state: SimState, uuid: str) -> int:
    from dra_gpu.hardware import profiles

    for gpu, gstate in zip(profiles.simulated_gpus(state.layout(), state.seed), state.gpus, strict=True):
        if gstate.uuid == uuid:
            return gpu.profile.memory_mib
    raise KeyError(uuid)


def _limit_mib(view: Mapping[str, Any], uuid: str) -> int | None:
    value = (view.get("pinnedDeviceMemoryLimits") or {}).get(uuid)
    return None if value is None else int(str(value).rstrip("M"))


class TenantChecks:
    """Runs the clients of claims on one soak node and judges what they got."""

    def __init__(self, node: SoakNode) -> None:
        self.node = node
        self.runs = 0  # clients run

    def _client(self, claim: SoakClaim, *args: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
        self.runs += 1
        edits = claim_edits(self.node.node, claim.uid)
        return sim_client(edits, self.node.node.driver_root, *args, env=env, timeout_s=30)

    def _daemon_runs(self, claim: SoakClaim) -> bool:
        """The MPS daemon the claim's container view reaches runs."""
        mounts = [
            m.host_path for m in claim_edits(self.node.node, claim.uid).mounts if m.container_path == MPS_DIR
        ]
        live = self.node.live_daemons()
        for host in mounts:
            try:
                if pipe_dir_key(f"{host}/pipe") in live:
                    return True
            except OSError:
                continue
        return False

    def check(
        self,
        claim: SoakClaim,
        claims: Sequence[SoakClaim],
        facts: Mapping[str, DeviceFacts],
        *,
        thorough: bool,
    ) -> list[Violation]:
        """The claim's workload, as a tenant runs it; `thorough` adds the tenant that drops its limits (after
        a prepare; after a fault the one that raises them stands for both)."""
        state = self.node.node.sim_state()
        share = expected_share(claim, facts, state)
        if share is None:
            return []
        who = f"claim {claim.index} ({claim.kind})"
        if share.mps and "checkpoint" in self.node.fillers and not self._daemon_runs(claim):
            # a killed daemon cannot be started again while the plugin directory is full (its pipe and log
            # live there); the plugin taints the GPU, and its tenants are judged once the disk has room
            return []
        view = self._client(claim)
        if "error" in view:
            return [
                Violation("tenant-failed", f"{who}: its workload failed: {view['error'][-300:]}", claim.index)
            ]
        out: list[Violation] = []
        opened = list(view.get("gpus") or ())
        if bool(view.get("mps")) != share.mps:
            out.append(Violation("tenant-mps", f"{who}: MPS client {view.get('mps')}, wanted {share.mps}"))
            return out
        if not opened or not set(opened) <= share.devices:
            out.append(
                Violation("tenant-device", f"{who}: opened {opened}, allocated {sorted(share.devices)}")
            )
            return out
        device = opened[0]
        total = multiprocessors(state, device)
        wanted_sms = sms_for_percentage(total, share.compute)
        got = (view.get("smCount"), _limit_mib(view, device))
        if got != (wanted_sms, share.memory_mib):
            out.append(
                Violation(
                    "tenant-share",
                    f"{who}: got {got[0]} SMs / pinned {got[1]} MiB, its share is {wanted_sms} SMs "
                    f"({share.compute} %) / {share.memory_mib} MiB",
                )
            )
        if not share.mps:
            return out
        if share.shares_server:
            live = [c for c in claims if c.phase in (Phase.PREPARED, Phase.IN_DOUBT)]
            ceiling = largest_shares(live, facts, state).get(
                share.gpu, (share.compute, share.memory_mib or 0)
            )
        else:
            ceiling = (share.compute, share.memory_mib or 0)
        for name, env in [("raises", RAISED), *([("drops", DROPPED)] if thorough else [])]:
            greedy = self._client(claim, env=env)
            if "error" in greedy:
                out.append(Violation("tenant-failed", f"{who}: a tenant that {name} its limits failed"))
                continue
            sms, mib = greedy.get("smCount") or 0, _limit_mib(greedy, device)
            over_memory = share.memory_mib is not None and (mib is None or mib > ceiling[1])
            if sms > sms_for_percentage(total, ceiling[0]) or over_memory:
                out.append(
                    Violation(
                        "tenant-over-share",
                        f"{who}: a tenant that {name} its limits got {sms} SMs / pinned {mib} MiB; the "
                        f"largest share on GPU {share.gpu} is {ceiling[0]} % / {ceiling[1]} MiB",
                    )
                )
        if claim.kind in WHOLE_GPU_MPS:
            bare = self._client(claim, "--gpu", share.gpu, env={"CUDA_MPS_PIPE_DIRECTORY": NOWHERE})
            if BUSY not in str(bare.get("error", "")):
                out.append(
                    Violation(
                        "tenant-bare-not-refused",
                        f"{who}: a client outside MPS on GPU {share.gpu} got {bare}",
                    )
                )
        return out


@dataclass
class CapsLog:
    """How far each shares daemon's command log has been judged: (record key, pid, start) -> commands seen."""

    seen: dict[tuple[str, Any, Any], int]

    @classmethod
    def empty(cls) -> CapsLog:
        return cls({})


def shares_daemon_records(node: SoakNode) -> dict[str, tuple[str, dict[str, Any]]]:
    """GPU uuid (lower case, as the daemon's directory names it) -> (record key, the record) of the shares
    daemons that have a record, running or not."""
    from tests.support.mps_view import mps_records

    records = mps_records(node.node.driver_root)
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    base = node.node.plugin_dir / "mps"
    for directory in sorted(base.glob("shares-*")) if base.is_dir() else ():
        for where in (directory / "clients" / "pipe", directory / "stage"):
            try:
                key = pipe_dir_key(str(where))
            except OSError:
                continue
            if key in records:
                found[directory.name.removeprefix("shares-")] = (key, records[key])
    return found


def caps_violations(
    node: SoakNode,
    log: CapsLog,
    allowed: Mapping[str, tuple[int, int]],
    settled: Mapping[str, tuple[int, int]],
) -> list[Violation]:
    """Every cap sent to a shares daemon since the last look is at most `allowed` (GPU -> the largest share
    of the claims there that were prepared or in doubt, or under a call, since then); on the GPUs of
    `settled` (the largest share of the prepared claims, where none is in doubt), every running server's caps
    and the daemon's defaults equal it."""
    out: list[Violation] = []
    by_lower = {gpu.lower(): gpu for gpu in set(allowed) | set(settled)}
    for lower, (key, record) in shares_daemon_records(node).items():
        gpu = by_lower.get(lower, lower)
        identity = (key, record.get("pid"), record.get("started"))
        commands = list(record.get("commands") or ())
        start = log.seen.get(identity, 0)
        log.seen[identity] = len(commands)
        ceiling = allowed.get(gpu)
        for entry in commands[start:]:
            words = str(entry.get("command", "")).split()
            if not entry.get("ok") or not words or words[0] not in CAP_COMMANDS:
                continue
            what = CAP_COMMANDS[words[0]]
            value = _cap_value(words[-1])
            limit = None if ceiling is None else ceiling[0 if what == "compute" else 1]
            if limit is None or value > limit:
                out.append(
                    Violation(
                        "caps-over-largest-share",
                        f"shares daemon of GPU {gpu} was sent {' '.join(words)}; the largest share there "
                        f"was {ceiling}",
                    )
                )
        if not record.get("running") or gpu not in settled:
            continue
        compute, memory = settled[gpu]
        held = [("defaults", record.get("default_active_thread_percentage"),
                 (record.get("default_pinned_mem_limits") or {}).get(gpu))]  # fmt: skip
        held += [
            (
                f"server {s['pid']}",
                s.get("active_thread_percentage"),
                (s.get("pinned_mem_limits") or {}).get(gpu),
            )
            for s in record.get("servers") or ()
        ]
        for what, thread, pinned in held:
            if thread != compute or pinned is None or _cap_value(str(pinned)) != memory:
                out.append(
                    Violation(
                        "caps-not-largest-share",
                        f"shares daemon of GPU {gpu}: {what} holds {thread} % / {pinned}; the largest "
                        f"share there is {compute} % / {memory}M",
                    )
                )
    return out


def _cap_value(text: str) -> float:
    """`25`, `25.0`, `1024M`, `2G` -> percent or MiB."""
    if text.endswith("G"):
        return float(text[:-1]) * 1024
    return float(text.rstrip("M"))
