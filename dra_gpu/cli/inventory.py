"""`dra-gpu inventory`: what the driver sees and would publish, as a table (or JSON)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dra_gpu.cli.hardware import add_hardware_args, hardware_from_args
from dra_gpu.hardware.interface import HardwareError
from dra_gpu.hardware.types import DiscoveryResult
from dra_gpu.inventory.device_model import ModelOptions, build_device_model
from dra_gpu.inventory.model import DeviceKind, DeviceModel


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "inventory",
        help="show the GPUs, MIG devices and placements the driver would publish",
        description="Discover GPUs (real NVML or a simulated node) and print the device model.",
    )
    add_hardware_args(parser)
    parser.add_argument(
        "--no-dynamic-mig",
        dest="dynamic_mig",
        action="store_false",
        help="publish existing MIG devices only (static MIG)",
    )
    parser.add_argument(
        "--no-fractional",
        dest="fractional",
        action="store_false",
        help="do not publish gpu-<minor>-shared devices",
    )
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")
    parser.set_defaults(func=run)


def render_table(discovery: DiscoveryResult, model: DeviceModel) -> str:
    lines = [
        f"driver {discovery.driver_version}, CUDA {discovery.cuda_driver_version[0]}."
        f"{discovery.cuda_driver_version[1]}, {len(discovery.gpus)} GPU(s)",
        "",
    ]
    lines.append(
        f"{'MINOR':>5} {'INDEX':>5}  {'PRODUCT':<24} {'MEMORY':>9} {'SMS':>4}  {'PCI BUS ID':<12} "
        f"{'NUMA':>4}  {'INTERCONNECT':<12} {'MIG':<9} UUID"
    )
    for gpu in sorted(discovery.gpus, key=lambda g: g.minor):
        mig = "n/a"
        if gpu.mig_capable:
            mig = "enabled" if gpu.mig_enabled else "disabled"
            if gpu.mig_pending != gpu.mig_enabled:
                mig += "*"
        numa = "-" if gpu.numa_node is None else str(gpu.numa_node)
        lines.append(
            f"{gpu.minor:>5} {gpu.index:>5}  {gpu.product_name[:24]:<24} "
            f"{gpu.memory_bytes / 2**30:>7.1f}Gi {gpu.multiprocessors:>4}  {gpu.pci_bus_id:<12} {numa:>4}  "
            f"{gpu.interconnect or 'pcie':<12} {mig:<9} {gpu.uuid}"
        )
    for error in discovery.errors:
        where = f"GPU index {error.gpu_index}" if error.gpu_index is not None else "driver"
        lines.append(f"  ! {where}: {error.message}")
    existing = [m for g in discovery.gpus for m in g.mig_instances]
    if existing:
        lines += ["", "MIG devices that exist now:"]
        lines += [
            f"  gpu {m.parent_minor}: {m.profile:<11} gi {m.gi_id:>2} ci {m.ci_id}  placement "
            f"{m.placement.start}:{m.placement.size}  {m.uuid}"
            for m in existing
        ]
    lines += ["", "Published devices:"]
    kinds = {k: 0 for k in DeviceKind}
    for device in model.devices:
        kinds[device.kind] += 1
    lines.append("  " + ", ".join(f"{n} {k.value}" for k, n in kinds.items() if n))
    by_gpu: dict[int, list[str]] = {}
    for device in model.devices:
        if device.kind in (DeviceKind.MIG_DYNAMIC, DeviceKind.MIG_STATIC) and device.mig is not None:
            mig_spec = device.mig
            by_gpu.setdefault(device.parent_minor, []).append(
                f"{mig_spec.profile}@{mig_spec.placement_start}:{mig_spec.placement_size}"
            )
    for minor, placements in sorted(by_gpu.items()):
        lines.append(f"  gpu {minor} MIG placements ({len(placements)}): {' '.join(placements)}")
    for warning in model.warnings:
        lines.append(f"  ! {warning}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        with hardware_from_args(args) as hardware:
            discovery = hardware.discover()
    except HardwareError as err:
        print(f"dra-gpu inventory: {err}", file=sys.stderr)
        return 1
    model = build_device_model(
        discovery, ModelOptions(dynamic_mig=args.dynamic_mig, fractional=args.fractional)
    )
    if args.output == "json":
        print(
            json.dumps(
                {
                    "driverVersion": discovery.driver_version,
                    "gpus": [
                        {
                            "minor": g.minor,
                            "index": g.index,
                            "uuid": g.uuid,
                            "productName": g.product_name,
                            "pciBusID": g.pci_bus_id,
                            "numaNode": g.numa_node,
                            "addressingMode": g.addressing_mode,
                            "migEnabled": g.mig_enabled,
                        }
                        for g in discovery.gpus
                    ],
                    "errors": [{"gpuIndex": e.gpu_index, "message": e.message} for e in discovery.errors],
                    "devices": [{"name": d.name, "kind": d.kind.value} for d in model.devices],
                    "warnings": list(model.warnings),
                },
                indent=2,
            )
        )
    else:
        print(render_table(discovery, model))
    return 1 if not discovery.gpus and discovery.errors else 0


def main(argv: list[str] | None = None) -> int:
    """Run this sub-command alone (`python -m dra_gpu.cli.inventory ...`), without the other sub-commands."""
    parser = argparse.ArgumentParser(prog="dra-gpu")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["inventory", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
