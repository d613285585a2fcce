"""MPS control daemons as their own pods (the `pod` launcher; the chart's mode).

A daemon started inside the plugin's container dies with that container (the runtime kills every process of
its cgroup), taking every MPS client on the node down with it. As NVIDIA's driver does, each daemon here runs
in a pod of its own on the node, created by the plugin through the API server, so a restart, upgrade, OOM kill
or crash of the plugin pod leaves the daemons alone.

The pod is a bare Pod with `restartPolicy: Always` and `spec.nodeName` set, not a Deployment: it is bound to
this node directly (no scheduler, so it starts even while the node's devices are tainted), the kubelet
restarts a daemon that exits in place (same pod UID), and the plugin's reconcile loop creates a new pod when
the pod object itself is gone. A Deployment would add a ReplicaSet and a new pod UID on every recreation
without adding anything the reconcile loop does not already do. It has no owner reference to the plugin pod:
a rolling update of the plugin must not garbage-collect it.

The daemon is known by its pod UID: deletion uses a UID precondition, so a pod of the same name created
since (another attempt, another plugin) is never deleted by mistake. The container runs the driver root's
`nvidia-cuda-mps-control -f` with the daemon's `stage` and log directories mounted at /tmp/nvidia-mps and
/var/log/nvidia-mps (the real tool refuses long pipe paths; the plugin puts `stage` where the workloads' CDI
mounts look once the daemon holds its limits) and the claim's shm tmpfs at /dev/shm; a preStop hook sends
`quit` so the daemon stops its servers cleanly when the pod is deleted.

What the pod may do is kept to what the daemon needs (`DaemonPodSettings`; the chart's admission policy
templates/mps-daemon-pod-policy.yaml refuses any other shape from the plugin): the driver root read-only on
real hardware, a service account of its own with no token mounted (the daemon never talks to the API server),
resource requests and `system-node-critical` (a BestEffort daemon would be the first pod evicted under memory
pressure, taking every client of the daemon with it), and only the tolerations it needs (see
NODE_LIFECYCLE_TOLERATIONS). Its owner is the plugin's DaemonSet, not the plugin pod: a rolling update of
the plugin replaces pods, never the DaemonSet object, so the daemons outlive it, while deleting the DaemonSet
(`helm uninstall`) lets the garbage collector delete them too. The reference is not a controller reference:
the DaemonSet controller releases pods it controls that its selector does not match.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from dra_gpu.hardware import driver_layout
from dra_gpu.sharing.interface import SharingError
from dra_gpu.sharing.mps_namespace import DAEMON_LOG_DIR, DAEMON_PIPE_DIR

log = structlog.get_logger(__name__)

LABEL_APP = "app.kubernetes.io/name"
APP_NAME = "dra-gpu-mps-daemon"
LABEL_DAEMON = "gpu.nvidia.com/mps-daemon"
LABEL_NODE = "gpu.nvidia.com/node"
CONTAINER_NAME = "mps-control-daemon"
PODS = "/api/v1/namespaces/{namespace}/pods"
POD = "/api/v1/namespaces/{namespace}/pods/{name}"


LIMITS_ENV = "DRA_GPU_MPS_LIMITS"  # the daemon's limit commands, one per line, for the container's entrypoint

# The container's entrypoint (`sh -c ENTRYPOINT <control binary> [-M]`): the daemon in the foreground as a
# child, then, once it answers, its limits by command, at every start of the container. The kubelet restarts a
# daemon that exits in place and tells no one; a real control daemon takes its thread percentage from its
# environment but not its pinned memory limit, so without this a restarted daemon would serve without one
# until the plugin's next reconcile pass. A daemon whose limits cannot be set is stopped (the container fails
# and is restarted; the plugin reports it if that persists): it must not serve without them. SIGTERM sends
# `quit`.
ENTRYPOINT = """\
ctl="$0"
"$ctl" -f "$@" &
daemon=$!
trap 'echo quit | "$ctl" >/dev/null 2>&1; wait "$daemon"; exit 0' TERM INT
until echo get_server_list | "$ctl" >/dev/null 2>&1; do
  kill -0 "$daemon" 2>/dev/null || { wait "$daemon"; exit 1; }
  sleep 0.05
done
tries=0
while [ -n "$DRA_GPU_MPS_LIMITS" ] && ! printf '%s\\n' "$DRA_GPU_MPS_LIMITS" | "$ctl" >/dev/null; do
  tries=$((tries + 1))
  if [ "$tries" -ge 100 ] || ! kill -0 "$daemon" 2>/dev/null; then
    echo "dra-gpu: cannot set the MPS daemon's limits; stopping it" >&2
    echo quit | "$ctl" >/dev/null 2>&1
    wait "$daemon"
    exit 1
  fi
  sleep 0.05  # the daemon serves one control session at a time: the plugin may be talking to it
done
wait "$daemon"
"""


# A daemon pod is bound to its node (spec.nodeName): the scheduler never sees it, and the kubelet admits it
# whatever NoSchedule taints the node has, so only NoExecute taints matter. The node lifecycle ones are those
# a DaemonSet's pods tolerate for ever: without them the taint eviction controller deletes the daemon five
# minutes into a NotReady or unreachable spell of its node (the default tolerationSeconds), while the clients
# it serves keep running there. The driver's own health taints (ECC errors, XIDs) are device taints in the
# ResourceSlices: they apply to pods whose claims use the device, and a daemon pod has no claim, so it keeps
# running beside a tainted GPU as it must. Other NoExecute taints of GPU nodes are the ones the plugin itself
# tolerates, which the chart passes on (--mps-daemon-tolerations).
NODE_LIFECYCLE_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
)
# Requests only: a memory limit would let the kernel kill the daemon (and so every client's server) for a
# burst of MPS server memory; the requests keep the pod out of BestEffort.
DEFAULT_RESOURCES: dict[str, Any] = {"requests": {"cpu": "10m", "memory": "64Mi"}}
PULL_POLICIES = ("Always", "IfNotPresent", "Never")


@dataclass(frozen=True)
class DaemonPodSettings:
    """How the daemon pods are made, beyond what each daemon's record says (the chart's values)."""

    image: str
    image_pull_policy: str = ""  # empty: the API server's default for the image's tag
    image_pull_secrets: tuple[str, ...] = ()
    service_account: str = ""  # empty: the namespace's default account (still with no token mounted)
    priority_class: str = "system-node-critical"
    tolerations: tuple[Mapping[str, Any], ...] = NODE_LIFECYCLE_TOLERATIONS
    resources: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_RESOURCES))
    driver_root_read_only: bool = True  # False only for the simulator, whose tools keep state there

    def __post_init__(self) -> None:
        if not self.image:
            raise ValueError("--mps-daemon-image: an image is required for MPS daemon pods")
        if self.image_pull_policy and self.image_pull_policy not in PULL_POLICIES:
            raise ValueError(
                f"--mps-daemon-image-pull-policy: {self.image_pull_policy!r} is not one of "
                f"{', '.join(PULL_POLICIES)} (or empty for the cluster's default)"
            )
        for i, toleration in enumerate(self.tolerations):
            if not isinstance(toleration, Mapping) or not set(toleration) <= {
                "key", "operator", "value", "effect", "tolerationSeconds",
            }:  # fmt: skip
                raise ValueError(
                    f"--mps-daemon-tolerations[{i}]: {toleration!r} is not a toleration "
                    "(key, operator, value, effect, tolerationSeconds)"
                )
        if not isinstance(self.resources, Mapping) or not set(self.resources) <= {"requests", "limits"}:
            raise ValueError(
                f"--mps-daemon-resources: {self.resources!r} is not a ResourceRequirements object "
                '(e.g. {"requests": {"cpu": "10m", "memory": "64Mi"}})'
            )


@dataclass(frozen=True)
class PodObservation:
    restarts: int | None  # the daemon container's restartCount; None before the pod has a status


def pod_limit_env(commands: list[str]) -> dict[str, str]:
    """The environment that carries a daemon's limit commands to its pod's entrypoint."""
    return {LIMITS_ENV: "\n".join(commands)} if commands else {}


def pod_name(daemon_id: str) -> str:
    """`dra-gpu-mps-<daemon id>` (a claim UID plus a 5-hex digest: 54 characters, a valid DNS label)."""
    return f"dra-gpu-mps-{daemon_id}"[:63].rstrip("-")


class PodLauncher:
    """Creates, finds and deletes the daemon pods of one node (in the plugin's namespace)."""

    def __init__(
        self,
        api_client: Any,
        *,
        namespace: str,
        node_name: str,
        settings: DaemonPodSettings,
        host_driver_root: str,
        container_driver_root: str,
        plugin_pod: str | None = None,
        delete_timeout_s: float = 30.0,
    ) -> None:
        """`plugin_pod`: the name of the plugin's own pod, whose DaemonSet becomes the daemon pods' owner;
        None (a plugin not run by a DaemonSet) leaves them without one."""
        self.api_client = api_client
        self.namespace = namespace
        self.node_name = node_name
        self.settings = settings
        self.image = settings.image
        self.host_driver_root = host_driver_root
        self.container_driver_root = container_driver_root
        self.plugin_pod = plugin_pod
        self.delete_timeout_s = delete_timeout_s
        self._owner: dict[str, Any] | None = None
        self._owner_known = plugin_pod is None

    def owner_reference(self) -> dict[str, Any] | None:
        """The plugin pod's DaemonSet as an owner reference (read once from the plugin's pod), or None when
        the plugin pod has no DaemonSet. The UID must be the real one: the garbage collector deletes a
        dependent whose owner UID does not exist."""
        if not self._owner_known:
            assert self.plugin_pod is not None
            pod = self.get(self.plugin_pod)
            if pod is None:
                raise SharingError(
                    f"the plugin's own pod {self.namespace}/{self.plugin_pod} (--pod-name, env POD_NAME) "
                    "does not exist: cannot make its DaemonSet the owner of MPS daemon pods"
                )
            owners = pod["metadata"].get("ownerReferences") or []
            daemonset = next(
                (o for o in owners if o.get("kind") == "DaemonSet" and o.get("controller")), None
            )
            if daemonset is None:
                log.warning(
                    "the plugin pod has no DaemonSet: MPS daemon pods get no owner", pod=self.plugin_pod
                )
            else:
                self._owner = {
                    "apiVersion": daemonset["apiVersion"],
                    "kind": "DaemonSet",
                    "name": daemonset["name"],
                    "uid": daemonset["uid"],
                }
            self._owner_known = True
        return self._owner

    # ---- the pod ----

    def manifest(self, record: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
        # Found as the plugin finds it (NVIDIA's search order: usr/bin, or bin/ on GKE/COS); the daemon pod
        # mounts the driver root at the same path as the plugin's container.
        binary = driver_layout.binary_path(self.container_driver_root, "nvidia-cuda-mps-control")
        command = ["sh", "-c", ENTRYPOINT, binary, *(["-M"] if record.get("multiUser") else [])]
        keep = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", LIMITS_ENV,
                "LD_LIBRARY_PATH", "PATH", "DRA_GPU_SIM_ROOT")  # fmt: skip
        if record.get("stageDir"):
            # The daemon starts in `stage/`, which no container mounts, seen at the short path the real tool
            # needs (mps_namespace.py); the plugin puts it where clients look once it holds its limits. A
            # container the kubelet restarts binds `stage/` anew: a fresh directory, placed the same way.
            pipe, logs = (record["stageDir"], DAEMON_PIPE_DIR), (record["logDir"], DAEMON_LOG_DIR)
        else:  # a record from before staging: the pipe directory at its host path
            pipe, logs = (record["pipeDir"], record["pipeDir"]), (record["logDir"], record["logDir"])
        settings = self.settings
        volumes = [
            ("driver-root", self.host_driver_root, self.container_driver_root, None),
            ("pipe", *pipe, None),
            ("log", *logs, None),
            # the MPS server and its clients share memory through /dev/shm: the claim's own tmpfs
            ("shm", record["shmDir"], "/dev/shm", "HostToContainer"),
        ]
        read_only = {"driver-root"} if settings.driver_root_read_only else set()
        metadata: dict[str, Any] = {
            "name": pod_name(record["id"]),
            "namespace": self.namespace,
            "labels": {LABEL_APP: APP_NAME, LABEL_DAEMON: record["id"][:63], LABEL_NODE: self.node_name},
        }
        if self._owner is not None:
            metadata["ownerReferences"] = [dict(self._owner)]
        container: dict[str, Any] = {
            "name": CONTAINER_NAME,
            "image": settings.image,
            "command": command,
            "env": [{"name": k, "value": env[k]} for k in keep if k in env],
            # privileged: the daemon and the MPS servers it starts open the claim's GPU device nodes, which
            # the container's device cgroup would hide otherwise (as NVIDIA's daemon pods, run as root)
            "securityContext": {"privileged": True, "runAsUser": 0},
            "resources": dict(settings.resources),
            "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", 'echo quit | "$0"', binary]}}},
            "volumeMounts": [
                {
                    "name": name,
                    "mountPath": path,
                    **({"mountPropagation": p} if p else {}),
                    **({"readOnly": True} if name in read_only else {}),
                }
                for name, _host, path, p in volumes
            ],
        }
        if settings.image_pull_policy:
            container["imagePullPolicy"] = settings.image_pull_policy
        spec: dict[str, Any] = {
            "nodeName": self.node_name,
            "restartPolicy": "Always",
            "priorityClassName": settings.priority_class,
            "automountServiceAccountToken": False,  # the daemon never talks to the API server
            "tolerations": [dict(t) for t in settings.tolerations],
            "terminationGracePeriodSeconds": 10,
            "containers": [container],
        }
        if settings.service_account:
            spec["serviceAccountName"] = settings.service_account
        if settings.image_pull_secrets:
            spec["imagePullSecrets"] = [{"name": n} for n in settings.image_pull_secrets]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": {
                **spec,
                "volumes": [
                    {"name": name, "hostPath": {"path": host, "type": "Directory"}}
                    for name, host, _path, _p in volumes
                ],
            },
        }

    def launch(self, record: dict[str, Any], env: Mapping[str, str]) -> None:
        """Create the daemon's pod (or adopt the one with the recorded UID, which the kubelet restarts in
        place); sets record["podName"] and record["podUid"]. A stale pod of the same name is deleted first."""
        from kubernetes.client.exceptions import ApiException

        name = pod_name(record["id"])
        self.owner_reference()
        body = self.manifest(record, env)
        for _attempt in range(3):
            try:
                created = self._call("POST", PODS, body=body)
                record["podName"], record["podUid"] = name, created["metadata"]["uid"]
                log.info("MPS daemon pod created", pod=name, uid=record["podUid"])
                return
            except ApiException as err:
                if err.status != 409:
                    raise SharingError(f"creating MPS daemon pod {name}: {_reason(err)}") from None
            existing = self.get(name)
            if existing is None:
                continue
            uid = existing["metadata"]["uid"]
            if uid == record.get("podUid") and not existing["metadata"].get("deletionTimestamp"):
                return  # our pod: the kubelet restarts its container; the caller waits for the pipe
            problem = self._delete(name, uid)
            if problem:
                raise SharingError(f"a stale MPS daemon pod {name} is in the way: {problem}")
        raise SharingError(f"creating MPS daemon pod {name}: it keeps being recreated by someone else")

    def alive(self, record: Mapping[str, Any]) -> bool:
        """The pod with the recorded UID exists and is not being deleted."""
        return self.observe(record) is not None

    def observe(self, record: Mapping[str, Any]) -> PodObservation | None:
        """One read of the pod with the recorded UID: None when it is gone or being deleted, else how often
        the kubelet restarted its daemon container (None while the pod has no status yet)."""
        pod = self.get(record.get("podName") or pod_name(record["id"]))
        if pod is None or pod["metadata"]["uid"] != record.get("podUid"):
            return None
        if pod["metadata"].get("deletionTimestamp"):
            return None
        for status in pod.get("status", {}).get("containerStatuses") or []:
            if status.get("name") == CONTAINER_NAME:
                return PodObservation(restarts=int(status.get("restartCount", 0)))
        return PodObservation(restarts=None)

    def stop(self, record: Mapping[str, Any]) -> list[str]:
        """Delete the pod with the recorded UID and wait until it is gone; problems (empty when done)."""
        if not record.get("podUid"):
            return []
        problem = self._delete(record.get("podName") or pod_name(record["id"]), record["podUid"])
        return [problem] if problem else []

    def owned_pods(self) -> list[dict[str, Any]]:
        """Every daemon pod of this node (to stop the ones no prepared claim owns)."""
        selector = f"{LABEL_APP}={APP_NAME},{LABEL_NODE}={self.node_name}"
        found = self._call("GET", PODS, query=[("labelSelector", selector)])
        items: list[dict[str, Any]] = found.get("items", [])
        return items

    def delete_pod(self, pod: Mapping[str, Any]) -> list[str]:
        problem = self._delete(pod["metadata"]["name"], pod["metadata"]["uid"])
        return [problem] if problem else []

    # ---- API helpers ----

    def get(self, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            pod: dict[str, Any] = self._call("GET", POD, name=name)
        except ApiException as err:
            if err.status == 404:
                return None
            raise SharingError(f"reading MPS daemon pod {name}: {_reason(err)}") from None
        return pod

    def _delete(self, name: str, uid: str) -> str | None:
        """Delete pod `name` only if its UID is `uid`, then wait until no pod with that UID is left."""
        from kubernetes.client.exceptions import ApiException

        try:
            self._call("DELETE", POD, name=name, body={"preconditions": {"uid": uid}})
        except ApiException as err:
            if err.status == 404:
                return None
            if err.status != 409:  # 409: the UID precondition failed: another pod has the name now
                return f"deleting MPS daemon pod {name}: {_reason(err)}"
        deadline = time.monotonic() + self.delete_timeout_s
        while True:
            pod = self.get(name)
            if pod is None or pod["metadata"]["uid"] != uid:
                return None
            if time.monotonic() > deadline:
                return (
                    f"MPS daemon pod {name} (uid {uid}) is still terminating after {self.delete_timeout_s:g}s"
                )
            time.sleep(0.2)

    def _call(
        self,
        method: str,
        path: str,
        *,
        name: str = "",
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
    ) -> Any:
        from dra_gpu.kube.client import request_json

        params = {"namespace": self.namespace, **({"name": name} if name else {})}
        return request_json(self.api_client, method, path, params, query=query, body=body, timeout_s=30)


def _reason(err: Any) -> str:
    try:
        message = json.loads(err.body).get("message")
    except (TypeError, ValueError, AttributeError):
        message = None
    return str(message or f"HTTP {err.status} {err.reason}")
