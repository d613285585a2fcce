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
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import structlog

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
        image: str,
        host_driver_root: str,
        container_driver_root: str,
        delete_timeout_s: float = 30.0,
    ) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.node_name = node_name
        self.image = image
        self.host_driver_root = host_driver_root
        self.container_driver_root = container_driver_root
        self.delete_timeout_s = delete_timeout_s

    # ---- the pod ----

    def manifest(self, record: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
        binary = os.path.join(self.container_driver_root, "usr", "bin", "nvidia-cuda-mps-control")
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
        volumes = [
            ("driver-root", self.host_driver_root, self.container_driver_root, None),
            ("pipe", *pipe, None),
            ("log", *logs, None),
            # the MPS server and its clients share memory through /dev/shm: the claim's own tmpfs
            ("shm", record["shmDir"], "/dev/shm", "HostToContainer"),
        ]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name(record["id"]),
                "namespace": self.namespace,
                "labels": {LABEL_APP: APP_NAME, LABEL_DAEMON: record["id"][:63], LABEL_NODE: self.node_name},
            },
            "spec": {
                "nodeName": self.node_name,
                "restartPolicy": "Always",
                "tolerations": [{"operator": "Exists"}],
                "terminationGracePeriodSeconds": 10,
                "containers": [
                    {
                        "name": CONTAINER_NAME,
                        "image": self.image,
                        "command": command,
                        "env": [{"name": k, "value": env[k]} for k in keep if k in env],
                        "securityContext": {"privileged": True, "runAsUser": 0},
                        "lifecycle": {
                            "preStop": {"exec": {"command": ["sh", "-c", 'echo quit | "$0"', binary]}}
                        },
                        "volumeMounts": [
                            {"name": name, "mountPath": path, **({"mountPropagation": p} if p else {})}
                            for name, _host, path, p in volumes
                        ],
                    }
                ],
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
