"""The simulated MPS records as tests look them up: by the host path of a daemon's pipe directory.

The simulator keys each daemon's record by its pipe directory's identity (device and inode), since every
daemon sees its own at /tmp/nvidia-mps in its mount namespace; a test knows the host path the driver recorded
(`pipeDir`, or `stageDir` before a daemon is put in place), which resolves to the same identity."""

from __future__ import annotations

import os
from typing import Any

from dra_gpu.hardware.sim_tools.mps_records import pipe_dir_key, read_records


class RecordsByPipeDir(dict[str, dict[str, Any]]):
    """`read_records`' answer, also indexable by a host path of a pipe directory."""

    def __missing__(self, path: str) -> dict[str, Any]:
        try:
            key = pipe_dir_key(path)
        except OSError:
            raise KeyError(path) from None
        if key not in self:
            raise KeyError(path)
        return self[key]

    def __contains__(self, item: object) -> bool:
        if super().__contains__(item):
            return True
        try:
            return isinstance(item, str) and super().__contains__(pipe_dir_key(item))
        except OSError:
            return False

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default


def mps_records(driver_root: str | os.PathLike[str]) -> RecordsByPipeDir:
    return RecordsByPipeDir(read_records(driver_root))
