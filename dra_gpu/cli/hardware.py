"""`dra-gpu hardware list|init-sim|state|reset|fault|xid|gpu-lost|recover|process|mig-renumber`: the hardware
profiles and the simulator's driver root (errors injected into it, processes put on its GPUs).

Also the shared `--hardware` / `--nvidia-driver-root` options of the commands that read GPUs (`inventory`,
`slices`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pynvml
import yaml

from dra_gpu.hardware import profiles
from dra_gpu.hardware.interface import HardwareError
from dra_gpu.hardware.loader import REAL, open_hardware
from dra_gpu.hardware.nvml_hardware import NvmlHardware
from dra_gpu.hardware.sim_driver_root import (
    DRIVER_LAYOUTS,
    init_sim_driver_root,
    open_simulated_nvml,
    state_path,
    state_report,
)
from dra_gpu.hardware.simulator import contexts
from dra_gpu.hardware.simulator import nvml as simulator_nvml
from dra_gpu.hardware.simulator.nvml import SimulatedNvml
from dra_gpu.hardware.simulator.state import CONTEXT_KINDS, Fault, StateError, StateStore


def add_hardware_args(parser: argparse.ArgumentParser, *, seed_help: str = "") -> None:
    parser.add_argument(
        "--hardware",
        default=REAL,
        help=f"'real' (NVML) or a simulated node/GPU: {', '.join(profiles.known_hardware_names())}",
    )
    parser.add_argument(
        "--nvidia-driver-root",
        "--driver-root",
        dest="driver_root",
        default=None,
        help="driver root (default '/' for real hardware; a throw-away simulated root otherwise)",
    )
    parser.add_argument("--seed", default=None, help=seed_help or "simulator seed for GPU UUIDs")


@contextlib.contextmanager
def hardware_from_args(args: argparse.Namespace, default_seed: str | None = None) -> Iterator[NvmlHardware]:
    """Open the hardware the options name; a simulated node without a driver root lives in a temporary one."""
    temp_root = None
    root = args.driver_root
    if root is None:
        if args.hardware == REAL:
            root = "/"
        else:
            temp_root = root = tempfile.mkdtemp(prefix="dra-gpu-sim-", dir="/tmp")
    try:
        seed = args.seed
        if seed is None and args.hardware != REAL and not state_path(root).exists():
            seed = default_seed  # an existing simulated root keeps the identity it was made with
        hardware = open_hardware(args.hardware, root, seed=seed)
        try:
            yield hardware
        finally:
            hardware.close()
    finally:
        if temp_root:
            shutil.rmtree(temp_root, ignore_errors=True)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "hardware",
        help="hardware profiles and the NVML simulator",
        description="List the built-in hardware profiles, build a simulated driver root, "
        "show or change its state.",
    )
    sub = parser.add_subparsers(dest="hardware_command", metavar="ACTION")

    p = sub.add_parser("list", help="list the built-in node layouts and GPU profiles")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.set_defaults(func=_list)

    p = sub.add_parser("init-sim", help="create a simulated driver root (idempotent)")
    p.add_argument("--hardware", required=True, help=", ".join(profiles.known_hardware_names()))
    p.add_argument("--driver-root", "--nvidia-driver-root", dest="driver_root", required=True)
    p.add_argument(
        "--seed", default=None, help="seed for GPU UUIDs, e.g. the node name (default: the hardware name)"
    )
    p.add_argument("--force", action="store_true", help="start over from power-on state")
    p.add_argument(
        "--driver-layout",
        choices=list(DRIVER_LAYOUTS),
        default=None,
        help="where the tools and libraries go: standard (usr/bin, usr/lib/x86_64-linux-gnu: a host install "
        "or the GPU Operator's /run/nvidia/driver), rhel (usr/lib64), gke (bin, lib64: GKE/COS's "
        "/home/kubernetes/bin/nvidia) (default: the root's own, else standard)",
    )
    p.set_defaults(func=_init_sim)

    p = sub.add_parser("state", help="print the simulator state of a driver root")
    p.add_argument("--driver-root", "--nvidia-driver-root", dest="driver_root", required=True)
    p.add_argument("-o", "--output", choices=("json", "yaml"), default="json")
    p.set_defaults(func=_state)

    p = sub.add_parser("reset", help="simulate a GPU reset (applies a pending MIG mode, drops MIG devices)")
    p.add_argument("--driver-root", "--nvidia-driver-root", dest="driver_root", required=True)
    p.add_argument("-i", "--index", type=int, action="append", help="GPU index (repeatable; default all)")
    p.set_defaults(func=_reset)

    p = sub.add_parser("fault", help="make an NVML function fail for one GPU (or clear faults)")
    p.add_argument("--driver-root", "--nvidia-driver-root", dest="driver_root", required=True)
    p.add_argument("-i", "--index", type=int, help="GPU index")
    p.add_argument("--function", default="*", help="NVML function name, '*' for all (default)")
    p.add_argument(
        "--error",
        type=int,
        default=None,
        help="NVML error code (default 15, GPU_IS_LOST; 0 with --delay-seconds: slow but successful)",
    )
    p.add_argument(
        "--delay-seconds",
        type=float,
        default=0.0,
        help="the function first takes this long (latency injection, e.g. a slow MIG creation)",
    )
    p.add_argument("--clear", action="store_true", help="remove every injected fault")
    p.set_defaults(func=_fault)

    p = sub.add_parser("xid", help="raise an NVML XID critical-error event on a simulated GPU")
    p.add_argument("--driver-root", "--nvidia-driver-root", dest="driver_root", required=True)
    p.add_argument("--gpu", type=int, required=True, help="GPU minor number (/dev/nvidia<minor>)")
    p.add_argument("--xid", type=int, required=True, help="XID number, e.g. 79 (fallen off the bus)")
    p.add_argument("--gi", type=int, default=None, help="GPU instance id (MIG); default: the whole GPU")
    p.add_argument("--ci", type=int, default=None, help="compute instance id inside --gi")
    p.add_argument(
        "--no-reset-required",
        action="store_true",
        help="leave the GPU's recovery action at NONE (default: GPU_RESET until 'recover')",
    )
    p.add_argument(
        "--ecc-event",
        action="store_true",
        help="send it as a double-bit ECC event (nvmlEventTypeDoubleBitEccError), as NVML reports XID 48",
    )
    p.set_defaults(func=_xid)

    p = sub.add_parser("gpu-lost", help="every NVML call on the GPU fails with GPU_IS_LOST until 'recover'")
    p.add_argument("--driver-root", "--nvidia-driver-root", dest="driver_root", required=True)
    p.add_argument("--gpu", type=int, required=True, help="GPU minor number")
    p.set_defaults(func=_gpu_lost)

    p = sub.add_parser("recover", help="simulate a successful GPU reset that clears the GPU's errors")
    p.add_argument("--driver-root", "--nvidia-driver-root", dest="driver_root", required=True)
    p.add_argument("--gpu", type=int, required=True, help="GPU minor number")
    p.set_defaults(func=_recover)

    p = sub.add_parser(
        "process",
        help="put a process (a context) on a simulated GPU or MIG device, take it off, or list them",
    )
    p.add_argument("action", choices=("add", "remove", "list"))
    p.add_argument("--driver-root", "--nvidia-driver-root", dest="driver_root", required=True)
    p.add_argument("--device", default=None, help="GPU or MIG device UUID (list: optional filter)")
    p.add_argument("--pid", type=int, default=None, help="process id (add, remove)")
    p.add_argument("--kind", choices=CONTEXT_KINDS, default="compute", help="what the process holds (add)")
    p.set_defaults(func=_process)

    p = sub.add_parser(
        "mig-renumber",
        help="whether a MIG mode switch gives the GPU a new minor number (nvml.h allows it; default off)",
    )
    p.add_argument("--driver-root", "--nvidia-driver-root", dest="driver_root", required=True)
    p.add_argument("setting", choices=("on", "off"))
    p.set_defaults(func=_mig_renumber)

    def usage(_args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=usage)


def _list(args: argparse.Namespace) -> int:
    layouts = []
    for name in profiles.known_hardware_names():
        layout = profiles.resolve_layout(name)
        layouts.append(
            {
                "name": name,
                "kind": "node" if name in profiles.NODE_LAYOUTS else "gpu",
                "description": layout.description,
                "gpus": [s.profile.product_name for s in layout.slots],
                "mig": sorted({p.name for s in layout.slots for p in s.profile.mig_profiles}),
            }
        )
    if args.output == "json":
        print(json.dumps(layouts, indent=2))
        return 0
    print(f"{'NAME':<14} {'KIND':<5} {'GPUS':>4}  DESCRIPTION")
    for item in layouts:
        print(f"{item['name']:<14} {item['kind']:<5} {len(item['gpus']):>4}  {item['description']}")
    print(f"\nand '{REAL}' for the GPUs of this machine (NVML)")
    return 0


def _fail(message: str) -> int:
    print(f"dra-gpu hardware: {message}", file=sys.stderr)
    return 1


def _init_sim(args: argparse.Namespace) -> int:
    try:
        state = init_sim_driver_root(
            args.driver_root, args.hardware, args.seed, force=args.force, driver_layout=args.driver_layout
        )
    except (profiles.UnknownHardwareError, StateError, OSError, ValueError) as err:
        return _fail(str(err))
    print(
        f"simulated driver root {args.driver_root}: {state.hardware}, {len(state.gpus)} GPU(s), "
        f"seed {state.seed}"
    )
    return 0


def _state(args: argparse.Namespace) -> int:
    try:
        data = state_report(args.driver_root)
    except StateError as err:
        return _fail(str(err))
    print(json.dumps(data, indent=2, sort_keys=True) if args.output == "json" else yaml.safe_dump(data))
    return 0


def _reset(args: argparse.Namespace) -> int:
    nvml = open_simulated_nvml(args.driver_root)
    try:
        nvml.nvmlInit()
        indexes = args.index if args.index else range(nvml.nvmlDeviceGetCount())
        for index in indexes:
            nvml.reset_gpu(index)
    except (StateError, HardwareError) as err:
        return _fail(str(err))
    return 0


def _fault(args: argparse.Namespace) -> int:
    store = StateStore(state_path(args.driver_root))
    try:
        with store.transaction() as state:
            if args.clear:
                state.faults = []
            else:
                if args.index is None or not 0 <= args.index < len(state.gpus):
                    return _fail(f"--index must name a GPU (0..{len(state.gpus) - 1})")
                if args.delay_seconds < 0:
                    return _fail("--delay-seconds must be >= 0")
                error = args.error if args.error is not None else (0 if args.delay_seconds > 0 else 15)
                state.faults.append(Fault(args.index, args.function, error, args.delay_seconds))
    except StateError as err:
        return _fail(str(err))
    return 0


def _process(args: argparse.Namespace) -> int:
    try:
        if args.action == "list":
            found = contexts.list_contexts(args.driver_root, args.device)
            print(
                json.dumps([{"device": c.device_uuid, "pid": c.pid, "kind": c.kind} for c in found], indent=1)
            )
            return 0
        if args.device is None or args.pid is None:
            return _fail(f"process {args.action} needs --device and --pid")
        if args.action == "add":
            contexts.add_context(args.driver_root, args.device, args.pid, args.kind)
        elif not contexts.remove_context(args.driver_root, args.device, args.pid):
            return _fail(f"pid {args.pid} holds no context on {args.device}")
    except contexts.ContextRefusedError as err:
        return _fail(f"{err} ({err.detail})")
    except (StateError, ValueError) as err:
        return _fail(str(err))
    return 0


def _mig_renumber(args: argparse.Namespace) -> int:
    try:
        with StateStore(state_path(args.driver_root)).transaction() as state:
            state.renumber_on_mig_switch = args.setting == "on"
    except StateError as err:
        return _fail(str(err))
    return 0


def _gpu_index(driver_root: str, minor: int) -> int:
    state = StateStore(state_path(driver_root)).read()
    gpus = profiles.simulated_gpus(state.layout(), state.seed)
    # a GPU renumbered by a MIG mode switch answers to its current minor
    minors = [g.minor if s.minor is None else s.minor for g, s in zip(gpus, state.gpus, strict=True)]
    for index, current in enumerate(minors):
        if current == minor:
            return index
    raise ValueError(f"--gpu {minor}: no simulated GPU has that minor number (minors: {minors})")


def _simulate(args: argparse.Namespace, action: Callable[[SimulatedNvml, int], None]) -> int:
    try:
        index = _gpu_index(args.driver_root, args.gpu)
        action(open_simulated_nvml(args.driver_root), index)
    except (StateError, ValueError) as err:
        return _fail(str(err))
    return 0


def _xid(args: argparse.Namespace) -> int:
    if args.ci is not None and args.gi is None:
        return _fail("--ci needs --gi (a compute instance lives inside a GPU instance)")
    every = simulator_nvml.ALL_INSTANCES
    gi = every if args.gi is None else args.gi
    ci = every if args.ci is None else args.ci
    action = (
        pynvml.NVML_GPU_RECOVERY_ACTION_NONE
        if args.no_reset_required
        else pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    )
    kind = pynvml.nvmlEventTypeDoubleBitEccError if args.ecc_event else pynvml.nvmlEventTypeXidCriticalError
    return _simulate(args, lambda nvml, index: nvml.inject_xid(index, args.xid, gi, ci, action, kind))


def _gpu_lost(args: argparse.Namespace) -> int:
    return _simulate(args, lambda nvml, index: nvml.lose_gpu(index))


def _recover(args: argparse.Namespace) -> int:
    return _simulate(args, lambda nvml, index: nvml.recover_gpu(index))


def main(argv: list[str] | None = None) -> int:
    """Run this sub-command alone (`python -m dra_gpu.cli.hardware ...`), without the other sub-commands."""
    parser = argparse.ArgumentParser(prog="dra-gpu")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["hardware", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
