"""The NVML simulator: a `pynvml`-shaped object (`SimulatedNvml`) over a locked JSON state file
(`StateStore`)."""

from dra_gpu.hardware.simulator.nvml import SimulatedNvml
from dra_gpu.hardware.simulator.state import Fault, SimState, StateError, StateStore

__all__ = ["Fault", "SimState", "SimulatedNvml", "StateError", "StateStore"]
