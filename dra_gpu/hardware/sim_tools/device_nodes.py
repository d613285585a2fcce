"""Which GPUs and MIG devices a simulated CUDA process can open: those its container's device nodes give.

A container runtime creates in the container the device nodes a CDI spec names (`/dev/nvidia<minor>` of each
GPU, and for a MIG device the capability nodes `/dev/nvidia-caps/nvidia-cap<N>` of its GPU instance and its
compute instance); CUDA enumerates what those nodes give access to. NVIDIA's MIG user guide ("Device Nodes and
Capabilities"): on a GPU in MIG mode the GPU's node alone gives no compute; a MIG device is usable with the
capability of its GPU instance AND of its compute instance (`/proc/driver/nvidia/capabilities/gpu<minor>/mig/
gi<G>/access` and `.../ci<C>/access` name their minors). The simulated client reads the nodes from
`DRA_GPU_SIM_DEVICE_NODES` (tests/support/container_view.py sets it from the claim's spec: in a real container
they are files in /dev), so a check sees the device the claim's spec really gives, not one it names itself.
"""

from __future__ import annotations

from collections.abc import Collection

from dra_gpu.hardware import profiles
from dra_gpu.hardware.sim_driver_root import ci_cap_minor, gi_cap_minor
from dra_gpu.hardware.simulator.state import SimState

ENV_VAR = "DRA_GPU_SIM_DEVICE_NODES"  # comma-separated container paths of the device nodes


def parse_nodes(text: str) -> set[str]:
    return {part.strip() for part in text.split(",") if part.strip()}


def visible_devices(state: SimState, nodes: Collection[str], *, whole_gpus: bool = False) -> list[str]:
    """UUIDs of the GPUs and MIG devices the nodes give access to, in CUDA's order (GPU index, then GPU
    instance and compute instance). `whole_gpus`: the GPUs whose own node is there, MIG mode or not (what
    NVML, not CUDA, reaches: monitoring)."""
    layout = profiles.simulated_gpus(state.layout(), state.seed)
    visible: list[str] = []
    for gpu, gstate in zip(layout, state.gpus, strict=True):
        minor = gstate.minor if gstate.minor is not None else gpu.minor
        if f"/dev/nvidia{minor}" not in nodes:
            continue
        if whole_gpus or not gstate.mig_current:
            visible.append(gstate.uuid)
            continue
        for gi in sorted(gstate.gpu_instances, key=lambda g: g.gi_id):
            if f"/dev/nvidia-caps/nvidia-cap{gi_cap_minor(minor, gi.gi_id)}" not in nodes:
                continue
            for ci in sorted(gi.compute_instances, key=lambda c: c.ci_id):
                if f"/dev/nvidia-caps/nvidia-cap{ci_cap_minor(minor, gi.gi_id, ci.ci_id)}" in nodes:
                    visible.append(ci.uuid)
    return visible
