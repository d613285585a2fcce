"""A fake `nvidia-smi` for simulated driver roots (`DRA_GPU_SIM_ROOT`), backed by the NVML simulator.

Supported: `-L`, `-q [-x] [-i X]`, `-i X -c MODE`, `compute-policy -i X --set-timeslice N`, `mig
-lgip|-lgipp|-lgi [-i X]`, `mig [-i X] -cgi P[,P...] [-C]` (GPU instances by profile ID or name, each with
its full compute instance under `-C`, placed where the real driver places them, so an order the real driver
cannot fit fails here too: what nvidia-mig-parted does for a layout), `-i X -mig 0|1`, `-i X -r`
(reset: applies a pending MIG mode). `X` is an index, a UUID or a PCI bus id, comma-separated lists allowed.
Output follows the real tool's layout closely enough for the driver and for people comparing with a real
machine; changes go into the simulator state.
"""

from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

import pynvml

from dra_gpu.hardware import profiles
from dra_gpu.hardware.sim_driver_root import open_simulated_nvml
from dra_gpu.hardware.simulator.nvml import SimulatedNvml
from dra_gpu.hardware.simulator.state import SimState
from dra_gpu.hardware.types import normalize_bus_id

_COMPUTE_MODES = {"0": 0, "DEFAULT": 0, "2": 2, "PROHIBITED": 2, "3": 3, "EXCLUSIVE_PROCESS": 3}
_COMPUTE_MODE_NAMES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
_TIMESLICE_NAMES = {0: "Default", 1: "Short", 2: "Medium", 3: "Long"}
# nvidia-smi(1) RETURN VALUE: which exit code the real tool gives for an NVML failure.
RC_NOT_SUPPORTED = 3  # "the requested operation is not available on target device"
_RC_BY_NVML_ERROR = {
    pynvml.NVML_ERROR_INVALID_ARGUMENT: 2,
    pynvml.NVML_ERROR_NOT_SUPPORTED: RC_NOT_SUPPORTED,
    pynvml.NVML_ERROR_NO_PERMISSION: 4,
    pynvml.NVML_ERROR_NOT_FOUND: 6,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: 13,
    pynvml.NVML_ERROR_CORRUPTED_INFOROM: 14,
    pynvml.NVML_ERROR_GPU_IS_LOST: 15,
}
RC_OTHER = 255
_LGIP_RULE = "+" + "-" * 77 + "+"
_LGIP_HEAD = [
    _LGIP_RULE,
    f"| {'GPU instance profiles:':<76}|",
    "| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |",
    "|                              Free/Total   GiB              CE    JPEG  OFA  |",
    "|" + "=" * 77 + "|",
]
# The fault name `compute-policy --set-timeslice` answers to (`dra-gpu hardware fault --function ...`): the
# simulator has no NVML function for it, and a lost GPU ("*") fails it too.
SET_TIMESLICE_STEP = "nvidia-smi compute-policy --set-timeslice"
# nvmlErrorString's text, which the real tool prints: pynvml only has it from libnvidia-ml itself (without the
# library it says "NVML Error with code 23").
_NVML_ERROR_TEXT = {
    pynvml.NVML_ERROR_UNINITIALIZED: "Uninitialized",
    pynvml.NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    pynvml.NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    pynvml.NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    pynvml.NVML_ERROR_NOT_FOUND: "Not Found",
    pynvml.NVML_ERROR_TIMEOUT: "Timeout",
    pynvml.NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    pynvml.NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    pynvml.NVML_ERROR_IN_USE: "In use by another client",
    pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient Resources",
    pynvml.NVML_ERROR_UNKNOWN: "Unknown Error",
}


def _exit_code_for(err: pynvml.NVMLError) -> int:
    return _RC_BY_NVML_ERROR.get(getattr(err, "value", None), RC_OTHER)


def nvml_error_text(err: pynvml.NVMLError) -> str:
    return _NVML_ERROR_TEXT.get(getattr(err, "value", None), str(err))


class UsageError(Exception):
    pass


class PartlyDoneError(Exception):
    """A command that did part of its work before NVML refused the rest: what it printed, then the error."""

    def __init__(self, done: str, error: str, code: int) -> None:
        super().__init__(error)
        self.done, self.error, self.code = done, error, code


def _option(args: list[str], *names: str) -> str | None:
    for name in names:
        if name in args:
            i = args.index(name)
            if i + 1 >= len(args):
                raise UsageError(f"option {name} needs a value")
            value = args[i + 1]
            del args[i : i + 2]
            return value
        for i, arg in enumerate(args):
            if arg.startswith(name + "="):
                del args[i]
                return arg.split("=", 1)[1]
    return None


def _flag(args: list[str], *names: str) -> bool:
    for name in names:
        if name in args:
            args.remove(name)
            return True
    return False


class Smi:
    def __init__(self, nvml: SimulatedNvml) -> None:
        self.nvml = nvml
        nvml.nvmlInit()
        self.state: SimState = nvml.store.read()
        self.gpus = profiles.simulated_gpus(self.state.layout(), self.state.seed)

    def select(self, spec: str | None) -> list[profiles.SimulatedGpu]:
        if spec is None:
            return list(self.gpus)
        chosen = []
        for item in spec.split(","):
            item = item.strip()
            match = [
                g
                for g in self.gpus
                if item in (str(g.index), g.uuid)
                or (":" in item and normalize_bus_id(item) == g.sysfs_bus_id)
            ]
            if not match:
                raise UsageError(f"No devices were found matching {item!r}")
            chosen.extend(match)
        return chosen

    def handle(self, gpu: profiles.SimulatedGpu) -> Any:
        return self.nvml.nvmlDeviceGetHandleByIndex(gpu.index)

    # ---- queries ----
    def list_gpus(self) -> str:
        lines = []
        for gpu in self.gpus:
            lines.append(f"GPU {gpu.index}: {gpu.profile.product_name} (UUID: {gpu.uuid})")
            gstate = self.state.gpus[gpu.index]
            if not gstate.mig_current:
                continue
            device = 0
            for gi in gstate.gpu_instances:
                spec = next(p for p in gpu.profile.mig_profiles if p.gi_profile_id == gi.profile_id)
                for ci in gi.compute_instances:
                    # "  MIG 2g.35gb     Device  2:", "  MIG 1c.3g.71gb  Device  0:": the name in 11 columns
                    # and a space (an H200 and an H100, driver 590.48.01, tests/hardware/data/real/*/
                    # nvidia-gpu-exporter-mig-590.48.01/nvidia-smi-L.txt; the MIG User Guide's A100 too)
                    name = (
                        spec.name
                        if ci.slice_count >= spec.compute_slices
                        else f"{ci.slice_count}c.{spec.name}"
                    )
                    lines.append(f"  MIG {name:<11} Device {device:>2}: (UUID: {ci.uuid})")
                    device += 1
        return "\n".join(lines)

    def query(self, selected: list[profiles.SimulatedGpu]) -> str:
        layout = self.state.layout()
        cuda = layout.cuda_driver_version
        out = [
            "==============NVSMI LOG==============",
            "",
            f"Driver Version                            : {layout.driver_version}",
            f"CUDA Version                              : {cuda // 1000}.{(cuda % 1000) // 10}",
            "",
            f"Attached GPUs                             : {len(self.gpus)}",
        ]
        for gpu in selected:
            gstate = self.state.gpus[gpu.index]
            profile = gpu.profile
            mig = ("Enabled" if gstate.mig_current else "Disabled") if profile.mig_capable else "N/A"
            pending = ("Enabled" if gstate.mig_pending else "Disabled") if profile.mig_capable else "N/A"
            arch = profiles.ARCHITECTURE_NAMES.get(profile.architecture, "Unknown")
            brand = {profiles.BRAND_TESLA: "Tesla", profiles.BRAND_NVIDIA: "NVIDIA"}.get(
                profile.brand, "Unknown"
            )
            timeslice = _TIMESLICE_NAMES.get(gstate.timeslice, "?") if profile.supports_timeslice else "N/A"
            out += [
                f"GPU {gpu.pci_bus_id}",
                f"    Product Name                          : {profile.product_name}",
                f"    Product Brand                         : {brand}",
                f"    Product Architecture                  : {arch}",
                "    MIG Mode",
                f"        Current                           : {mig}",
                f"        Pending                           : {pending}",
                f"    GPU UUID                              : {gpu.uuid}",
                f"    Minor Number                          : {gpu.minor}",
                "    PCI",
                f"        Bus                               : 0x{gpu.slot.pci_bus:02X}",
                f"        Bus Id                            : {gpu.pci_bus_id}",
                f"        Device Id                         : 0x{profile.pci_device_id:08X}",
                "    FB Memory Usage",
                f"        Total                             : {profile.memory_mib} MiB",
                f"    Compute Mode                          : {_COMPUTE_MODE_NAMES[gstate.compute_mode]}",
                "    Compute Policy",
                f"        Timeslice                         : {timeslice}",
                f"    Numa Node                             : "
                f"{'N/A' if gpu.slot.numa_node is None else gpu.slot.numa_node}",
                f"    Compute Capability                    : {profile.cuda_compute_capability[0]}."
                f"{profile.cuda_compute_capability[1]}",
                f"    Multiprocessor Count                  : {profile.multiprocessors}",
                "",
            ]
        return "\n".join(out)

    def query_xml(self, selected: list[profiles.SimulatedGpu]) -> str:
        """`nvidia-smi -q -x`: the fields of the real XML log that the driver's discovery can be compared
        with."""
        layout = self.state.layout()
        cuda = layout.cuda_driver_version
        root = ET.Element("nvidia_smi_log")
        ET.SubElement(root, "driver_version").text = layout.driver_version
        ET.SubElement(root, "cuda_version").text = f"{cuda // 1000}.{(cuda % 1000) // 10}"
        ET.SubElement(root, "attached_gpus").text = str(len(self.gpus))
        for gpu in selected:
            gstate = self.state.gpus[gpu.index]
            profile = gpu.profile
            node = ET.SubElement(root, "gpu", id=gpu.pci_bus_id)
            ET.SubElement(node, "product_name").text = profile.product_name
            brand = {profiles.BRAND_TESLA: "Tesla", profiles.BRAND_NVIDIA: "NVIDIA"}.get(
                profile.brand, "Unknown"
            )
            ET.SubElement(node, "product_brand").text = brand
            arch = profiles.ARCHITECTURE_NAMES.get(profile.architecture, "Unknown")
            ET.SubElement(node, "product_architecture").text = arch
            mig = ET.SubElement(node, "mig_mode")
            if profile.mig_capable:
                ET.SubElement(mig, "current_mig").text = "Enabled" if gstate.mig_current else "Disabled"
                ET.SubElement(mig, "pending_mig").text = "Enabled" if gstate.mig_pending else "Disabled"
            else:
                ET.SubElement(mig, "current_mig").text = "N/A"
                ET.SubElement(mig, "pending_mig").text = "N/A"
            ET.SubElement(node, "uuid").text = gpu.uuid
            ET.SubElement(node, "minor_number").text = str(gpu.minor)
            pci = ET.SubElement(node, "pci")
            ET.SubElement(pci, "pci_bus").text = f"{gpu.slot.pci_bus:02X}"
            ET.SubElement(pci, "pci_bus_id").text = gpu.pci_bus_id
            ET.SubElement(pci, "pci_device_id").text = f"{profile.pci_device_id:08X}"
            memory = ET.SubElement(node, "fb_memory_usage")
            ET.SubElement(memory, "total").text = f"{profile.memory_mib} MiB"
            ET.SubElement(node, "compute_mode").text = _COMPUTE_MODE_NAMES[gstate.compute_mode]
            numa = "N/A" if gpu.slot.numa_node is None else str(gpu.slot.numa_node)
            ET.SubElement(node, "numa_node").text = numa
        return '<?xml version="1.0" ?>\n' + ET.tostring(root, encoding="unicode")

    def mig_list_profiles(self, selected: list[profiles.SimulatedGpu]) -> str:
        """`nvidia-smi mig -lgip`: the real tool's table, two rows a profile. Laid out column for column as a
        GH200 printed it, driver 550.54.15 (2024-07-27, tests/hardware/data/real/nvidia-gh200-96gb-hbm3/
        cuanschutz-slurm-mig-log/nvidia-smi-mig-lgip.txt); newer drivers print the name column two wider."""
        rows: list[str] = []
        for gpu in selected:
            if not self.state.gpus[gpu.index].mig_current:
                continue
            for spec in gpu.profile.mig_profiles:
                free = self.nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(
                    self.handle(gpu), spec.gi_profile_id
                )
                rows += [
                    f"|{gpu.index:>4}  MIG {spec.name:<13}{spec.gi_profile_id:>3}     "
                    f"{f'{free}/{spec.max_instances}':<11}{spec.memory_mib / 1024:<11.2f}{'No':<7}"
                    f"{spec.multiprocessors:<7}{spec.decoders:<6}{spec.encoders:<4}|",
                    f"|{'':61}{spec.copy_engines:<6}{spec.jpeg_engines:<6}{spec.ofa_engines:<4}|",
                    _LGIP_RULE,
                ]
        if not rows:
            return "No MIG-enabled devices found."
        return "\n".join(_LGIP_HEAD + rows)

    def mig_list_placements(self, selected: list[profiles.SimulatedGpu]) -> str:
        """`nvidia-smi mig -lgipp`: "Placements:" before several starts, "Placement :" before one, as real
        ones print it (an H100 80GB HBM3, a public nvidia-smi usage note; the MIG User Guide's A100 too)."""
        rows: list[str] = []
        for gpu in selected:
            if not self.state.gpus[gpu.index].mig_current:
                continue
            for spec in gpu.profile.mig_profiles:
                word = "Placements:" if len(spec.starts) > 1 else "Placement :"
                where = ",".join(str(s) for s in spec.starts)
                size = spec.memory_slices
                rows.append(
                    f"GPU {gpu.index:>2} Profile ID {spec.gi_profile_id:>2} {word} {{{where}}}:{size}"
                )
        if not rows:
            return "No MIG-enabled devices found."
        return "\n".join(rows)

    def mig_list_instances(self, selected: list[profiles.SimulatedGpu]) -> str:
        rows = [
            "| GPU   Name             Profile  Instance   Placement  |",
            "|                          ID       ID       Start:Size |",
        ]
        count = 0
        for gpu in selected:
            for gi in self.state.gpus[gpu.index].gpu_instances:
                spec = next(p for p in gpu.profile.mig_profiles if p.gi_profile_id == gi.profile_id)
                rows.append(
                    f"|  {gpu.index:>2}  MIG {spec.name:<13} {gi.profile_id:>3} {gi.gi_id:>9} "
                    f"{gi.start:>9}:{gi.size}    |"
                )
                count += 1
        if not count:
            return "No GPU instances found: Not Found"
        return "\n".join(rows)

    # ---- changes ----
    def set_compute_mode(self, selected: list[profiles.SimulatedGpu], mode_name: str) -> str:
        mode = _COMPUTE_MODES.get(mode_name.upper())
        if mode is None:
            raise UsageError(f"invalid compute mode {mode_name!r} (DEFAULT, PROHIBITED, EXCLUSIVE_PROCESS)")
        lines = []
        for gpu in selected:
            self.nvml.nvmlDeviceSetComputeMode(self.handle(gpu), mode)
            lines.append(f"Compute mode set to {_COMPUTE_MODE_NAMES[mode].upper()} for GPU {gpu.pci_bus_id}.")
        return "\n".join(lines)

    def set_timeslice(self, selected: list[profiles.SimulatedGpu], value: str) -> tuple[int, str]:
        """Boards whose profile says `supports_timeslice=False` (Tesla P4) refuse, as the real tool does:
        a message per such GPU and exit code 3 ("operation not available on target device"); the other
        selected GPUs are still changed."""
        if value not in ("0", "1", "2", "3"):
            raise UsageError(f"invalid timeslice {value!r}: 0 (default), 1 (short), 2 (medium), 3 (long)")
        # A GPU that fell off the bus (or any fault injected for this step) refuses like every other NVML call
        # on it: nvidia-smi(1) RETURN VALUE 15, "the GPU has fallen off the bus or has otherwise become
        # inaccessible". The others are still changed, and the exit code is the first failure's.
        failed: dict[int, pynvml.NVMLError] = {}
        for gpu in selected:
            try:
                self.nvml.check_fault(gpu.index, SET_TIMESLICE_STEP)
            except pynvml.NVMLError as err:
                failed[gpu.index] = err
        supported = [g for g in selected if g.profile.supports_timeslice and g.index not in failed]
        with self.nvml.store.transaction() as state:
            for gpu in supported:
                state.gpus[gpu.index].timeslice = int(value)
        lines = []
        code = 0
        for gpu in selected:
            refused = failed.get(gpu.index)
            if refused is not None:
                lines.append(f"Failed to set timeslice for GPU {gpu.pci_bus_id}: {nvml_error_text(refused)}")
                code = code or _exit_code_for(refused)
            elif gpu.profile.supports_timeslice:
                lines.append(f"Set timeslice to {_TIMESLICE_NAMES[int(value)]} for GPU {gpu.pci_bus_id}.")
            else:
                lines.append(f"Setting time slice is not supported for GPU {gpu.pci_bus_id}.")
                code = code or RC_NOT_SUPPORTED
        return code, "\n".join(lines)

    def set_mig_mode(self, selected: list[profiles.SimulatedGpu], value: str) -> str:
        lines = []
        for gpu in selected:
            status = self.nvml.nvmlDeviceSetMigMode(self.handle(gpu), int(value))
            word = "Enabled" if value == "1" else "Disabled"
            lines.append(f"{word} MIG Mode for GPU {gpu.pci_bus_id}.")
            if status == pynvml.NVML_ERROR_RESET_REQUIRED:
                lines.append(
                    f"Warning: MIG mode is in pending {word.lower()[:-1]} state for GPU {gpu.pci_bus_id}: "
                    "a GPU reset is required"
                )
            elif status == pynvml.NVML_ERROR_IN_USE:
                # NVIDIA MIG user guide (enabling MIG mode): a GPU in use by processes keeps the mode pending,
                # the tool warns "In use by another client" and asks to stop those processes and retry (or
                # reboot); the command itself succeeds.
                lines.append(
                    f"Warning: MIG mode is in pending {word.lower()[:-1]} state for GPU {gpu.pci_bus_id}:"
                    f"In use by another client\n{gpu.pci_bus_id} is currently being used by one or more "
                    "other processes. Please first kill all processes using the device and retry the command "
                    "or reboot the system to make MIG mode effective."
                )
        return "\n".join(lines)

    def create_gpu_instances(
        self, selected: list[profiles.SimulatedGpu], wanted: list[str], with_ci: bool
    ) -> str:
        """GPU instances of the `wanted` profiles (IDs such as `19` or names such as `1g.5gb`), in the order
        given, on each selected GPU, where NVML places them (`nvmlDeviceCreateGpuInstance`); with `with_ci`
        each gets the compute instance that spans it. An NVML error (MIG off, no room) stops here and
        raises, leaving what was made before it, as the real tool does."""
        lines: list[str] = []
        for gpu in selected:
            for token in wanted:
                spec = _mig_profile(gpu, token.strip())
                try:
                    gi = self.nvml.nvmlDeviceCreateGpuInstance(self.handle(gpu), spec.gi_profile_id)
                except pynvml.NVMLError as err:
                    text = nvml_error_text(err)
                    raise PartlyDoneError(
                        "\n".join(lines),
                        f"Unable to create a GPU instance on GPU {gpu.index:>2} using profile "
                        f"{spec.gi_profile_id}: {text}\nFailed to create GPU instances: {text}",
                        _exit_code_for(err),
                    ) from err
                gi_id = self.nvml.nvmlGpuInstanceGetInfo(gi).id
                lines.append(
                    f"Successfully created GPU instance ID {gi_id:>2} on GPU {gpu.index:>2} using profile "
                    f"MIG {spec.name} (ID {spec.gi_profile_id:>2})"
                )
                if not with_ci:
                    continue
                ci_profile = profiles.full_compute_instance_profile(gpu.profile, spec)
                ci = self.nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile)
                ci_id = self.nvml.nvmlComputeInstanceGetInfo(ci).id
                ci_name = profiles.compute_instance_name(spec, spec.compute_slices)
                lines.append(
                    f"Successfully created compute instance ID {ci_id:>2} on GPU {gpu.index:>2} GPU instance "
                    f"ID {gi_id:>2} using profile MIG {ci_name} (ID {ci_profile:>2})"
                )
        return "\n".join(lines)

    def reset(self, selected: list[profiles.SimulatedGpu]) -> str:
        for gpu in selected:
            self.nvml.reset_gpu(gpu.index)
        return "\n".join(f"GPU {gpu.pci_bus_id} was successfully reset." for gpu in selected)


def _mig_profile(gpu: profiles.SimulatedGpu, token: str) -> profiles.MigProfileSpec:
    for spec in gpu.profile.mig_profiles:
        if token in (str(spec.gi_profile_id), spec.name, f"MIG {spec.name}"):
            return spec
    known = ", ".join(f"{s.gi_profile_id} ({s.name})" for s in gpu.profile.mig_profiles) or "none"
    raise UsageError(f"GPU {gpu.index} has no GPU instance profile {token!r}; its profiles: {known}")


def run(argv: Sequence[str], nvml: SimulatedNvml) -> tuple[int, str]:
    args = list(argv)
    smi = Smi(nvml)
    if args and args[0] == "compute-policy":
        args.pop(0)
        target = smi.select(_option(args, "-i", "--id"))
        value = _option(args, "--set-timeslice")
        if value is None or args:
            raise UsageError("usage: nvidia-smi compute-policy -i <id> --set-timeslice <0-3>")
        return smi.set_timeslice(target, value)
    if args and args[0] == "mig":
        args.pop(0)
        target = smi.select(_option(args, "-i", "--id"))
        if _flag(args, "-lgip", "--list-gpu-instance-profiles"):
            return 0, smi.mig_list_profiles(target)
        if _flag(args, "-lgipp", "--list-gpu-instance-possible-placements"):
            return 0, smi.mig_list_placements(target)
        created = _option(args, "-cgi", "--create-gpu-instance")
        if created is not None:
            with_ci = _flag(args, "-C", "--default-compute-instance")
            if args:
                raise UsageError(f"unsupported mig arguments: {' '.join(args)}")
            return 0, smi.create_gpu_instances(target, created.split(","), with_ci)
        if _flag(args, "-lgi", "--list-gpu-instances"):
            text = smi.mig_list_instances(target)
            return (6 if text.startswith("No GPU instances") else 0), text
        raise UsageError(f"unsupported mig arguments: {' '.join(args)}")
    if _flag(args, "-L", "--list-gpus"):
        return 0, smi.list_gpus()
    target_spec = _option(args, "-i", "--id")
    target = smi.select(target_spec)
    mode = _option(args, "-c", "--compute-mode")
    if mode is not None:
        return 0, smi.set_compute_mode(target, mode)
    mig = _option(args, "-mig", "--multi-instance-gpu")
    if mig is not None:
        if mig not in ("0", "1"):
            raise UsageError("-mig takes 0 or 1")
        return 0, smi.set_mig_mode(target, mig)
    if _flag(args, "-r", "--gpu-reset"):
        return 0, smi.reset(target)
    if _flag(args, "-q", "--query"):
        if _flag(args, "-x", "--xml-format"):
            return 0, smi.query_xml(target)
        return 0, smi.query(target)
    if not args:
        return 0, smi.list_gpus()
    raise UsageError(f"unsupported arguments: {' '.join(args)} (simulated nvidia-smi)")


def main(argv: Sequence[str] | None = None) -> int:
    root = os.environ.get("DRA_GPU_SIM_ROOT")
    if not root:
        print("nvidia-smi (simulated): DRA_GPU_SIM_ROOT is not set", file=sys.stderr)
        return 9
    try:
        code, text = run(sys.argv[1:] if argv is None else argv, open_simulated_nvml(root))
    except UsageError as err:
        print(str(err), file=sys.stderr)
        return 2
    except PartlyDoneError as failure:
        if failure.done:
            print(failure.done)
        print(failure.error, file=sys.stderr)
        return failure.code
    except pynvml.NVMLError as err:
        print(f"Failed: {nvml_error_text(err)}", file=sys.stderr)
        return _exit_code_for(err)
    except Exception as err:  # the state file is missing or unreadable: say so like the real tool would fail
        print(
            f"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver: {err}",
            file=sys.stderr,
        )
        return 9
    print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
