"""`dra-gpu kubelet-plugin`: the node process (composition root).

Wires the hardware (real NVML or the simulator), the device model, ResourceSlice publishing, the prepare
service (checkpoint, CDI, sharing) and the gRPC servers on the kubelet's sockets into one process, plus an
HTTP endpoint for metrics and health. Flags mirror NVIDIA's `gpu-kubelet-plugin`; each can also be set by its
env var.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import structlog

from dra_gpu.gpu_locks import GpuLocks
from dra_gpu.inventory.model import DRIVER_NAME, DeviceModel
from dra_gpu.plugin.health_monitor import add_device_health_args

log = structlog.get_logger("dra_gpu.kubelet_plugin")

DEFAULT_REGISTRAR_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def _env_int(name: str, default: int) -> int:
    value = _env(name)
    try:
        return int(value) if value is not None else default
    except ValueError:
        raise SystemExit(f"environment variable {name}={value!r} is not an integer") from None


def _env_float(name: str, default: float) -> float:
    value = _env(name)
    try:
        return float(value) if value is not None else default
    except ValueError:
        raise SystemExit(f"environment variable {name}={value!r} is not a number") from None


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "kubelet-plugin",
        help="run the node plugin (slices, registration, DRA gRPC, prepare/unprepare, CDI)",
        description="Publish this node's GPUs as ResourceSlices and serve the kubelet's DRA calls.",
    )
    p.add_argument("--node-name", default=_env("NODE_NAME"), help="this node's name [NODE_NAME] (required)")
    p.add_argument(
        "--namespace",
        default=_env("NAMESPACE", "default"),
        help="namespace of the driver's own objects [NAMESPACE] (default: default)",
    )
    p.add_argument(
        "--cdi-root",
        default=_env("CDI_ROOT", "/var/run/cdi"),
        help="directory for the per-claim CDI specs [CDI_ROOT] (default: /var/run/cdi)",
    )
    p.add_argument(
        "--nvidia-driver-root",
        default=_env("NVIDIA_DRIVER_ROOT", _env("HOST_DRIVER_ROOT", "/")),
        help="where the NVIDIA driver is installed on the host; CDI specs name paths under it "
        "[NVIDIA_DRIVER_ROOT] (default: /)",
    )
    p.add_argument(
        "--container-driver-root",
        default=_env("CONTAINER_DRIVER_ROOT"),
        help="where this process finds that driver root (a mount of it, e.g. /driver-root): libraries, "
        "nvidia-smi, nvidia-cuda-mps-control, /proc/driver/nvidia [CONTAINER_DRIVER_ROOT] "
        "(default: same as --nvidia-driver-root)",
    )
    p.add_argument(
        "--nvidia-cdi-hook-path",
        default=_env("NVIDIA_CDI_HOOK_PATH"),
        help="absolute path of nvidia-cdi-hook on the node, named by the CDI hooks; unset: the image's copy "
        "is copied into the plugin directory [NVIDIA_CDI_HOOK_PATH]",
    )
    p.add_argument(
        "--kubelet-registrar-directory-path",
        default=_env("KUBELET_REGISTRAR_DIRECTORY_PATH", DEFAULT_REGISTRAR_DIR),
        help=f"plugin registry [KUBELET_REGISTRAR_DIRECTORY_PATH] ({DEFAULT_REGISTRAR_DIR})",
    )
    p.add_argument(
        "--kubelet-plugins-directory-path",
        default=_env("KUBELET_PLUGINS_DIRECTORY_PATH", DEFAULT_PLUGINS_DIR),
        help=f"plugins directory [KUBELET_PLUGINS_DIRECTORY_PATH] ({DEFAULT_PLUGINS_DIR})",
    )
    p.add_argument(
        "--hardware",
        default=_env("HARDWARE", "real"),
        help="`real` (NVML), a simulated layout/profile such as dgx-h100, or `simulated` (the layout the "
        "simulated driver root already holds) [HARDWARE] (default: real)",
    )
    p.add_argument(
        "--kubeconfig",
        default=_env("KUBECONFIG"),
        help="kubeconfig file; in-cluster config when unset [KUBECONFIG]",
    )
    p.add_argument(
        "--kube-api-qps",
        type=float,
        default=_env_float("KUBE_API_QPS", 5.0),
        help="requests per second to the Kubernetes API server, on average (client-go's QPS: 0 = its default "
        "5, negative = no limit) [KUBE_API_QPS] (default: 5)",
    )
    p.add_argument(
        "--kube-api-burst",
        type=int,
        default=_env_int("KUBE_API_BURST", 10),
        help="requests to the Kubernetes API server allowed at once above --kube-api-qps (client-go's Burst: "
        "0 = its default 10) [KUBE_API_BURST] (default: 10)",
    )
    p.add_argument(
        "--healthcheck-port",
        type=int,
        default=_env_int("HEALTHCHECK_PORT", -1),
        help="port of the gRPC health service (grpc.health.v1: '' liveness, 'readiness', one name per plugin "
        "service), answered without waiting for prepare work; -1 disables [HEALTHCHECK_PORT] (default: -1)",
    )
    p.add_argument(
        "--http-endpoint",
        default=_env("HTTP_ENDPOINT", ""),
        help="host:port for metrics, /healthz, /readyz, e.g. :8080 [HTTP_ENDPOINT] (default: off)",
    )
    p.add_argument(
        "--metrics-path",
        default=_env("METRICS_PATH", "/metrics"),
        help="metrics path on --http-endpoint [METRICS_PATH] (default: /metrics)",
    )
    p.add_argument(
        "--plugin-uid",
        default=_env("PLUGIN_UID", _env("POD_UID")),
        help="rolling-update mode: put this UID into the socket names [PLUGIN_UID / POD_UID]",
    )
    p.add_argument(
        "--health-service",
        default=_env("HEALTH_SERVICE", "true"),
        choices=["true", "false"],
        help="offer the v1alpha1.DRAResourceHealth stream [HEALTH_SERVICE] (default: true)",
    )
    p.add_argument(
        "--publish-slices",
        default=_env("PUBLISH_SLICES", "true"),
        choices=["true", "false"],
        help="publish ResourceSlices for this node [PUBLISH_SLICES] (default: true)",
    )
    p.add_argument(
        "--stale-claim-check-interval",
        type=float,
        default=float(_env_int("STALE_CLAIM_CHECK_INTERVAL", 600)),
        help="seconds between checks for interrupted prepares of deleted claims (default: 600)",
    )
    p.add_argument(
        "--rediscovery-interval",
        type=float,
        default=_env_float("REDISCOVERY_INTERVAL", 60.0),
        help="seconds between hardware re-discoveries (also on SIGHUP); changed devices are republished "
        "[REDISCOVERY_INTERVAL] (default: 60)",
    )
    p.add_argument(
        "--mps-reconcile-seconds",
        type=float,
        default=_env_float("MPS_RECONCILE_SECONDS", 5.0),
        help="seconds between checks of every prepared claim's MPS daemon (a dead one is restarted with the "
        "same limits) [MPS_RECONCILE_SECONDS] (default: 5)",
    )
    p.add_argument(
        "--mps-daemon-mode",
        default=_env("MPS_DAEMON_MODE", "process"),
        choices=["process", "pod"],
        help="how MPS control daemons run: 'process' (detached processes: the plugin runs on the host) or "
        "'pod' (one pod per daemon on this node in --namespace, so they outlive the plugin's container; the "
        "chart's choice) [MPS_DAEMON_MODE] (default: process)",
    )
    p.add_argument(
        "--mps-daemon-image",
        default=_env("MPS_DAEMON_IMAGE"),
        help="image of the MPS daemon pods (the driver's own image) [MPS_DAEMON_IMAGE] (required with "
        "--mps-daemon-mode=pod)",
    )
    p.add_argument(
        "--mps-daemon-image-pull-policy",
        default=_env("MPS_DAEMON_IMAGE_PULL_POLICY", ""),
        help="imagePullPolicy of the MPS daemon pods: Always, IfNotPresent or Never (empty: the cluster's "
        "default) [MPS_DAEMON_IMAGE_PULL_POLICY]",
    )
    p.add_argument(
        "--mps-daemon-image-pull-secrets",
        default=_env("MPS_DAEMON_IMAGE_PULL_SECRETS", ""),
        help="comma-separated names of the Secrets the MPS daemon pods pull their image with "
        "[MPS_DAEMON_IMAGE_PULL_SECRETS]",
    )
    p.add_argument(
        "--mps-daemon-service-account",
        default=_env("MPS_DAEMON_SERVICE_ACCOUNT", ""),
        help="service account of the MPS daemon pods; no token is mounted either way (empty: the namespace's "
        "default) [MPS_DAEMON_SERVICE_ACCOUNT]",
    )
    p.add_argument(
        "--mps-daemon-priority-class",
        default=_env("MPS_DAEMON_PRIORITY_CLASS", "system-node-critical"),
        help="priorityClassName of the MPS daemon pods [MPS_DAEMON_PRIORITY_CLASS] "
        "(default: system-node-critical)",
    )
    p.add_argument(
        "--mps-daemon-tolerations",
        default=_env("MPS_DAEMON_TOLERATIONS", "[]"),
        help="JSON list of tolerations the MPS daemon pods get besides the node not-ready/unreachable ones "
        "(the chart passes the plugin's own) [MPS_DAEMON_TOLERATIONS]",
    )
    p.add_argument(
        "--mps-daemon-resources",
        default=_env("MPS_DAEMON_RESOURCES", ""),
        help='JSON resources of the MPS daemon container (default: {"requests": {"cpu": "10m", "memory": '
        '"64Mi"}}) [MPS_DAEMON_RESOURCES]',
    )
    p.add_argument(
        "--pod-name",
        default=_env("POD_NAME"),
        help="this plugin's own pod: its DaemonSet owns the MPS daemon pods, so that they outlive the "
        "plugin's pods (rolling updates) but not its DaemonSet (helm uninstall) [POD_NAME]",
    )
    p.add_argument(
        "--mps-leave-compute-mode",
        action="store_true",
        default=(_env("MPS_LEAVE_COMPUTE_MODE", "") or "").lower() in ("1", "true", "yes"),
        help="LAB OPTION: leave every GPU's compute mode as it is when MPS serves it (for machines whose GPU "
        "settings must not change). Isolation is weaker: a process that ignores its pipe directory "
        "(CUDA_MPS_PIPE_DIRECTORY) then gets the whole GPU beside the MPS server, where EXCLUSIVE_PROCESS "
        "would refuse it [MPS_LEAVE_COMPUTE_MODE]",
    )
    add_device_health_args(p)
    p.add_argument(
        "--consumable-shares",
        default=_env("CONSUMABLE_SHARES", "disabled"),
        help="share whole GPUs and existing MIG devices among claims, as NVIDIA's driver does: 'disabled', "
        "'memory' (consumable memory, default the whole device), 'unlimited' (memory default 0) or a "
        "positive integer N (at most N claims per device) [CONSUMABLE_SHARES] (default: disabled)",
    )
    p.add_argument(
        "--feature-gates",
        default=_env("FEATURE_GATES", ""),
        help="NVIDIA's driver feature gates, NAME=true|false,...: TimeSlicingSettings, MPSSupport, "
        "DynamicMIG, NVMLDeviceHealthCheck, ConsumableShares (features on by default here; false turns "
        "one off as in NVIDIA's driver), DRAListTypeAttributes (publish list-typed attributes as lists; "
        "only where the cluster has the Kubernetes gate of that name); PassthroughSupport and the other "
        "gates of features dra-gpu lacks are refused when true; NVIDIA's ComputeDomain and klog gates "
        "have no effect (docs/differences-from-nvidia.md) [FEATURE_GATES]",
    )
    p.add_argument(
        "-v",
        "--log-verbosity",
        type=int,
        default=_env_int("LOG_VERBOSITY", 0),
        help="NVIDIA's klog verbosity: 0-5 log at info level, 6 or more also at debug level (API requests, "
        "gRPC calls) [LOG_VERBOSITY] (default: 0)",
    )
    p.add_argument(
        "--log-format",
        default=_env("LOG_FORMAT", "auto"),
        choices=["auto", "json", "console"],
        help="log format; auto = JSON unless stdout is a terminal [LOG_FORMAT]",
    )
    p.set_defaults(func=run)


DEBUG_VERBOSITY = 6  # NVIDIA's level of request/response detail (its chart's logVerbosity comments)


def configure_logging(log_format: str, verbosity: int = 0) -> None:
    json_logs = log_format == "json" or (log_format == "auto" and not sys.stdout.isatty())
    level = logging.DEBUG if verbosity >= DEBUG_VERBOSITY else logging.INFO
    renderer: Any = structlog.processors.JSONRenderer() if json_logs else structlog.dev.ConsoleRenderer()
    shared: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # One write per line (PrintLogger's print writes the line and its newline apart, then flushes).
        logger_factory=structlog.WriteLoggerFactory(file=sys.stdout),
        cache_logger_on_first_use=True,
    )
    # Modules that log through the standard library (the slice controller) come out in the same format.
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def daemon_pod_settings(args: argparse.Namespace) -> Any:
    """The MPS daemon pods' settings from the flags; ValueError naming the flag when one is malformed."""
    from dra_gpu.sharing.mps_pods import DEFAULT_RESOURCES, NODE_LIFECYCLE_TOLERATIONS, DaemonPodSettings

    def json_flag(flag: str, text: str, kind: type) -> Any:
        try:
            value = json.loads(text)
        except ValueError as err:
            raise ValueError(f"{flag}: not JSON ({err}): {text!r}") from None
        if not isinstance(value, kind):
            raise ValueError(f"{flag}: expected a JSON {kind.__name__}, got {text!r}")
        return value

    tolerations = json_flag("--mps-daemon-tolerations", args.mps_daemon_tolerations or "[]", list)
    resources = (
        json_flag("--mps-daemon-resources", args.mps_daemon_resources, dict)
        if args.mps_daemon_resources
        else DEFAULT_RESOURCES
    )
    return DaemonPodSettings(
        image=args.mps_daemon_image or "",
        image_pull_policy=args.mps_daemon_image_pull_policy or "",
        image_pull_secrets=tuple(
            n.strip() for n in (args.mps_daemon_image_pull_secrets or "").split(",") if n.strip()
        ),
        service_account=args.mps_daemon_service_account or "",
        priority_class=args.mps_daemon_priority_class,
        tolerations=(*NODE_LIFECYCLE_TOLERATIONS, *tolerations),
        resources=resources,
        # the simulator's tools keep their state in its driver root; real hardware's is only read
        driver_root_read_only=args.hardware == "real",
    )


def _make_sharing_manager(
    args: argparse.Namespace,
    api_client: Any,
    hardware: Any,
    plugin_dir: Path,
    faults: Callable[[str], None],
    locks: GpuLocks,
) -> Any:
    from dra_gpu.sharing.manager import HardwareSharingManager
    from dra_gpu.sharing.mps_pods import PodLauncher

    leave = bool(args.mps_leave_compute_mode)
    if leave:
        log.warning(
            "--mps-leave-compute-mode: GPUs served by MPS stay in their compute mode; a process that "
            "ignores its pipe directory can use the whole GPU"
        )
    if args.mps_daemon_mode != "pod":
        return HardwareSharingManager(
            hardware, plugin_dir, faults=faults, locks=locks, leave_compute_mode=leave
        )
    pods = PodLauncher(
        api_client,
        namespace=args.namespace,
        node_name=args.node_name,
        settings=daemon_pod_settings(args),
        host_driver_root=args.nvidia_driver_root,
        container_driver_root=hardware.driver_root(),
        plugin_pod=args.pod_name,
    )
    # a pod takes longer to be ready than a process: scheduling is skipped, but the container still starts
    return HardwareSharingManager(
        hardware,
        plugin_dir,
        faults=faults,
        mps_pods=pods,
        mps_ready_timeout_s=60.0,
        locks=locks,
        leave_compute_mode=leave,
    )


def _start_slice_publishing(
    args: argparse.Namespace, api_client: Any, model: Callable[[], DeviceModel]
) -> tuple[Callable[[], None], Callable[[DeviceModel], None]] | None:
    """Start the ResourceSlice controller; returns its stop function and its `update_model`."""
    if args.publish_slices != "true":
        return None
    from dra_gpu.cli.feature_gates import parse_feature_gates
    from dra_gpu.slices.slice_controller import SliceController

    gates = parse_feature_gates(args.feature_gates)
    controller = SliceController(
        api_client, DRIVER_NAME, args.node_name, model, list_type_attributes=gates["DRAListTypeAttributes"]
    )
    controller.start()
    return controller.stop, controller.update_model


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_format, args.log_verbosity)
    if not args.node_name:
        print("dra-gpu kubelet-plugin: --node-name (or NODE_NAME) is required", file=sys.stderr)
        return 2
    from dra_gpu.cli import feature_gates as fg
    from dra_gpu.inventory.consumable_shares import parse_consumable_shares
    from dra_gpu.kube.rate_limit import TokenBucket

    try:
        gates = fg.parse_feature_gates(args.feature_gates)
        fg.check_consumable_shares(gates, args.consumable_shares)
        shares = parse_consumable_shares(args.consumable_shares)
        api_limiter = TokenBucket(args.kube_api_qps, args.kube_api_burst)
    except ValueError as error:
        print(f"dra-gpu kubelet-plugin: {error}", file=sys.stderr)
        return 2
    for note in fg.no_effect_notes(args.feature_gates):
        log.warning(note)
    if not gates[fg.NVML_DEVICE_HEALTH_CHECK]:
        args.device_health_check = "false"  # NVIDIA's gate off: no health monitor, as the flag would say
    os.umask(0o022)  # CDI specs must stay readable by the runtime; our own files set 0600 explicitly
    from dra_gpu.kube.lazy_package import lazy_kubernetes

    lazy_kubernetes()  # before anything imports kubernetes: its kubeconfig auth providers stay unloaded

    from dra_gpu.cdi.cdi_hook_install import install_cdi_hook
    from dra_gpu.cdi.driver_discovery import discover_driver_edits
    from dra_gpu.cdi.spec_writer import CdiSpecWriter
    from dra_gpu.checkpoint.checkpoint_store import CheckpointError, CheckpointStore
    from dra_gpu.hardware import driver_layout
    from dra_gpu.hardware.interface import HardwareError
    from dra_gpu.hardware.loader import open_hardware
    from dra_gpu.inventory.device_model import ModelOptions
    from dra_gpu.kube.client import LazyApiClient
    from dra_gpu.plugin.claim_reader import KubeClaimReader
    from dra_gpu.plugin.device_inventory import DeviceInventory, DiscoveryFailedError, Rediscovery
    from dra_gpu.plugin.fault_injection import FaultPoints
    from dra_gpu.plugin.grpc_health import HealthServer, PluginHealth, check_sockets
    from dra_gpu.plugin.health import DeviceHealthService
    from dra_gpu.plugin.health_monitor import start_device_health
    from dra_gpu.plugin.http_endpoint import HttpEndpoint
    from dra_gpu.plugin.metrics import PluginMetrics
    from dra_gpu.plugin.mps_reconciler import MpsReconciler
    from dra_gpu.plugin.prepare_service import PrepareService
    from dra_gpu.plugin.server import PluginServer, SocketPaths, SocketSetupError

    try:
        paths = SocketPaths.for_driver(
            args.kubelet_registrar_directory_path,
            args.kubelet_plugins_directory_path,
            DRIVER_NAME,
            args.plugin_uid,
        )
        if args.rediscovery_interval <= 0:
            raise ValueError(f"--rediscovery-interval must be > 0 seconds, got {args.rediscovery_interval:g}")
        if args.mps_daemon_mode == "pod" and not args.mps_daemon_image:
            raise ValueError("--mps-daemon-mode=pod needs --mps-daemon-image (env MPS_DAEMON_IMAGE)")
        if args.mps_daemon_mode == "pod":
            daemon_pod_settings(args)  # malformed settings stop the start, not the first MPS claim
        if args.mps_reconcile_seconds <= 0:
            raise ValueError(
                f"--mps-reconcile-seconds must be > 0 seconds, got {args.mps_reconcile_seconds:g}"
            )
        host_driver_root = args.nvidia_driver_root
        # Everything this process reads or runs comes from the container's view of the driver root.
        hardware = open_hardware(args.hardware, args.container_driver_root or host_driver_root)
        inventory = DeviceInventory(
            hardware, ModelOptions(consumable_shares=shares, dynamic_mig=gates[fg.DYNAMIC_MIG])
        )
        # device taints from NVML health events (the view is the inventory's model plus those taints)
        health_view = start_device_health(args, hardware, inventory.model, paths.plugin_dir)
    except (HardwareError, SocketSetupError, ValueError) as exc:
        log.error("cannot start", error=str(exc))
        return 1
    container_driver_root = hardware.driver_root()
    log.info(
        "devices discovered",
        devices=len(inventory.model().devices),
        driver_root=host_driver_root,
        container_driver_root=container_driver_root,
    )

    metrics = PluginMetrics()
    # loaded by the warm-up thread once the sockets serve (or by whatever needs it first)
    api_client = LazyApiClient(args.kubeconfig or None, api_limiter)
    paths.plugin_dir.mkdir(parents=True, exist_ok=True, mode=0o750)
    try:
        hook_path = install_cdi_hook(args.nvidia_cdi_hook_path, paths.plugin_dir)
    except (OSError, ValueError) as exc:
        log.error("cannot start: nvidia-cdi-hook", error=str(exc))
        return 1
    faults = FaultPoints.from_env()
    locks = GpuLocks(paths.plugin_dir)  # one set for prepares and the sharing manager's own work
    sharing = _make_sharing_manager(args, api_client, hardware, paths.plugin_dir, faults.reached, locks)
    sharing.refresh(*inventory.last_discovery)  # the GPU facts just read: the start-up cleanup needs them
    service = PrepareService(
        node_name=args.node_name,
        claims=KubeClaimReader(api_client),
        checkpoints=CheckpointStore(paths.plugin_dir),
        cdi=CdiSpecWriter(args.cdi_root),
        sharing=fg.FeatureGatedSharing(sharing, gates),  # TimeSlicingSettings / MPSSupport
        device_model=inventory.model,
        driver_edits=discover_driver_edits(
            container_driver_root, host_driver_root=host_driver_root, hook_path=hook_path
        ),
        # device nodes: under the driver root when it has dev/, else the node's /dev (driver_layout.dev_root)
        driver_root=driver_layout.host_dev_root(container_driver_root, host_driver_root),
        container_driver_root=container_driver_root,
        metrics=metrics,
        faults=faults,
        locks=locks,
    )
    try:
        service.start()
    except CheckpointError as exc:
        log.error("cannot start: checkpoint unusable", error=str(exc))
        return 1
    # Start-up order: checkpoint loaded and our leftover MIG devices destroyed (service.start above), then
    # the model rebuilt knowing which MIG devices our claims own, and only then published.
    inventory.connect(owned_mig=service.owned_mig_placements, on_discovery=sharing.refresh)
    try:
        inventory.refresh()
    except (DiscoveryFailedError, HardwareError) as exc:
        log.error("cannot start: discovery after start-up cleanup failed", error=str(exc))
        return 1

    # Every prepared claim's MPS daemon is checked continuously; what cannot be fixed taints its GPU.
    reconciler = MpsReconciler(
        sharing, service.prepared_group_states, metrics.registry, period_s=args.mps_reconcile_seconds
    )

    def published_model() -> DeviceModel:
        return reconciler.with_taints(health_view.model())

    health = None
    if args.health_service == "true":
        health = DeviceHealthService(args.node_name, published_model)
    server = PluginServer(paths, DRIVER_NAME, service, metrics, health=health)
    # The slice controller's (stop, update_model), once it runs: it starts right after the sockets, as the
    # Go kubeletplugin helper does, so the kubelet can register us while its API client still loads. It reads
    # the current model when it first syncs, so a change before then is not lost.
    publishing: list[tuple[Callable[[], None], Callable[[DeviceModel], None]]] = []

    def republish(model: DeviceModel) -> None:
        for _stop, update_model in publishing:
            update_model(reconciler.with_taints(health_view.with_health(model)))

    def on_health_change() -> None:
        republish(inventory.model())
        if health is not None:
            health.notify()

    if health_view.monitor is not None:
        health_view.monitor.on_change = on_health_change
    reconciler.on_change = on_health_change
    reconciler.start()

    # Prepare and the health stream read `inventory.model` on each call: they follow a refresh by themselves.
    rediscovery = Rediscovery(inventory, republish, args.rediscovery_interval)
    rediscovery.start()

    def on_hangup(_signum: int, _frame: FrameType | None) -> None:
        rediscovery.trigger()

    stopping = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal received, stopping", signal=signal.Signals(signum).name)
        stopping.set()

    # Before the sockets appear: the default actions of SIGHUP and SIGTERM would end the process without
    # removing the sockets, so a stop that races start-up would leave stale sockets behind.
    signal.signal(signal.SIGHUP, on_hangup)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    try:
        started_publishing = _start_slice_publishing(args, api_client, published_model)
    except Exception:
        server.stop()  # no sockets left behind that answer for a plugin that is gone
        raise
    if started_publishing is not None:
        publishing.append(started_publishing)
    # What the first prepare needs and the sockets did not (the API client): loaded now, off the start-up
    # path; a prepare that comes first loads it itself. A kubeconfig that cannot be loaded stops the plugin.
    exit_code = 0

    def warm_up() -> None:
        nonlocal exit_code
        try:
            service.warm_up()
        except Exception as exc:
            source = args.kubeconfig or os.environ.get("KUBECONFIG") or "in-cluster service account"
            log.error("cannot start: Kubernetes API client", kubeconfig=source, error=str(exc))
            exit_code = 1
            stopping.set()
            return
        # What start-up made lives as long as the process (modules, the API client, the device model): kept
        # out of the cyclic collector's way, whose full collections otherwise scan it all (30-40 ms each on a
        # DGX H100 node, paid by whichever prepare runs then: bench_side_by_side's p99).
        gc.collect()
        gc.freeze()

    threading.Thread(target=warm_up, name="warm-up", daemon=True).start()

    # One health table for the gRPC health port and /healthz, /readyz: filled by its own thread, so no probe
    # ever waits behind prepare work (a burst of prepares or a slow MIG creation must not restart us).
    plugin_health = PluginHealth(lambda: check_sockets(paths, DRIVER_NAME), lambda: service.started)
    plugin_health.start()

    def healthy() -> str | None:
        return plugin_health.problem()

    def ready() -> str | None:
        return plugin_health.problem(readiness=True)

    endpoints: list[HttpEndpoint] = []
    if args.http_endpoint:
        endpoints.append(
            HttpEndpoint(
                args.http_endpoint,
                registry=metrics.registry,
                metrics_path=args.metrics_path,
                healthy=healthy,
                ready=ready,
            )
        )
    health_server: HealthServer | None = None
    if args.healthcheck_port >= 0:
        health_server = HealthServer(plugin_health, args.healthcheck_port)
        health_server.start()
        log.info("grpc health endpoint", port=health_server.port)
    for endpoint in endpoints:
        endpoint.start()
        log.info("http endpoint", port=endpoint.port)

    def stale_claims_loop() -> None:
        while not stopping.is_set():
            try:
                service.cleanup_stale_claims()
            except Exception:
                log.exception("stale-claim check failed")
            stopping.wait(args.stale_claim_check_interval)

    threading.Thread(target=stale_claims_loop, name="stale-claims", daemon=True).start()

    log.info("kubelet plugin ready", node=args.node_name, endpoint=str(paths.endpoint))
    stopping.wait()

    plugin_health.stop()  # NOT_SERVING from here on: a probe during shutdown must not see a healthy plugin
    # The sockets go first: a reconcile pass that is slow to stop (an MPS daemon waited for) could outlast the
    # pod's grace period, and a SIGKILL then would leave a registration socket the kubelet retries for good.
    server.stop()
    rediscovery.stop()
    reconciler.stop()
    health_view.stop()
    for endpoint in endpoints:
        endpoint.stop()
    if health_server is not None:
        health_server.stop()
    for stop_publishing, _update in publishing:
        stop_publishing()
    log.info("kubelet plugin stopped")
    return exit_code


def main(argv: list[str] | None = None) -> int:
    """`python -m dra_gpu.cli.kubelet_plugin ...`: the sub-command alone (what the container image runs)."""
    parser = argparse.ArgumentParser(prog="dra-gpu")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["kubelet-plugin", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
