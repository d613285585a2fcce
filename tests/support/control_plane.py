"""A real Kubernetes control plane (etcd + kube-apiserver, optionally kube-scheduler) on loopback for tests.

The binaries come from `e2e/cluster/build.sh control-plane` (pinned versions in `e2e/cluster/versions.env`).
Certificates are made with the `openssl` CLI so no extra Python dependency is needed. Everything lives in one
short temp dir (Unix socket paths must stay short) and every process started here is stopped by `stop()`;
children also get SIGTERM from the kernel if the Python process dies first (PR_SET_PDEATHSIG).

The e2e cluster (`e2e/cluster/cluster.py`) reuses the same pieces with `detach=True` processes.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
VERSIONS_FILE = REPO_ROOT / "e2e" / "cluster" / "versions.env"
ARTIFACTS_DIR = REPO_ROOT / "e2e" / "_artifacts"
BUILD_HINT = "e2e/cluster/build.sh control-plane"

# DRA feature gates the driver relies on. Only the ones a binary knows are passed (a gate that went GA and was
# removed would make the component refuse to start).
DRA_FEATURE_GATES: tuple[str, ...] = (
    "DynamicResourceAllocation",
    "DRAAdminAccess",
    "DRAPrioritizedList",
    "DRAPartitionableDevices",
    "DRAConsumableCapacity",
    "DRADeviceTaints",
    "DRADeviceTaintRules",
    "DRAExtendedResource",
    "DRAResourceClaimDeviceStatus",
    "DRADeviceBindingConditions",
    "DRAResourceHealthStatus",
    "DRAListTypeAttributes",
    "ResourceHealthStatus",
    "ResourceHealthStatusMessage",
)
# API versions of resource.k8s.io to serve, newest first; only the ones the server knows are enabled.
RESOURCE_API_VERSIONS: tuple[str, ...] = ("v1", "v1beta2", "v1beta1", "v1alpha3")
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"


class ControlPlaneError(RuntimeError):
    """A component could not be found, configured or started; the message says which and where its log is."""


# ------------------------------------------------------------------------------------------------ binaries


def read_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """Parse the KEY=VALUE lines of versions.env (the single source of pinned versions)."""
    versions: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        versions[key.strip()] = value.strip().strip('"')
    return versions


def cache_dir() -> Path:
    return Path(os.environ.get("DRA_GPU_CACHE") or Path.home() / ".cache" / "dra-gpu")


def kubernetes_versions_under_test(versions: Mapping[str, str] | None = None) -> list[str]:
    """KUBERNETES_VERSIONS of versions.env: the releases `make e2e` runs on (oldest supported, newest)."""
    versions = read_versions() if versions is None else versions
    listed = [v.strip() for v in versions.get("KUBERNETES_VERSIONS", "").split(",") if v.strip()]
    return listed or [versions["KUBERNETES_VERSION"]]


def selected_kubernetes_version(
    env: Mapping[str, str] = os.environ, versions: Mapping[str, str] | None = None
) -> str:
    """The Kubernetes release in use: $KUBERNETES_VERSION (a full version such as v1.34.12, or a minor of
    KUBERNETES_VERSIONS such as 1.34), else the default of versions.env. Same rules as k8s-version.sh."""
    versions = read_versions() if versions is None else versions
    wanted = (env.get("KUBERNETES_VERSION") or "").strip()
    if not wanted:
        return versions["KUBERNETES_VERSION"]
    wanted = "v" + wanted.removeprefix("v")
    parts = wanted[1:].split(".")
    if len(parts) == 2 and all(p.isdigit() for p in parts):
        matches = [v for v in kubernetes_versions_under_test(versions) if v.startswith(wanted + ".")]
        if not matches:
            raise ControlPlaneError(
                f"KUBERNETES_VERSION={env['KUBERNETES_VERSION']}: no {wanted}.x in KUBERNETES_VERSIONS of "
                f"{VERSIONS_FILE}; name a full version such as {wanted}.0"
            )
        return matches[-1]
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ControlPlaneError(
            f"KUBERNETES_VERSION={env['KUBERNETES_VERSION']} is not a Kubernetes release "
            "(want v1.MINOR.PATCH or a minor like 1.34)"
        )
    return wanted


def bin_dir() -> Path:
    """Where build.sh puts the binaries for the selected Kubernetes version."""
    return cache_dir() / "k8s" / selected_kubernetes_version() / "bin"


def find_binary(name: str, build_target: str = "control-plane") -> Path:
    path = bin_dir() / name
    if not os.access(path, os.X_OK):
        raise ControlPlaneError(
            f"{name} not found at {path}; build it with "
            f"`KUBERNETES_VERSION={selected_kubernetes_version()} e2e/cluster/build.sh {build_target}` "
            "(pinned versions in e2e/cluster/versions.env)"
        )
    return path


def supported_feature_gates(binary: Path) -> set[str]:
    """Feature gate names listed by `<binary> --help` (the `--feature-gates` section)."""
    out = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    return parse_feature_gates_help(out.stdout + out.stderr)


# Gates whose code is broken in a release: no cluster started here turns them on there, as no admin should.
# gate -> the first minor that works, and why the older ones do not.
BROKEN_FEATURE_GATES: dict[str, tuple[tuple[int, int], str]] = {
    "DRAConsumableCapacity": (
        (1, 35),
        "the 1.34 scheduler's allocator checks a request's capacity against the device at the request's "
        "device index instead of the slice's, and panics (index out of range) when a request for N devices "
        "meets a slice of fewer devices, in a loop, scheduling nothing (kubernetes/kubernetes#133705, fixed "
        "in 1.35)",
    ),
}


def binary_minor(binary: Path) -> tuple[int, int]:
    """(major, minor) of a Kubernetes binary, from `<binary> --version` ("Kubernetes v1.34.12")."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60).stdout
    match = re.search(r"v(\d+)\.(\d+)", out)
    if not match:
        raise ControlPlaneError(f"{binary} --version printed no version: {out!r}")
    return int(match.group(1)), int(match.group(2))


def broken_feature_gates(minor: tuple[int, int]) -> set[str]:
    return {gate for gate, (works_from, _) in BROKEN_FEATURE_GATES.items() if minor < works_from}


def usable_feature_gates(binary: Path) -> set[str]:
    """The gates a binary knows (`supported_feature_gates`) less those broken in its release."""
    return supported_feature_gates(binary) - broken_feature_gates(binary_minor(binary))


def parse_feature_gates_help(help_text: str) -> set[str]:
    """Extract `Name=true|false (...)` entries from a Kubernetes component's --help output."""
    gates: set[str] = set()
    for raw in help_text.splitlines():
        token = raw.strip().split(" ", 1)[0]
        # 1.36 lists gates per component ("kube:DRADeviceTaints=true|false"); the flag takes the bare name.
        token = token.rpartition(":")[2] if ":" in token.split("=", 1)[0] else token
        name, sep, rest = token.partition("=")
        if sep and rest.startswith("true|false") and name.isidentifier():
            gates.add(name)
    return gates


def feature_gate_flag(wanted: Iterable[str], supported: set[str]) -> str:
    """The `--feature-gates` value turning on each wanted gate the binary knows about."""
    return ",".join(f"{g}=true" for g in wanted if g in supported)


# -------------------------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


class Pki:
    """A throw-away CA and the certificates a loopback cluster needs, made with the openssl CLI."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca = KeyPair(self.dir / "ca.crt", self.dir / "ca.key")
        if not self.ca.cert.exists():
            self._openssl(
                "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", str(self.ca.key), "-out", str(self.ca.cert), "-days", "3650",
                "-subj", "/CN=dra-gpu-test-ca",
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
            )  # fmt: skip

    def _openssl(self, *args: str) -> None:
        res = subprocess.run(["openssl", *args], capture_output=True, text=True, cwd=self.dir)
        if res.returncode != 0:
            raise ControlPlaneError(f"openssl {' '.join(args[:2])} failed: {res.stderr.strip()}")

    def issue(
        self,
        name: str,
        common_name: str,
        *,
        organization: str | None = None,
        ips: Sequence[str] = (),
        dns: Sequence[str] = (),
        server: bool = False,
        client: bool = False,
    ) -> KeyPair:
        """Issue (once) a certificate signed by the CA; SANs and usages as given."""
        pair = KeyPair(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        if pair.cert.exists():
            return pair
        subject = f"/CN={common_name}" + (f"/O={organization}" if organization else "")
        csr = self.dir / f"{name}.csr"
        self._openssl(
            "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(pair.key), "-out", str(csr), "-subj", subject,
        )  # fmt: skip
        usages = [u for u, on in (("serverAuth", server), ("clientAuth", client)) if on]
        ext_lines = [
            "basicConstraints=CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            f"extendedKeyUsage={','.join(usages)}",
        ]
        sans = [f"IP:{ip}" for ip in ips] + [f"DNS:{d}" for d in dns]
        if sans:
            ext_lines.append("subjectAltName=" + ",".join(sans))
        ext = self.dir / f"{name}.ext"
        ext.write_text("\n".join(ext_lines) + "\n")
        self._openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(self.ca.cert), "-CAkey", str(self.ca.key),
            "-CAcreateserial", "-out", str(pair.cert), "-days", "3650", "-extfile", str(ext),
        )  # fmt: skip
        csr.unlink()
        ext.unlink()
        return pair

    def service_account_keys(self) -> KeyPair:
        """RSA key pair for signing service-account tokens (`cert` holds the public key)."""
        pair = KeyPair(self.dir / "sa.pub", self.dir / "sa.key")
        if not pair.key.exists():
            self._openssl(
                "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(pair.key)
            )
            self._openssl("pkey", "-in", str(pair.key), "-pubout", "-out", str(pair.cert))
        return pair


def write_kubeconfig(path: Path, server: str, ca: Path, client: KeyPair, user: str = "admin") -> Path:
    """A self-contained kubeconfig (certificates embedded) for `server`."""

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority-data": b64(ca)}}],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": b64(client.cert), "client-key-data": b64(client.key)},
            }
        ],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }
    # JSON is valid YAML; every kubeconfig reader accepts it.
    path.write_text(json.dumps(config, indent=2) + "\n")
    path.chmod(0o600)
    return path


# --------------------------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: ask the kernel to SIGTERM it when the parent dies, so a
    # crashed or killed pytest never leaves an apiserver behind.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


@dataclass
class ManagedProcess:
    """A component process with its log file."""

    name: str
    argv: list[str]
    log_path: Path
    detach: bool = False
    env: Mapping[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(("+ " + " ".join(self.argv) + "\n").encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=None if self.detach else _die_with_parent,
                env=dict(self.env) if self.env is not None else None,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen else -1

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 15.0) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)


def wait_until(
    check: Callable[[], bool], *, what: str, timeout: float, watch: Sequence[ManagedProcess] = ()
) -> None:
    """Poll `check` until true; fail early (with the log tail) if a watched process exits."""
    deadline = time.monotonic() + timeout
    while True:
        for proc in watch:
            if not proc.running():
                code = proc.popen.returncode if proc.popen else None
                raise ControlPlaneError(
                    f"{proc.name} exited (code {code}) while waiting for {what}; log {proc.log_path}:\n"
                    f"{proc.log_tail()}"
                )
        with contextlib.suppress(Exception):
            if check():
                return
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name} ({p.log_path}):\n{p.log_tail()}" for p in watch)
            raise ControlPlaneError(f"timed out after {timeout:.0f}s waiting for {what}\n{tails}")
        time.sleep(0.25)


def https_get(url: str, ca: Path | None, client: KeyPair | None, timeout: float = 5.0) -> tuple[int, str]:
    """GET over TLS with an optional client certificate; returns (status, body)."""
    ctx = ssl.create_default_context(cafile=str(ca)) if ca else ssl._create_unverified_context()
    if client:
        ctx.load_cert_chain(str(client.cert), str(client.key))
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode(errors="replace")


def prune_artifacts(label: str, keep: int = 10) -> None:
    """Keep only the newest `keep` log dirs named `<label>-<time>` (every failing session adds one)."""
    dirs = sorted(d for d in ARTIFACTS_DIR.glob(f"{label}-2*") if d.is_dir())
    for old in dirs[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------------------- control plane


@dataclass
class ControlPlaneOptions:
    """Knobs for the control plane. Defaults fit the pytest fixture."""

    feature_gates: Sequence[str] = DRA_FEATURE_GATES
    # Without kube-controller-manager nobody creates the `default` ServiceAccount, and the ServiceAccount
    # admission plugin would reject every Pod; the full cluster turns it back on.
    disable_admission_plugins: Sequence[str] = ("ServiceAccount",)
    extra_apiserver_args: Sequence[str] = ()
    # Address the API server binds to and advertises (the e2e cluster uses a host-local node address that
    # pods can reach too); None ports are picked free.
    bind_address: str = "127.0.0.1"
    apiserver_port: int | None = None
    etcd_ports: tuple[int, int] | None = None
    # Processes survive this Python process (the e2e cluster's up.sh); down.sh stops them by pid.
    detach: bool = False
    start_timeout: float = 120.0


class ControlPlane:
    """etcd + kube-apiserver (+ kube-scheduler on demand) on free loopback ports under `workdir`."""

    def __init__(self, workdir: Path | None = None, options: ControlPlaneOptions | None = None) -> None:
        self.options = options or ControlPlaneOptions()
        self.versions = read_versions()
        # Look for the binaries first: a missing build should fail before anything is created on disk.
        self.etcd_bin = find_binary("etcd")
        self.apiserver_bin = find_binary("kube-apiserver")
        self._owns_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="kcp-", dir="/tmp"))
        self.logs_dir = self.workdir / "logs"
        self.processes: list[ManagedProcess] = []
        self.pki = Pki(self.workdir / "pki")
        self.port = self.options.apiserver_port or free_port()
        self.url = f"https://{self.options.bind_address}:{self.port}"
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.admin = self.pki.issue("admin", "admin", organization="system:masters", client=True)
        self._gates_cache: dict[Path, set[str]] = {}

    # ---------------------------------------------------------------------------------------- helpers
    def feature_gates_for(self, binary: Path) -> str:
        if binary not in self._gates_cache:
            self._gates_cache[binary] = usable_feature_gates(binary)
        return feature_gate_flag(self.options.feature_gates, self._gates_cache[binary])

    def _spawn(self, name: str, argv: list[str]) -> ManagedProcess:
        proc = ManagedProcess(name, argv, self.logs_dir / f"{name}.log", detach=self.options.detach)
        proc.start()
        self.processes.append(proc)
        return proc

    def get(self, path: str) -> tuple[int, str]:
        return https_get(self.url + path, self.pki.ca.cert, self.admin)

    # ------------------------------------------------------------------------------------------ start
    def start(self) -> ControlPlane:
        try:
            self._start_etcd()
            self._start_apiserver()
        except BaseException:
            self.stop(keep_workdir=True)
            raise
        return self

    def _start_etcd(self) -> None:
        client_port, peer_port = self.options.etcd_ports or (free_port(), free_port())
        self.etcd_url = f"http://127.0.0.1:{client_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        etcd = self._spawn(
            "etcd",
            [
                str(self.etcd_bin),
                "--name=default",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                # Test data is disposable; skipping fsync keeps etcd fast on a busy 2-core machine.
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(self.etcd_url + "/health", timeout=2) as resp:
                return bool(json.loads(resp.read()).get("health") == "true")

        wait_until(healthy, what="etcd /health", timeout=self.options.start_timeout, watch=[etcd])

    def apiserver_args(self) -> list[str]:
        serving = self.pki.issue(
            "apiserver",
            "kube-apiserver",
            ips=tuple(dict.fromkeys(("127.0.0.1", self.options.bind_address, SERVICE_IP))),
            dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local"),
            server=True,
        )  # fmt: skip
        kubelet_client = self.pki.issue(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            organization="system:masters",
            client=True,
        )
        # Aggregation / request-header auth: without it the scheduler and controller manager log an error
        # every few seconds about the missing requestheader CA. One CA is fine for a throw-away test cluster;
        # allowed-names still limits who may assert identities.
        front_proxy = self.pki.issue("front-proxy-client", "front-proxy-client", client=True)
        sa = self.pki.service_account_keys()
        args = [
            str(self.apiserver_bin),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={self.options.bind_address}",
            f"--advertise-address={self.options.bind_address}",
            f"--secure-port={self.port}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={self.pki.ca.cert}",
            f"--kubelet-client-certificate={kubelet_client.cert}",
            f"--kubelet-client-key={kubelet_client.key}",
            f"--kubelet-certificate-authority={self.pki.ca.cert}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--service-account-key-file={sa.cert}",
            f"--service-account-signing-key-file={sa.key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            "--profiling=false",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--requestheader-client-ca-file={self.pki.ca.cert}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={front_proxy.cert}",
            f"--proxy-client-key-file={front_proxy.key}",
            f"--runtime-config={self.runtime_config()}",
        ]
        if ipaddress.ip_address(self.options.bind_address).is_loopback:
            # 1.37 refuses a loopback advertise address for the `kubernetes` Service endpoints ("may not be in
            # the loopback range"); a loopback-only test server has no pods that need them.
            args.append("--endpoint-reconciler-type=none")
        gates = self.feature_gates_for(self.apiserver_bin)
        if gates:
            args.append(f"--feature-gates={gates}")
        if self.options.disable_admission_plugins:
            args.append("--disable-admission-plugins=" + ",".join(self.options.disable_admission_plugins))
        args.extend(self.options.extra_apiserver_args)
        return args

    def runtime_config(self) -> str:
        return ",".join(f"resource.k8s.io/{v}=true" for v in self.served_resource_versions())

    def served_resource_versions(self) -> list[str]:
        # v1 is the driver's API; the beta versions let tests check conversion and older clients, and
        # v1alpha3 carries DeviceTaintRule in 1.36.
        return list(RESOURCE_API_VERSIONS)

    def _start_apiserver(self) -> None:
        apiserver = self._spawn("kube-apiserver", self.apiserver_args())
        write_kubeconfig(self.kubeconfig, self.url, self.pki.ca.cert, self.admin)

        def ready() -> bool:
            status, _ = self.get("/readyz")
            return status == 200

        wait_until(
            ready, what="kube-apiserver /readyz", timeout=self.options.start_timeout, watch=[apiserver]
        )

    # -------------------------------------------------------------------------------------- scheduler
    def start_scheduler(self) -> ManagedProcess:
        """Start a real kube-scheduler on this API server (built by `build.sh control-plane`)."""
        binary = find_binary("kube-scheduler")
        port = free_port()
        args = [
            str(binary),
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.workdir / 'scheduler-certs'}",
            "--leader-elect=false",
            "--profiling=false",
        ]
        gates = self.feature_gates_for(binary)
        if gates:
            args.append(f"--feature-gates={gates}")
        proc = self._spawn("kube-scheduler", args)

        def healthy() -> bool:
            return https_get(f"https://127.0.0.1:{port}/healthz", None, None)[0] == 200

        wait_until(healthy, what="kube-scheduler /healthz", timeout=self.options.start_timeout, watch=[proc])
        return proc

    # ------------------------------------------------------------------------------------------ usage
    def api_client(self) -> Any:
        """A `kubernetes.client.ApiClient` for the admin user."""
        from kubernetes import config  # imported late: only tests that talk to the server need it

        factory: Callable[..., Any] = config.new_client_from_config
        return factory(config_file=str(self.kubeconfig))

    def version(self) -> dict[str, Any]:
        status, body = self.get("/version")
        if status != 200:
            raise ControlPlaneError(f"GET /version returned {status}: {body[:200]}")
        result: dict[str, Any] = json.loads(body)
        return result

    def save_logs(self, label: str) -> Path:
        """Copy the component logs to e2e/_artifacts/<label>-<time>/ and return that directory."""
        dest = ARTIFACTS_DIR / f"{label}-{time.strftime('%Y%m%dT%H%M%S')}"
        dest.mkdir(parents=True, exist_ok=True)
        if self.logs_dir.exists():
            for log in self.logs_dir.glob("*.log"):
                shutil.copy2(log, dest / log.name)
        prune_artifacts(label)
        return dest

    def stop(self, keep_workdir: bool = False) -> None:
        """Stop every process started here (newest first) and remove the temp dir."""
        for proc in reversed(self.processes):
            proc.stop()
        self.processes.clear()
        if self._owns_workdir and not keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
