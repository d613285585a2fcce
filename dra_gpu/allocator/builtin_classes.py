"""The DeviceClasses this driver's chart installs; `explain` and `lint` assume them when none are given."""

from __future__ import annotations

from typing import Any

DRIVER = "gpu.nvidia.com"

BUILTIN_CLASS_TYPES = {
    "gpu.nvidia.com": "gpu",
    "mig.nvidia.com": "mig",
    "gpu-share.nvidia.com": "gpu-share",
}
# The chart's default `deviceClasses.gpu.extendedResourceName` (as NVIDIA's chart): pods asking for
# `nvidia.com/gpu` get whole GPUs through DRA where the device plugin is not installed.
BUILTIN_EXTENDED_RESOURCE_NAMES = {"gpu.nvidia.com": "nvidia.com/gpu"}


def builtin_device_classes() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {
                "selectors": [
                    {
                        "cel": {
                            "expression": f"device.driver == '{DRIVER}' && "
                            f"device.attributes['{DRIVER}'].type == '{device_type}'"
                        }
                    }
                ],
                **(
                    {"extendedResourceName": BUILTIN_EXTENDED_RESOURCE_NAMES[name]}
                    if name in BUILTIN_EXTENDED_RESOURCE_NAMES
                    else {}
                ),
            },
        }
        for name, device_type in BUILTIN_CLASS_TYPES.items()
    ]
