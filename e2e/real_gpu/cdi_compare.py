"""dra-gpu's own CDI driver discovery next to `nvidia-ctk cdi generate`, on a real driver root. Read-only.

    PYTHONPATH=. python3 e2e/real_gpu/cdi_compare.py --nvidia-ctk PATH --hook PATH [--nvidia-driver-root /]

prints JSON: the files each mounts (host path -> container path), found by both, only by NVIDIA's, only by
ours; the hooks of each; the env of each. The plugin uses nvidia-ctk's edits when it can run (the image has
it) and its own discovery otherwise; this shows what the fallback misses on a real host.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from dra_gpu.cdi.driver_discovery import discover_from_driver_root


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nvidia-ctk", required=True)
    parser.add_argument("--hook", required=True, help="path of nvidia-cdi-hook")
    parser.add_argument("--nvidia-driver-root", default="/")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "nvidia.json"
        subprocess.run(
            [args.nvidia_ctk, "cdi", "generate", f"--driver-root={args.nvidia_driver_root}",
             f"--nvidia-cdi-hook-path={args.hook}", "--format=json", f"--output={out}"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        nvidia: dict[str, Any] = json.loads(out.read_text())
    common = nvidia.get("containerEdits") or {}
    ours = discover_from_driver_root(args.nvidia_driver_root, hook_path=args.hook)
    theirs = {(m["hostPath"], m["containerPath"]) for m in common.get("mounts") or []}
    mine = {(m.host_path, m.container_path) for m in ours.mounts}
    report = {
        "mounts": {
            "both": sorted(theirs & mine),
            "onlyNvidia": sorted(theirs - mine),
            "onlyOurs": sorted(mine - theirs),
        },
        "deviceNodes": {
            "nvidia": sorted({n["path"] for n in common.get("deviceNodes") or []}),
            "ours": sorted({n.path for n in ours.device_nodes}),
            "nvidiaPerDevice": sorted(
                {n["path"] for d in nvidia.get("devices") or [] for n in d["containerEdits"]["deviceNodes"]}
            ),
        },
        "hooks": {
            "nvidia": [[h["path"], *h["args"][1:]] for h in common.get("hooks") or []],
            "ours": [[h.path, *h.args[1:]] for h in ours.hooks],
        },
        "env": {"nvidia": common.get("env") or [], "ours": list(ours.env)},
        "nvidiaDevices": [d["name"] for d in nvidia.get("devices") or []],
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
