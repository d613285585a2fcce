"""A single-node Kubernetes cluster from real binaries, for the end-to-end suite.

    python3 e2e/cluster/cluster.py up|down|status|images|cgroup-root

Pieces: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, containerd 2.x (CDI on) with
runc and the CNI bridge plugin; binaries from `e2e/cluster/build.sh all`, versions in `versions.env`.

Host layout (everything removable by `down`):
- node address 10.217.0.1/32 on `lo` (label `lo:drae2e`): the API server and kubelet bind to it; host
  processes and pods (through the bridge gateway) both reach it, and nothing listens on the outside interface.
- service IP 10.96.0.1:443 is DNATed to the API server in chain DRA-E2E-SVC (no kube-proxy: only the
  `kubernetes` service is needed; the API server reaches webhooks through endpoints).
- state in /var/lib/dra-gpu-e2e, runtime files in /run/dra-gpu-e2e, kubelet in the standard /var/lib/kubelet
  (so a DRA plugin registers at /var/lib/kubelet/plugins_registry).
- cgroups: every pod cgroup lives under `<our own cgroup>/dra-gpu-e2e` (cgroupfs driver, cgroup v1), never
  elsewhere; the path comes from /proc/self/cgroup.
- images (no registry): registry.local/pause:3.10 (pause.c, static) and registry.local/busybox:1 (Debian's
  busybox-static), imported with `ctr -n k8s.io images import`; use `imagePullPolicy: Never`.

Importable: `Cluster().up()`, `.down()`, `.kubeconfig`, `.node_name`, `.api_client()`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from e2e.cluster.oci_image import ImageSpec, build_archive  # noqa: E402
from tests.support.control_plane import (  # noqa: E402
    ARTIFACTS_DIR,
    ControlPlane,
    ControlPlaneError,
    ControlPlaneOptions,
    KeyPair,
    ManagedProcess,
    bin_dir,
    cache_dir,
    feature_gate_flag,
    find_binary,
    https_get,
    prune_artifacts,
    usable_feature_gates,
    wait_until,
    write_kubeconfig,
)

HERE = Path(__file__).resolve().parent

STATE_DIR = Path("/var/lib/dra-gpu-e2e")
LOCK_FILE = Path("/var/lib/dra-gpu-e2e.lock")
RUN_DIR = Path("/run/dra-gpu-e2e")
KUBELET_DIR = Path("/var/lib/kubelet")
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
NODE_IP = "10.217.0.1"
NODE_IP_LABEL = "lo:drae2e"
POD_CIDR = "10.218.0.0/24"
BRIDGE = "drae2e0"
APISERVER_PORT = 6443
ETCD_PORTS = (12379, 12380)
SVC_CHAIN = "DRA-E2E-SVC"
CGROUP_LEAF = "dra-gpu-e2e"
CGROUP_MOUNT = Path("/sys/fs/cgroup")
PAUSE_IMAGE = "registry.local/pause:3.10"
BUSYBOX_IMAGE = "registry.local/busybox:1"
CLUSTER_BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kubectl",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "runc",
    "cni/bridge",
    "cni/host-local",
    "cni/loopback",
    "cni/portmap",
)
# Kernel settings kubelet changes at start-up (pkg/kubelet/cm setupKernelTunables).
KUBELET_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
NODE_LABELS = {"nvidia.com/gpu.present": "true"}
NODE_FEATURE_GATES = (
    "DRAPartitionableDevices",
    "DRAConsumableCapacity",
    "DRADeviceTaints",
    "DRADeviceTaintRules",
    "DRAExtendedResource",
    "DRAAdminAccess",
    "DRAPrioritizedList",
    "DRAResourceClaimDeviceStatus",
    "DRADeviceBindingConditions",
    "ResourceHealthStatus",
    "ResourceHealthStatusMessage",
    "DRAListTypeAttributes",
)


class ClusterError(RuntimeError):
    """The cluster could not be started or stopped; the message names the piece and its log."""


def log(msg: str) -> None:
    print(f"[cluster] {msg}", file=sys.stderr, flush=True)


def run(argv: Sequence[str], *, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(argv), capture_output=True, text=True)
    if check and res.returncode != 0:
        raise ClusterError(
            f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip() or res.stdout.strip()}"
        )
    if not quiet and res.returncode != 0:
        log(f"(ignored) {' '.join(argv)}: {res.stderr.strip()}")
    return res


# ------------------------------------------------------------------------------------------------ cgroups


def own_cgroups(proc_cgroup: str) -> dict[str, str]:
    """Map each cgroup v1 controller (and `name=systemd`) to this process's path, from /proc/self/cgroup."""
    paths: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[1]:
            continue  # the cgroup v2 line (0::/path) has no controller list
        for controller in parts[1].split(","):
            paths[controller] = parts[2]
    return paths


def common_cgroup_root(paths: dict[str, str]) -> str:
    """The deepest path that lies inside this process's cgroup in every hierarchy.

    kubelet takes one `cgroupRoot` for all controllers; putting pods under the deepest of our paths keeps them
    inside our cgroup everywhere (e.g. memory:/process_api/X with cpu:/ gives /process_api/X).
    """
    if not paths:
        raise ClusterError(
            "no cgroup v1 controllers in /proc/self/cgroup; this cluster needs cgroup v1 (cgroupfs)"
        )
    deepest = max(paths.values(), key=lambda p: len(p.rstrip("/").split("/")))
    for controller, path in paths.items():
        base = path.rstrip("/")
        if not (deepest == path or deepest.startswith(base + "/") or base == ""):
            raise ClusterError(
                f"cgroup paths disagree: {controller} is at {path} but another controller is at {deepest}; "
                "cannot pick one kubelet cgroupRoot inside both"
            )
    return deepest.rstrip("/") or "/"


def cgroup_hierarchies() -> dict[str, Path]:
    """Mount point of each cgroup hierarchy, keyed by the v1 controllers it carries (`unified` for v2).

    The v2 hierarchy matters even on a v1 host: in hybrid mode kubelet and runc mirror their cgroups there.
    """
    found: dict[str, Path] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields = right.split()
        if not fields or fields[0] not in {"cgroup", "cgroup2"}:
            continue
        mount_point = Path(left.split()[4])
        if fields[0] == "cgroup2":
            found["unified"] = mount_point
            continue
        for opt in fields[2].split(","):
            if opt in {"rw", "ro"} or opt.startswith("relatime") or opt in {"nosuid", "nodev", "noexec"}:
                continue
            found[opt] = mount_point
    return found


# ------------------------------------------------------------------------------------------------ cluster


@dataclass
class ClusterTimes:
    started_at: float = 0.0
    control_plane_s: float = 0.0
    node_ready_s: float = 0.0


class Cluster:
    """The local single-node cluster. `up()` is idempotent; `down()` removes everything `up()` made."""

    def __init__(self, node_name: str = "dra-gpu-e2e-node") -> None:
        self.node_name = node_name
        self.kubeconfig = ARTIFACTS_DIR / "kubeconfig"
        self.state = STATE_DIR
        self.logs = STATE_DIR / "logs"
        self.pids_file = STATE_DIR / "pids.json"
        self.plane: ControlPlane | None = None
        self.processes: list[ManagedProcess] = []
        self._lock_depth = 0

    # --------------------------------------------------------------------------------------- helpers
    @property
    def bin(self) -> Path:
        return bin_dir()

    @property
    def containerd_sock(self) -> Path:
        return RUN_DIR / "containerd.sock"

    def ctr(self, *args: str, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess[str]:
        return run(
            [str(self.bin / "ctr"), "--address", str(self.containerd_sock), "-n", "k8s.io", *args],
            check=check,
            quiet=quiet,
        )

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> ManagedProcess:
        proc = ManagedProcess(name, argv, self.logs / f"{name}.log", detach=True, env=env)
        proc.start()
        self.processes.append(proc)
        self._write_pids()
        return proc

    def _write_pids(self) -> None:
        procs = list(self.plane.processes if self.plane else []) + self.processes
        entries = [{"name": p.name, "pid": p.pid, "exe": p.argv[0]} for p in procs if p.pid > 0]
        self.pids_file.write_text(json.dumps(entries, indent=2) + "\n")

    def running(self) -> bool:
        """True when every recorded process is still alive and the API server answers."""
        entries = self._recorded_processes()
        if not entries or not all(_alive(e["pid"], e["exe"]) for e in entries):
            return False
        with contextlib.suppress(Exception):
            return self._admin_get("/readyz")[0] == 200
        return False

    def _recorded_processes(self) -> list[dict[str, Any]]:
        try:
            entries: list[dict[str, Any]] = json.loads(self.pids_file.read_text())
            return entries
        except (OSError, ValueError):
            return []

    def api_client(self) -> Any:
        from kubernetes import config

        factory: Callable[..., Any] = config.new_client_from_config
        return factory(config_file=str(self.kubeconfig))

    @contextlib.contextmanager
    def _host_lock(self) -> Iterator[None]:
        """One up/down at a time on this host (several test sessions share the one cluster)."""
        if self._lock_depth:
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
            return
        LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
        with LOCK_FILE.open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            self._lock_depth = 1
            try:
                yield
            finally:
                self._lock_depth = 0
                fcntl.flock(handle, fcntl.LOCK_UN)

    # -------------------------------------------------------------------------------------------- up
    def up(self, timeout: float = 300.0) -> Cluster:
        with self._host_lock():
            return self._up(timeout)

    def _up(self, timeout: float) -> Cluster:
        if self.running():
            log(f"already running; export KUBECONFIG={self.kubeconfig}")
            return self
        if self._recorded_processes():
            log("found a partly running cluster; stopping it first")
            self.down()
        for name in CLUSTER_BINARIES:
            find_binary(name, build_target="all")
        t0 = time.monotonic()
        for d in (self.state, self.logs, RUN_DIR, KUBELET_DIR, *map(Path, CDI_DIRS)):
            d.mkdir(parents=True, exist_ok=True)
        for old in self.logs.glob("*.log"):
            old.unlink()
        try:
            self._host_network()
            self._save_kernel_tunables()
            cgroup_root = self._cgroup_root()
            log("starting etcd + kube-apiserver")
            self.plane = ControlPlane(
                workdir=self.state / "control-plane",
                options=ControlPlaneOptions(
                    feature_gates=(*NODE_FEATURE_GATES, "DynamicResourceAllocation"),
                    disable_admission_plugins=(),
                    extra_apiserver_args=("--enable-aggregator-routing=true",),
                    bind_address=NODE_IP,
                    apiserver_port=APISERVER_PORT,
                    etcd_ports=ETCD_PORTS,
                    detach=True,
                ),
            )
            self.plane.logs_dir = self.logs
            shutil.rmtree(self.state / "control-plane" / "etcd", ignore_errors=True)
            self.plane.start()
            self._write_pids()
            ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.plane.kubeconfig, self.kubeconfig)
            control_plane_s = time.monotonic() - t0
            log(f"control plane ready in {control_plane_s:.1f}s")
            self._start_controller_manager()
            self.plane.start_scheduler()
            self._write_pids()
            self._start_containerd()
            self._import_images()
            self._write_cni_config()
            self._start_kubelet(cgroup_root)
            self._wait_node_ready(timeout)
        except BaseException as err:
            saved = self._save_logs("cluster-up-failed")
            log(f"cluster failed to start: {err}; logs in {saved}; stopping everything")
            self.down()
            if isinstance(err, (ClusterError, ControlPlaneError)):
                raise ClusterError(f"{err}\n(logs copied to {saved})") from None
            raise
        total = time.monotonic() - t0
        _record_start_time(control_plane_s, total)
        log(f"cluster up in {total:.1f}s (control plane {control_plane_s:.1f}s); node {self.node_name} Ready")
        print(f"export KUBECONFIG={self.kubeconfig}")
        return self

    def _host_network(self) -> None:
        addrs = run(["ip", "-o", "addr", "show", "dev", "lo"]).stdout
        if f"{NODE_IP}/32" not in addrs:
            run(["ip", "addr", "add", f"{NODE_IP}/32", "dev", "lo", "label", NODE_IP_LABEL])
        for key in ("net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables"):
            path = Path("/proc/sys") / key
            if path.exists():
                path.write_text("1\n")
        # The one service pods need: kubernetes.default -> the API server (no kube-proxy in this cluster).
        if run(["iptables", "-t", "nat", "-L", SVC_CHAIN, "-n"], check=False, quiet=True).returncode != 0:
            run(["iptables", "-t", "nat", "-N", SVC_CHAIN])
            dnat = ["-d", "10.96.0.1/32", "-p", "tcp", "--dport", "443", "-j", "DNAT"]
            run(
                [
                    "iptables",
                    "-t",
                    "nat",
                    "-A",
                    SVC_CHAIN,
                    *dnat,
                    "--to-destination",
                    f"{NODE_IP}:{APISERVER_PORT}",
                ]
            )
            for hook in ("PREROUTING", "OUTPUT"):
                run(["iptables", "-t", "nat", "-I", hook, "-j", SVC_CHAIN])

    def _save_kernel_tunables(self) -> None:
        # kubelet (protectKernelDefaults: false) sets these for its own needs; down() puts the host's back.
        saved = self.state / "sysctl-saved.json"
        if saved.exists():
            return
        values = {key: (Path("/proc/sys") / key).read_text().strip() for key in KUBELET_SYSCTLS}
        saved.write_text(json.dumps(values) + "\n")

    def _restore_kernel_tunables(self) -> None:
        saved = self.state / "sysctl-saved.json"
        with contextlib.suppress(OSError, ValueError):
            for key, value in json.loads(saved.read_text()).items():
                (Path("/proc/sys") / key).write_text(f"{value}\n")
            saved.unlink()

    def _cgroup_root(self) -> str:
        root = common_cgroup_root(own_cgroups(Path("/proc/self/cgroup").read_text()))
        cgroup_root = f"{root.rstrip('/')}/{CGROUP_LEAF}"
        # kubelet insists that cgroupRoot exists in every hierarchy; create it (and cpuset's cpus/mems, which
        # a new cpuset cgroup starts without) under our own cgroup.
        made: list[str] = []
        for controller, mount in cgroup_hierarchies().items():
            target = mount / cgroup_root.lstrip("/")
            created = []
            probe = target
            while not probe.exists():
                created.append(probe)
                probe = probe.parent
            for path in reversed(created):
                path.mkdir()
                made.append(str(path))
                if controller == "cpuset":
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        (path / f).write_text((path.parent / f).read_text())
        (self.state / "cgroup-root").write_text(cgroup_root + "\n")
        # Intermediate dirs we had to create (e.g. /process_api/X in the cpu hierarchy), removed by down().
        record = self.state / "cgroup-created.json"
        with contextlib.suppress(OSError, ValueError):
            made = list(dict.fromkeys([*json.loads(record.read_text()), *made]))
        record.write_text(json.dumps(made) + "\n")
        return cgroup_root

    @property
    def cgroup_root(self) -> str:
        """kubelet's cgroupRoot for this cluster (recorded by up())."""
        return (self.state / "cgroup-root").read_text().strip()

    def _pki(self) -> Any:
        assert self.plane is not None
        return self.plane.pki

    def _start_controller_manager(self) -> None:
        assert self.plane is not None
        pki = self._pki()
        binary = find_binary("kube-controller-manager", "all")
        kubeconfig = str(self.plane.kubeconfig)
        sa = pki.service_account_keys()
        args = [
            str(binary),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            "--secure-port=10257",
            f"--cert-dir={self.state / 'kcm-certs'}",
            "--leader-elect=false",
            f"--service-account-private-key-file={sa.key}",
            f"--root-ca-file={pki.ca.cert}",
            f"--cluster-signing-cert-file={pki.ca.cert}",
            f"--cluster-signing-key-file={pki.ca.key}",
            "--use-service-account-credentials=false",
            "--controllers=*",
            f"--service-cluster-ip-range={'10.96.0.0/16'}",
            "--profiling=false",
        ]
        gates = feature_gate_flag((*NODE_FEATURE_GATES,), usable_feature_gates(binary))
        if gates:
            args.append(f"--feature-gates={gates}")
        log("starting kube-controller-manager")
        proc = self._spawn("kube-controller-manager", args)
        wait_until(
            lambda: https_get("https://127.0.0.1:10257/healthz", None, None)[0] == 200,
            what="kube-controller-manager /healthz",
            timeout=120,
            watch=[proc],
        )

    def _start_containerd(self) -> None:
        conf_dir = self.state / "containerd"
        conf_dir.mkdir(parents=True, exist_ok=True)
        config = conf_dir / "config.toml"
        config.write_text(containerd_config(self.bin, self.state, RUN_DIR, self.containerd_sock))
        env = dict(os.environ)
        env["PATH"] = f"{self.bin}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        log("starting containerd")
        proc = self._spawn("containerd", [str(self.bin / "containerd"), "--config", str(config)], env=env)
        wait_until(
            lambda: self.ctr("version", check=False, quiet=True).returncode == 0,
            what="containerd socket",
            timeout=60,
            watch=[proc],
        )

    def _import_images(self) -> None:
        for ref, archive in build_images().items():
            listed = self.ctr("images", "ls", "-q", check=False).stdout.split()
            if ref in listed:
                continue
            log(f"importing {ref}")
            self.ctr("images", "import", "--no-unpack=false", str(archive), check=False)
            if ref not in self.ctr("images", "ls", "-q").stdout.split():
                # Older ctr lacks --no-unpack=false; the plain import unpacks for the default snapshotter.
                self.ctr("images", "import", str(archive))
            if ref not in self.ctr("images", "ls", "-q").stdout.split():
                raise ClusterError(f"image {ref} missing after `ctr -n k8s.io images import {archive}`")

    def _write_cni_config(self) -> None:
        net_d = self.state / "cni" / "net.d"
        net_d.mkdir(parents=True, exist_ok=True)
        (net_d / "10-drae2e.conflist").write_text(json.dumps(cni_conflist(), indent=2) + "\n")

    def _start_kubelet(self, cgroup_root: str) -> None:
        assert self.plane is not None
        pki = self._pki()
        kubelet_dir = self.state / "kubelet"
        kubelet_dir.mkdir(parents=True, exist_ok=True)
        client = pki.issue(
            f"kubelet-client-{self.node_name}", f"system:node:{self.node_name}", organization="system:nodes",
            client=True,
        )  # fmt: skip
        serving = pki.issue(
            f"kubelet-serving-{self.node_name}", self.node_name, ips=(NODE_IP, "127.0.0.1"),
            dns=(self.node_name, "localhost"), server=True,
        )  # fmt: skip
        kubeconfig = write_kubeconfig(
            kubelet_dir / "kubelet.kubeconfig",
            self.plane.url,
            pki.ca.cert,
            client,
            user=f"system:node:{self.node_name}",
        )
        binary = find_binary("kubelet", "all")
        gates = usable_feature_gates(binary)
        config = kubelet_config(
            cgroup_root=cgroup_root,
            containerd_sock=self.containerd_sock,
            ca=pki.ca.cert,
            serving_cert=serving.cert,
            serving_key=serving.key,
            feature_gates={g: True for g in NODE_FEATURE_GATES if g in gates},
            cluster_dns=host_nameservers(Path("/etc/resolv.conf").read_text())[:1],
        )
        config_path = kubelet_dir / "config.json"
        config_path.write_text(json.dumps(config, indent=2) + "\n")
        labels = ",".join(f"{k}={v}" for k, v in NODE_LABELS.items())
        env = dict(os.environ)
        env["PATH"] = f"{self.bin}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        argv = [
            str(binary),
            f"--config={config_path}",
            f"--kubeconfig={kubeconfig}",
            f"--hostname-override={self.node_name}",
            f"--node-ip={NODE_IP}",
            f"--node-labels={labels}",
            f"--root-dir={KUBELET_DIR}",
            "--v=2",
        ]
        # restart_kubelet() (possibly from another process) starts the very same command again.
        (kubelet_dir / "argv.json").write_text(json.dumps(argv) + "\n")
        log(f"starting kubelet (cgroupRoot {cgroup_root})")
        self._spawn("kubelet", argv, env=env)

    def restart_kubelet(self, wait_ready: bool = False, timeout: float = 120.0) -> None:
        """Stop the running kubelet and start it again with the same command line (resilience tests).

        Works from any process: the pid record is updated in place so that `down()` stops the new kubelet.
        """
        with self._host_lock():
            self._restart_kubelet(wait_ready, timeout)

    def _restart_kubelet(self, wait_ready: bool, timeout: float) -> None:
        entries = self._recorded_processes()
        entry = next((e for e in entries if e["name"] == "kubelet"), None)
        argv_file = self.state / "kubelet" / "argv.json"
        if entry is None:
            raise ClusterError(
                f"no kubelet recorded in {self.pids_file}; is the cluster up (e2e/cluster/up.sh)?"
            )
        if argv_file.exists():
            argv: list[str] = json.loads(argv_file.read_text())
        elif _alive(int(entry["pid"]), str(entry["exe"])):
            # A cluster started before argv.json existed: take the running kubelet's command line.
            raw = Path(f"/proc/{entry['pid']}/cmdline").read_bytes().split(b"\0")
            argv = [a.decode() for a in raw if a]
        else:
            raise ClusterError(f"kubelet (pid {entry['pid']}) is not running and {argv_file} is missing")
        _stop_pid(entry)
        env = dict(os.environ)
        env["PATH"] = f"{self.bin}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        proc = ManagedProcess("kubelet", argv, self.logs / "kubelet.log", detach=True, env=env)
        proc.start()
        entry.update(pid=proc.pid, exe=argv[0])
        tmp = self.pids_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(entries, indent=2) + "\n")
        tmp.replace(self.pids_file)
        if wait_ready:
            # The old kubelet is gone, so an answer on its healthz port comes from the new one.
            wait_until(
                lambda: _kubelet_healthy() and self._node_ready(),
                what=f"restarted kubelet healthy and node {self.node_name} Ready",
                timeout=timeout,
                watch=[proc],
            )

    def _node_ready(self) -> bool:
        """The node's Ready condition is True and was reported after the kubelet's latest start."""
        status, body = self._admin_get(f"/api/v1/nodes/{self.node_name}")
        if status != 200:
            return False
        conditions = json.loads(body).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _admin_get(self, path: str) -> tuple[int, str]:
        pki_dir = self.state / "control-plane" / "pki"
        admin = KeyPair(pki_dir / "admin.crt", pki_dir / "admin.key")
        return https_get(f"https://{NODE_IP}:{APISERVER_PORT}{path}", pki_dir / "ca.crt", admin)

    def _wait_node_ready(self, timeout: float) -> None:
        assert self.plane is not None
        kubelet = next(p for p in self.processes if p.name == "kubelet")
        watch = [kubelet, *(p for p in self.processes if p.name == "containerd"), *self.plane.processes]

        log("waiting for the node to be Ready")
        wait_until(self._node_ready, what=f"node {self.node_name} Ready", timeout=timeout, watch=watch)

    def _save_logs(self, label: str) -> Path:
        dest = ARTIFACTS_DIR / f"{label}-{time.strftime('%Y%m%dT%H%M%S')}"
        dest.mkdir(parents=True, exist_ok=True)
        for f in self.logs.glob("*.log"):
            shutil.copy2(f, dest / f.name)
        prune_artifacts(label)
        return dest

    # ------------------------------------------------------------------------------------------ down
    def down(self) -> None:
        """Stop every process this cluster started, remove its containers, mounts, cgroups and host rules."""
        with self._host_lock():
            self._down()

    def _down(self) -> None:
        entries = self._recorded_processes()
        by_name = {e["name"]: e for e in entries}
        # kubelet first, so it does not restart what we remove next.
        if "kubelet" in by_name:
            _stop_pid(by_name["kubelet"])
        if "containerd" in by_name and _alive(by_name["containerd"]["pid"], by_name["containerd"]["exe"]):
            self._remove_containers()
        for entry in reversed(entries):
            _stop_pid(entry)
        self._stop_shims()
        self._unmount_all()
        self._remove_cgroups()
        self._remove_host_network()
        self._restore_kernel_tunables()
        # libcni caches each attachment's result host-wide; drop ours.
        for cached in Path("/var/lib/cni/results").glob("drae2e-*"):
            cached.unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.pids_file.unlink()
        if self.plane:
            self.plane.processes.clear()
        self.processes.clear()
        log("cluster down")

    def _remove_containers(self) -> None:
        tasks = self.ctr("tasks", "ls", "-q", check=False).stdout.split()
        for task in tasks:
            self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and self.ctr("tasks", "ls", "-q", check=False).stdout.split():
            for task in tasks:
                self.ctr("tasks", "delete", "-f", task, check=False)
            time.sleep(0.5)
        for container in self.ctr("containers", "ls", "-q", check=False).stdout.split():
            self.ctr("containers", "rm", container, check=False)

    def _stop_shims(self) -> None:
        # Shims outlive containerd by design; ours are the ones started with our socket address.
        needle = str(self.containerd_sock)
        for pid_dir in Path("/proc").iterdir():
            if not pid_dir.name.isdigit():
                continue
            try:
                cmdline = (pid_dir / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmdline and cmdline[0].endswith(b"containerd-shim-runc-v2") and needle.encode() in cmdline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid_dir.name), signal.SIGKILL)

    def _unmount_all(self) -> None:
        # kubelet bind-mounts its root dir onto itself (to make it shared), so the dirs themselves count too.
        dirs = tuple(str(p) for p in (STATE_DIR, RUN_DIR, KUBELET_DIR))
        prefixes = tuple(d + "/" for d in dirs)
        for _ in range(3):
            mounts = [
                line.split()[4]
                for line in Path("/proc/self/mountinfo").read_text().splitlines()
                if line.split()[4].startswith(prefixes) or line.split()[4] in dirs
            ]
            if not mounts:
                return
            for target in sorted(set(mounts), key=len, reverse=True):
                run(["umount", "-l", target], check=False, quiet=True)

    def _remove_cgroups(self) -> None:
        try:
            cgroup_root = (self.state / "cgroup-root").read_text().strip()
        except OSError:
            return
        for mount in set(cgroup_hierarchies().values()):
            top = mount / cgroup_root.lstrip("/")
            if not top.exists():
                continue
            for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: len(w[0]), reverse=True):
                with contextlib.suppress(OSError):
                    os.rmdir(dirpath)
        record = self.state / "cgroup-created.json"
        with contextlib.suppress(OSError, ValueError):
            for path in sorted(json.loads(record.read_text()), key=len, reverse=True):
                with contextlib.suppress(OSError):
                    os.rmdir(path)
            record.unlink()

    def _remove_host_network(self) -> None:
        for hook in ("PREROUTING", "OUTPUT"):
            while (
                run(
                    ["iptables", "-t", "nat", "-D", hook, "-j", SVC_CHAIN], check=False, quiet=True
                ).returncode
                == 0
            ):
                pass
        run(["iptables", "-t", "nat", "-F", SVC_CHAIN], check=False, quiet=True)
        run(["iptables", "-t", "nat", "-X", SVC_CHAIN], check=False, quiet=True)
        if Path(f"/sys/class/net/{BRIDGE}").exists():
            run(["ip", "link", "del", BRIDGE], check=False)
        addrs = run(["ip", "-o", "addr", "show", "dev", "lo"], check=False).stdout
        if f"{NODE_IP}/32" in addrs:
            run(["ip", "addr", "del", f"{NODE_IP}/32", "dev", "lo"], check=False)


# -------------------------------------------------------------------------------------- process records


def _alive(pid: int, exe: str) -> bool:
    """True if pid runs exe (guards against a recycled pid)."""
    try:
        cmd0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return False
    return cmd0 == exe


def _stop_pid(entry: dict[str, Any], timeout: float = 15.0) -> None:
    pid, exe = int(entry["pid"]), str(entry["exe"])
    if not _alive(pid, exe):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pid, exe):
        time.sleep(0.1)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    if _alive(pid, exe):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _kubelet_healthy() -> bool:
    with urllib.request.urlopen("http://127.0.0.1:10248/healthz", timeout=2) as resp:
        return bool(resp.read().strip() == b"ok")


def _record_start_time(control_plane_s: float, total_s: float) -> None:
    path = ARTIFACTS_DIR / "build-times.json"
    data: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text())
    data["cluster_start"] = {
        "control_plane_s": round(control_plane_s, 2),
        "node_ready_s": round(total_s, 2),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------------------- configs (pure)


def containerd_config(bin_path: Path, state: Path, run_dir: Path, sock: Path) -> str:
    """containerd 2.x config (version 3). CDI is always on in 2.x; we only point it at the spec dirs."""
    cdi = ", ".join(f'"{d}"' for d in CDI_DIRS)
    return f"""version = 3
root = "{state / "containerd" / "root"}"
state = "{run_dir / "containerd"}"

[grpc]
  address = "{sock}"

[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = [{cdi}]
  enable_selinux = false
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  # This host withholds CAP_SYS_RESOURCE, so no process may lower its oom_score_adj (the sandbox default is
  # -998); clamp every container's value to containerd's own instead of failing in runc's nsexec.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{bin_path / "runc"}"
        Root = "{run_dir / "runc"}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{bin_path / "cni"}"]
    conf_dir = "{state / "cni" / "net.d"}"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"

"""


def cni_conflist() -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": "drae2e",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    # Address leases live with the cluster's state, not in the host-wide /var/lib/cni.
                    "dataDir": str(STATE_DIR / "cni" / "ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def host_nameservers(resolv_conf: str) -> list[str]:
    """IPv4 nameservers from resolv.conf that a pod can reach (loopback resolvers are host-only)."""
    servers = []
    for line in resolv_conf.splitlines():
        parts = line.split()
        if (
            len(parts) >= 2
            and parts[0] == "nameserver"
            and "." in parts[1]
            and not parts[1].startswith("127.")
        ):
            servers.append(parts[1])
    return servers


def kubelet_config(
    *,
    cgroup_root: str,
    containerd_sock: Path,
    ca: Path,
    serving_cert: Path,
    serving_key: Path,
    feature_gates: dict[str, bool],
    cluster_dns: Sequence[str] = (),
) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This host runs cgroup v1 (an empty v2 hierarchy beside it); 1.35+ kubelets refuse v1 by default.
        "failCgroupV1": False,
        # Without CAP_SYS_RESOURCE (withheld here) kubelet cannot lower its own score to the default -999.
        "oomScoreAdj": 0,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "containerRuntimeEndpoint": f"unix://{containerd_sock}",
        "address": NODE_IP,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "tlsCertFile": str(serving_cert),
        "tlsPrivateKeyFile": str(serving_key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": "cluster.local",
        # No cluster DNS service: hand pods the host's resolver (when pods can reach it) so ClusterFirst pods
        # resolve names without a warning event per pod.
        "clusterDNS": list(cluster_dns),
        "resolvConf": "/etc/resolv.conf",
        "podCIDR": POD_CIDR,
        "failSwapOn": False,
        "featureGates": feature_gates,
        # The shared disk is mostly used by other things; never evict test pods for it.
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "syncFrequency": "10s",
        "fileCheckFrequency": "5s",
        "nodeStatusUpdateFrequency": "5s",
        "maxPods": 110,
    }


# ------------------------------------------------------------------------------------------------ images


def build_images(out_dir: Path | None = None) -> dict[str, Path]:
    """Build (once) the pause and busybox OCI archives; return reference -> archive path."""
    out = out_dir or cache_dir() / "images"
    out.mkdir(parents=True, exist_ok=True)
    images = {PAUSE_IMAGE: out / "pause-3.10.tar", BUSYBOX_IMAGE: out / "busybox-1.tar"}
    source_stamp = (HERE / "pause.c").read_bytes() + (HERE / "oci_image.py").read_bytes()
    stamp = out / ".stamp"
    import hashlib

    digest = hashlib.sha256(source_stamp + Path("/bin/busybox").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest and all(p.exists() for p in images.values()):
        return images
    with tempfile.TemporaryDirectory(prefix="img-", dir="/tmp") as tmp:
        pause_root = Path(tmp) / "pause"
        pause_root.mkdir()
        run(["gcc", "-static", "-O2", "-o", str(pause_root / "pause"), str(HERE / "pause.c")])
        build_archive(ImageSpec(PAUSE_IMAGE, entrypoint=("/pause",)), pause_root, images[PAUSE_IMAGE])
        bb_root = Path(tmp) / "busybox"
        _busybox_rootfs(bb_root)
        build_archive(ImageSpec(BUSYBOX_IMAGE, cmd=("sh",)), bb_root, images[BUSYBOX_IMAGE])
    stamp.write_text(digest)
    return images


def _busybox_rootfs(root: Path) -> None:
    busybox = Path("/bin/busybox")
    if not busybox.exists():
        raise ClusterError(
            "/bin/busybox missing: run e2e/cluster/install-host-deps.sh (package busybox-static)"
        )
    ldd = run(["ldd", str(busybox)], check=False, quiet=True)
    if "not a dynamic executable" not in ldd.stdout + ldd.stderr:
        raise ClusterError("/bin/busybox is dynamically linked; install busybox-static")
    for d in ("bin", "etc", "tmp", "proc", "sys", "dev", "root", "var", "usr/bin"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    shutil.copy2(busybox, root / "bin" / "busybox")
    applets: Iterable[str] = run([str(busybox), "--list"]).stdout.split()
    for applet in applets:
        link = root / "bin" / applet
        if applet != "busybox" and not link.exists():
            link.symlink_to("busybox")
    (root / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
    )
    (root / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")


# -------------------------------------------------------------------------------------------------- main


def main(argv: Sequence[str]) -> int:
    command = argv[1] if len(argv) > 1 else "status"
    cluster = Cluster()
    try:
        if command == "up":
            cluster.up()
        elif command == "down":
            cluster.down()
        elif command == "status":
            up = cluster.running()
            print(f"cluster {'running' if up else 'not running'}; KUBECONFIG={cluster.kubeconfig}")
            return 0 if up else 1
        elif command == "images":
            for ref, path in build_images().items():
                print(f"{ref} {path}")
        elif command == "cgroup-root":  # where containers of ours may go (e2e/kind/dockerd.sh uses it too)
            print(common_cgroup_root(own_cgroups(Path("/proc/self/cgroup").read_text())))
        else:
            print("usage: cluster.py up|down|status|images|cgroup-root", file=sys.stderr)
            return 2
    except (ClusterError, ControlPlaneError) as err:
        print(f"[cluster] ERROR: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
