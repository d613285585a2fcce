"""The pure parts of the product-path check on a real GPU (e2e/real_gpu/product_path.py): the container view
from a CDI spec, the allocations it asks the project's allocator for, the settings comparison and the
figures table. A lent GPU machine runs the whole flow; `--dry-run` runs it on the simulator."""

from __future__ import annotations

from typing import Any

import pytest

from e2e.real_gpu.cdi_view import BindMount, CdiViewError, namespace_command, view_plan
from e2e.real_gpu.claim_server import AllocationError, allocate, claim_object
from e2e.real_gpu.product_path import (
    daemon_records,
    figures_table,
    mps_config,
    ratio,
    settings_diff,
    settings_of,
    share_request,
    sm_share_ok,
)

KIND = "k8s.gpu.nvidia.com/claim"
SPEC: dict[str, Any] = {
    "cdiVersion": "0.6.0",
    "kind": KIND,
    "containerEdits": {
        "env": ["DRA_GPU_CLAIM=ns/c", "X=spec"],
        "deviceNodes": [{"path": "/dev/nvidiactl"}],
        "mounts": [
            {
                "hostPath": "/drv/lib/libcuda.so.1",
                "containerPath": "/usr/lib/libcuda.so.1",
                "options": ["ro"],
            },
            {
                "hostPath": "/drv/lib/libabsent.so.1",
                "containerPath": "/usr/lib/libabsent.so.1",
                "options": [],
            },
        ],
        "hooks": [{"hookName": "createContainer", "path": "/hook", "args": ["hook", "update-ldcache"]}],
    },
    "devices": [
        {
            "name": "uid-gpu-0-shared",
            "containerEdits": {
                "env": ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps/pipe", "X=device"],
                "deviceNodes": [{"path": "/dev/nvidia0"}, {"path": "/dev/nvidiactl"}],
                "mounts": [
                    {
                        "hostPath": "/plg/mps/s/clients",
                        "containerPath": "/tmp/nvidia-mps",
                        "options": ["bind"],
                    },
                    {"hostPath": "/plg/mps/s/shm", "containerPath": "/dev/shm", "options": ["bind"]},
                ],
            },
        },
        {"name": "other", "containerEdits": {"env": ["Y=1"]}},
    ],
}
HOST = {
    "/drv/lib/libcuda.so.1": "file",
    "/usr/lib/libcuda.so.1": "file",
    "/drv/lib/libabsent.so.1": "file",
    "/usr/lib": "dir",
    "/plg/mps/s/clients": "dir",
    "/plg/mps/s/shm": "dir",
    "/tmp": "dir",
    "/dev/shm": "dir",
}


def test_view_plan_applies_spec_then_device_edits() -> None:
    plan = view_plan(SPEC, [f"{KIND}=uid-gpu-0-shared"], HOST.get)
    assert plan.env == {
        "DRA_GPU_CLAIM": "ns/c",
        "X": "device",  # the device's entry comes after the spec's
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps/pipe",
    }
    assert plan.mounts == [
        BindMount("/drv/lib/libcuda.so.1", "/usr/lib/libcuda.so.1", read_only=True),
        BindMount("/plg/mps/s/clients", "/tmp/nvidia-mps", read_only=False),
        BindMount("/plg/mps/s/shm", "/dev/shm", read_only=False),
    ]
    assert plan.create_dirs == ["/tmp/nvidia-mps"]  # a directory whose parent exists
    assert plan.skipped == ["/usr/lib/libabsent.so.1: missing on this host"]
    assert plan.device_nodes == ["/dev/nvidiactl", "/dev/nvidia0"]
    assert plan.hooks == ["createContainer: /hook hook update-ldcache"]
    assert "Y" not in plan.env  # a device the claim was not given


def test_view_plan_refuses_unknown_ids() -> None:
    with pytest.raises(CdiViewError, match="no device"):
        view_plan(SPEC, [f"{KIND}=missing"], HOST.get)
    with pytest.raises(CdiViewError, match="kind"):
        view_plan(SPEC, ["other.com/x=uid-gpu-0-shared"], HOST.get)
    with pytest.raises(CdiViewError, match="qualified"):
        view_plan(SPEC, ["uid-gpu-0-shared"], HOST.get)


def test_namespace_command_binds_then_drops_to_the_uid() -> None:
    plan = view_plan(SPEC, [f"{KIND}=uid-gpu-0-shared"], HOST.get)
    argv = namespace_command(plan, 65532, ["python3", "client.py"])
    assert argv[:4] == ["unshare", "--mount", "--propagation", "private"]
    script = argv[6]
    assert script.index("mount --bind /plg/mps/s/clients /tmp/nvidia-mps") < script.index("setpriv")
    assert "mount -o remount,bind,ro /usr/lib/libcuda.so.1" in script
    assert argv[7:] == ["sh", "65532", "python3", "client.py"]


def _slices() -> list[dict[str, Any]]:
    counters = {"memory": {"value": "81559Mi"}, "multiprocessors": {"value": "132"}}
    gpu = {
        "name": "gpu-0",
        "attributes": {"type": {"string": "gpu"}},
        "consumesCounters": [{"counterSet": "gpu-0-counter-set", "counters": counters}],
    }
    share = {
        "name": "gpu-0-shared",
        "attributes": {"type": {"string": "gpu-share"}},
        "allowMultipleAllocations": True,
        "capacity": {
            "compute": {
                "value": "100",
                "requestPolicy": {"default": "10", "validRange": {"min": "5", "step": "5"}},
            },
            "memory": {"value": "81559Mi", "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi"}}},
        },
        "consumesCounters": [{"counterSet": "gpu-0-counter-set", "counters": counters}],
    }
    spec = {
        "driver": "gpu.nvidia.com",
        "nodeName": "n",
        "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
        "sharedCounters": [{"name": "gpu-0-counter-set", "counters": counters}],
        "devices": [gpu, share],
    }
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "n-0"},
            "spec": spec,
        }
    ]


def test_allocations_follow_the_scheduler() -> None:
    slices = _slices()
    held: list[dict[str, Any]] = []
    for i in range(4):
        claim = allocate(claim_object("ns", f"q{i}", share_request(25, 10)), slices, "n", held)
        held.append(claim)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["device"] == "gpu-0-shared" and result["shareID"]
        assert result["consumedCapacity"] == {"compute": "25", "memory": "10Gi"}
    with pytest.raises(AllocationError, match="compute"):  # 125 % of a GPU
        allocate(claim_object("ns", "q4", share_request(25, 10)), slices, "n", held)
    whole = claim_object(
        "ns", "w", {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}, [mps_config(50, 10)]
    )
    with pytest.raises(AllocationError):  # the whole GPU excludes its shares
        allocate(whole, slices, "n", held)
    allocate(whole, slices, "n", [])
    assert whole["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    assert whole["status"]["allocation"]["devices"]["config"][0]["source"] == "FromClaim"


NVIDIA_SMI_Q = """
==============NVSMI LOG==============

Driver Version                            : 580.159.04

GPU 00000000:01:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    Persistence Mode                      : Enabled
    Addressing Mode                       : HMM
    MIG Mode
        Current                           : Disabled
        Pending                           : Disabled
    Compute Mode                          : Default
    Applications Clocks
        Graphics                          : 1755 MHz
        Memory                            : 2619 MHz
    GPU Power Readings
        Average Power Draw                : 70.94 W
        Current Power Limit               : 700.00 W
    Temperature
        GPU Current Temp                  : 31 C
"""


def test_settings_of_nvidia_smi_q() -> None:
    settings = settings_of(NVIDIA_SMI_Q)
    gpu = "GPU 00000000:01:00.0 > "
    assert settings == {
        f"{gpu}Persistence Mode": "Enabled",
        f"{gpu}Addressing Mode": "HMM",
        f"{gpu}MIG Mode > Current": "Disabled",
        f"{gpu}MIG Mode > Pending": "Disabled",
        f"{gpu}Compute Mode": "Default",
        f"{gpu}Applications Clocks > Graphics": "1755 MHz",
        f"{gpu}Applications Clocks > Memory": "2619 MHz",
        f"{gpu}GPU Power Readings > Current Power Limit": "700.00 W",
    }
    changed = settings_of(
        NVIDIA_SMI_Q.replace(
            "Compute Mode                          : Default", "Compute Mode : Exclusive_Process"
        )
    )
    assert settings_diff(settings, changed) == [f"{gpu}Compute Mode: 'Default' -> 'Exclusive_Process'"]


def test_ratio_share_rounding_and_records() -> None:
    assert ratio([3.0, 12.6, 12.0, 12.3], 3.0) == pytest.approx(4.2)
    assert ratio([3.0, None], 3.0) is None and ratio([], 3.0) is None and ratio([1.0], None) is None
    assert sm_share_ok(32, 132, 25) and sm_share_ok(66, 132, 50) and not sm_share_ok(132, 132, 25)
    record = {"id": "d", "dir": "/p/mps/d", "pipeDir": "/p/mps/d/clients/pipe", "pid": 7}
    assert daemon_records({"claims": {"u": {"state": {"mpsDaemon": record}}}, "again": [record]}) == [record]


def test_figures_table() -> None:
    table = figures_table(
        [
            {"figure": "1 job alone", "value": 3.01234, "note": "seconds"},
            {"figure": "4 jobs in 4 shares of 25 %", "value": None, "note": ""},
            {"figure": "memory", "value": 10240.0},
        ]
    )
    assert table.splitlines() == [
        "| figure                     | value | note    |",
        "|----------------------------|-------|---------|",
        "| 1 job alone                | 3.01  | seconds |",
        "| 4 jobs in 4 shares of 25 % | n/a   |         |",
        "| memory                     | 10240 |         |",
    ]
