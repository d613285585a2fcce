"""Install or remove the driver on the local cluster as host processes (`-m e2e.lib.install up|down|status`).

`up` applies the chart's DeviceClasses, starts the webhook (TLS on loopback, registered through a
ValidatingWebhookConfiguration) and the kubelet plugin with the chart's flags, and waits for the node's
ResourceSlices. It is idempotent, so run-e2e.sh, the demo and pytest can all call it.
"""

from __future__ import annotations

import argparse
import sys

from e2e.lib.driver import HostDriver
from e2e.lib.kubectl import Kubectl
from e2e.lib.settings import DriverMode, load_settings
from e2e.lib.summary import record_timing


def _log(msg: str) -> None:
    print(f"[driver] {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.lib.install")
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--report", help="record install timings in this run report (JSON)")
    args = parser.parse_args(argv)
    settings = load_settings()
    if settings.mode is not DriverMode.HOST:
        _log("DRA_GPU_E2E_MODE is not 'host': the chart installs the driver (e2e/kind/run.sh)")
        return 2
    driver = HostDriver(settings, Kubectl(settings.kubeconfig))
    if args.action == "up":
        times = driver.install(log=_log)
        slices = driver.slices()
        devices = sum(len(s["spec"].get("devices") or []) for s in slices)
        _log(f"{len(slices)} ResourceSlices with {devices} devices on {driver.node_name}")
        if args.report:
            from pathlib import Path

            for key, value in times.items():
                record_timing(Path(args.report), f"driver_{key}", value)
        return 0
    if args.action == "down":
        driver.uninstall()
        _log("driver stopped, webhook configuration and DeviceClasses removed")
        return 0
    running = driver.plugin_running()
    print(
        f"kubelet plugin {'running' if running else 'not running'} (log {settings.artifacts / 'plugin.log'})"
    )
    return 0 if running else 1


if __name__ == "__main__":
    sys.exit(main())
