"""The product path on a real NVIDIA GPU, without Kubernetes: claims allocated as the scheduler
allocates them, prepared by the kubelet plugin over its gRPC socket, and CUDA clients run in each claim's
container view.

    sudo PYTHONPATH=. python3 e2e/real_gpu/product_path.py [--nvidia-driver-root /] [--job-seconds 3]
    PYTHONPATH=. python3 e2e/real_gpu/product_path.py --simulated h100-80gb      # the same flow, no GPU

What runs for real: `dra-gpu kubelet-plugin` as on a node (`--kubelet-plugins-directory-path
/var/lib/kubelet/plugins`, the kubelet's registrar directory, CDI specs in /var/run/cdi, `--mps-daemon-mode
process`, real NVML) with the lab option `--mps-leave-compute-mode` (no GPU setting may change on a lent
machine); the node's ResourceSlices built by `dra-gpu slices` from the same hardware; allocations by the
project's allocator (the scheduler's semantics: shareID and consumedCapacity for the fractional shares);
NodePrepareResources / NodeUnprepareResources over the plugin's DRA v1 socket, registered as the kubelet does;
CUDA clients (cuda_client.py) in a private mount namespace with the claim's CDI mounts and env applied, as
uid 65532. What stands in: only the API server, by `claim_server.ClaimServer` (GET of a ResourceClaim).

Phases: the bare GPU (one FMA batch job alone, then 4 at once, time-sliced without MPS); 4 shares of
`gpu-0-shared` at compute 25 / memory 10Gi (SMs and memory of each, 4 jobs one per share, a client that leaves
its share, the plugin SIGKILLed and restarted, unprepare); one share of 50 / 20Gi (SMs, memory, 4 jobs as 4
clients of it); a 25 % and a 50 % share side by side (a client of the 25 % one that raises its env limits
gets the 50 % share's SMs and memory, and after the 50 % share left the 25 % share's again); `gpu-0` whole
with an MPS GpuConfig (50 %, 10Gi). Then: no GPU setting changed (`nvidia-smi
-q`'s modes, clocks and power limit before and after). Each check prints PASS / FAIL / NOTE / SKIP; a table of
figures ends the run, and with $OUT (or --out) set, product-path.json holds both. Exit status 1 when a check
failed (the 1.1x concurrency goal is reported, not counted). Everything started is stopped and removed on the
way out, on failure too.

`--simulated PROFILE` (also `--dry-run`, profile h100-80gb) runs the same flow on the project's simulator in
a throw-away directory: a simulated driver root (DRA_GPU_SIM_ROOT), the simulated MPS control daemon, and
`python -m dra_gpu.hardware.sim_tools.mps_client` as the client instead of CUDA.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from e2e.real_gpu.cdi_view import ViewPlan, host_kind, namespace_command, read_spec, view_plan  # noqa: E402
from e2e.real_gpu.claim_server import ClaimServer, allocate, claim_object  # noqa: E402

DRIVER = "gpu.nvidia.com"
NAMESPACE = "product-path"
LAB_OPTION = "--mps-leave-compute-mode"
CLIENT = Path(__file__).with_name("cuda_client.py")
SIM_CLIENT = ["-m", "dra_gpu.hardware.sim_tools.mps_client"]
CLIENT_UID = 65532
GIB_MIB = 1024
CONCURRENCY_GOAL = 1.1
RAISE = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G"}

# ------------------------------------------------------------------------------------- checks and figures


@dataclass
class Report:
    """Check lines (printed as they come) and figures (a table at the end)."""

    checks: list[dict[str, str]] = field(default_factory=list)
    figures: list[dict[str, Any]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)  # raw client answers etc., for the JSON only
    echo: Callable[[str], None] = print

    def check(self, status: str, name: str, detail: str = "") -> bool:
        self.checks.append({"status": status, "name": name, "detail": detail})
        self.echo(f"{status:4} {name}{': ' + detail if detail else ''}")
        return status != "FAIL"

    def expect(self, ok: bool, name: str, detail: str = "") -> bool:
        return self.check("PASS" if ok else "FAIL", name, detail)

    def figure(self, name: str, value: Any, note: str = "") -> None:
        self.figures.append({"figure": name, "value": value, "note": note})

    def failed(self) -> list[dict[str, str]]:
        return [c for c in self.checks if c["status"] == "FAIL" and not c["name"].startswith("goal:")]

    def to_json(self) -> dict[str, Any]:
        return {"checks": self.checks, "figures": self.figures, "data": self.data}


def figures_table(figures: Sequence[Mapping[str, Any]]) -> str:
    """The figures as a Markdown table (what the README's table is filled from)."""
    rows = [("figure", "value", "note")] + [
        (str(f["figure"]), _text(f["value"]), str(f.get("note") or "")) for f in figures
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"
    if value is None:
        return "n/a"
    return str(value)


def ratio(times: Sequence[float | None], alone: float | None) -> float | None:
    """The slowest of jobs run together, over one job alone; None when a time is missing."""
    if not times or alone is None or alone <= 0 or any(t is None for t in times):
        return None
    return max(t for t in times if t is not None) / alone


def sm_share_ok(sms: int, device_sms: int, percentage: float) -> bool:
    """MPS rounds a thread percentage to whole SM groups (25 % of 132 gave 32): within 2 SMs above and
    6 below the exact share (the H100's TPC pairs, GPC rounding)."""
    exact = device_sms * percentage / 100
    return exact - 6 <= sms <= exact + 2


# Keys of `nvidia-smi -q` that are GPU settings (what a check must leave as it found it).
SETTING_WORDS = ("Mode", "Power Limit", "Applications Clocks")


def settings_of(nvidia_smi_q: str) -> dict[str, str]:
    """`Section > Key: value` for every setting-like line of `nvidia-smi -q`: keys or sections naming a mode
    (compute, MIG current/pending, persistence, ECC, accounting, ...), power limits and application
    clocks; per GPU (the `GPU 00000000:...` header starts each)."""
    out: dict[str, str] = {}
    gpu = ""
    stack: list[tuple[int, str]] = []  # (indent, section name)
    for line in nvidia_smi_q.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if line.startswith("GPU "):
            gpu, stack = line.strip(), []
            continue
        key, sep, value = line.strip().partition(":")
        key = key.strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if not sep or (not value.strip() and not any(w in key for w in ("Clocks", "Mode"))):
            stack.append((indent, key))
            continue
        if not value.strip():
            stack.append((indent, key))
            continue
        path = [name for _i, name in stack] + [key]
        if any(word in part for part in path for word in SETTING_WORDS):
            out[" > ".join([gpu, *path]).strip(" >")] = value.strip()
    return out


def settings_diff(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    return [
        f"{k}: {before.get(k)!r} -> {after.get(k)!r}"
        for k in sorted(set(before) | set(after))
        if before.get(k) != after.get(k)
    ]


def daemon_records(checkpoint: Any) -> list[dict[str, Any]]:
    """Every MPS daemon record in a checkpoint (dicts with a pipe directory and a daemon directory)."""
    found: list[dict[str, Any]] = []
    if isinstance(checkpoint, dict):
        if "pipeDir" in checkpoint and "dir" in checkpoint:
            found.append(checkpoint)
        for value in checkpoint.values():
            found += daemon_records(value)
    elif isinstance(checkpoint, list):
        for value in checkpoint:
            found += daemon_records(value)
    return list({r["dir"]: r for r in found}.values())


def pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# ------------------------------------------------------------------------------------------------ the node


class Node:
    """The directories, the plugin process and the kubelet's connection to it, on real or simulated
    hardware; `undo` holds what to take down on the way out."""

    def __init__(self, args: argparse.Namespace, base: Path) -> None:
        self.args = args
        self.base = base
        self.simulated = args.simulated is not None
        self.name = "product-path-node"
        self.undo: list[Callable[[], None]] = []
        if self.simulated:
            from dra_gpu.hardware.sim_driver_root import init_sim_driver_root

            self.driver_root = base / "drv"
            init_sim_driver_root(self.driver_root, args.simulated, seed=self.name)
            self.hardware = args.simulated
        else:
            self.driver_root = Path(args.nvidia_driver_root)
            self.hardware = "real"
        self.plugins_dir = Path(
            args.plugins_dir or (base / "plg" if self.simulated else "/var/lib/kubelet/plugins")
        )
        self.registrar_dir = Path(
            args.registrar_dir or (base / "reg" if self.simulated else "/var/lib/kubelet/plugins_registry")
        )
        self.cdi_root = Path(args.cdi_root or (base / "cdi" if self.simulated else "/var/run/cdi"))
        self.plugin_dir = self.plugins_dir / DRIVER
        self.proc: subprocess.Popen[bytes] | None = None
        self.kubelet: Any = None
        self.starts = 0

    # -- directories: made here are removed at the end
    def make_dirs(self) -> None:
        if (self.plugin_dir / "checkpoint.json").exists():
            raise SystemExit(
                f"{self.plugin_dir}/checkpoint.json exists: another plugin's (or a previous run's) state; "
                "remove it first or give --plugins-dir"
            )
        for path in (self.plugins_dir, self.registrar_dir, self.cdi_root, self.plugin_dir):
            self.mkdirs(path)

    def mkdirs(self, path: Path) -> None:
        missing = []
        for p in [path, *path.parents]:
            if p.exists():
                break
            missing.append(p)
        if missing:
            path.mkdir(parents=True)
            top = missing[-1]
            self.undo.append(lambda: shutil.rmtree(top, ignore_errors=True))

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_MPS_", "DRA_GPU_FAULT"))}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        return env

    def python_tool(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "dra_gpu.cli.main", *args],
            env=self.env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"dra-gpu {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
        return done.stdout

    def slices(self) -> list[dict[str, Any]]:
        out = self.python_tool(
            "slices", "--hardware", self.hardware, "--nvidia-driver-root", str(self.driver_root),
            "--node", self.name, "-o", "json",
        )  # fmt: skip
        items: list[dict[str, Any]] = json.loads(out)["items"]
        return items

    def nvidia_smi_q(self) -> str:
        binary = str(self.driver_root / "usr/bin/nvidia-smi") if self.simulated else "nvidia-smi"
        done = subprocess.run([binary, "-q"], capture_output=True, text=True, timeout=60, check=False)
        return (
            done.stdout if done.returncode == 0 else f"nvidia-smi -q exited {done.returncode}: {done.stderr}"
        )

    # -- the plugin
    def plugin_argv(self, kubeconfig: Path) -> list[str]:
        argv = [
            sys.executable, "-m", "dra_gpu.cli.kubelet_plugin", "--node-name", self.name,
            "--hardware", self.hardware, "--nvidia-driver-root", str(self.driver_root),
            "--kubeconfig", str(kubeconfig),
            "--kubelet-registrar-directory-path", str(self.registrar_dir),
            "--kubelet-plugins-directory-path", str(self.plugins_dir), "--cdi-root", str(self.cdi_root),
            "--publish-slices", "false", "--mps-daemon-mode", "process", "--log-format", "json",
        ]  # fmt: skip
        if not self.args.without_lab_option:
            argv.append(LAB_OPTION)
        return argv + list(self.args.plugin_arg)

    def start_plugin(self, kubeconfig: Path, timeout: float = 60) -> float:
        """Start the plugin, wait for its registration socket, register as the kubelet; seconds taken."""
        from tests.plugin.kubelet_client import KubeletClient
        from tests.plugin.plugin_harness import wait_for_socket

        self.starts += 1
        log_path = self.base / f"plugin-{self.starts}.log"
        started = time.monotonic()
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.plugin_argv(kubeconfig),
                cwd=REPO_ROOT,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )

        def tail() -> str:
            return "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])

        try:
            wait_for_socket(self.registrar_dir / f"{DRIVER}-reg.sock", self.proc, tail, timeout)
        except RuntimeError as err:
            if "unrecognized arguments" in str(err) and LAB_OPTION in str(err):
                raise RuntimeError(
                    f"the kubelet plugin refuses {LAB_OPTION}: this checkout's plugin lacks the lab option "
                    "that leaves the GPU's compute mode alone; without it a whole-GPU MPS claim would set "
                    f"EXCLUSIVE_PROCESS, which a lent machine must not. Plugin output:\n{tail()}"
                ) from None
            raise
        self.kubelet = KubeletClient(self.registrar_dir / f"{DRIVER}-reg.sock")
        return time.monotonic() - started

    def kill_plugin(self, sig: int = signal.SIGKILL) -> int | None:
        if self.kubelet is not None:
            self.kubelet.close()
            self.kubelet = None
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        code = self.proc.returncode
        self.proc = None
        return code

    def checkpoint(self) -> Any:
        path = self.plugin_dir / "checkpoint.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def daemon_records(self) -> list[dict[str, Any]]:
        """The MPS daemons the plugin keeps now: its checkpoint's and each daemon directory's record.json (a
        GPU's common server for its shares is recorded there, not in a claim's entry)."""
        files = sorted((self.plugin_dir / "mps").glob("*/record.json"))
        saved = []
        for path in files:
            with contextlib.suppress(OSError, ValueError):
                saved.append(json.loads(path.read_text()))
        return daemon_records([self.checkpoint(), saved])

    def leftover_daemon_pids(self, records: Sequence[Mapping[str, Any]]) -> list[int]:
        pids = [int(r["pid"]) for r in records if pid_alive(r.get("pid"))]
        if self.simulated:
            from tests.plugin.plugin_harness import _pids_with_env

            pids += _pids_with_env("DRA_GPU_SIM_ROOT", str(self.driver_root))
        return sorted(set(pids))

    def mounts_under(self, path: Path) -> list[str]:
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        return sorted((m for m in mounts if m.startswith(f"{path}/")), reverse=True)


# ------------------------------------------------------------------------------------------------ clients


@dataclass
class Claim:
    name: str
    obj: dict[str, Any]
    cdi_ids: list[str] = field(default_factory=list)
    plan: ViewPlan | None = None

    @property
    def uid(self) -> str:
        return str(self.obj["metadata"]["uid"])


class Clients:
    """Runs the client (CUDA, or the simulated MPS client) bare on the host or in a claim's view."""

    def __init__(self, node: Node, report: Report) -> None:
        self.node = node
        self.report = report
        self.uid = CLIENT_UID if node.args.client_uid is None else node.args.client_uid
        # a copy any uid can read (the checkout may sit under /root)
        self.client_dir = node.base / "client"
        self.client_dir.mkdir(mode=0o755)
        shutil.copy(CLIENT, self.client_dir / CLIENT.name)
        os.chmod(self.client_dir / CLIENT.name, 0o644)
        self.empty_pipe = node.base / "no-mps"  # CUDA_MPS_PIPE_DIRECTORY of a bare client: no daemon there
        self.empty_pipe.mkdir(mode=0o755)

    def argv(self, *, alloc_mib: Sequence[int] = (), iterations: int = 0, start_at: float = 0) -> list[str]:
        if self.node.simulated:
            extra = ["--job-seconds", str(self.node.args.job_seconds)] if iterations else []
            return [sys.executable, *SIM_CLIENT, *extra]
        out = [sys.executable, str(self.client_dir / CLIENT.name)]
        for mib in alloc_mib:
            out += ["--alloc-mib", str(mib)]
        if iterations:
            out += ["--job-iterations", str(iterations), "--blocks", "16", "--start-at", f"{start_at:.3f}"]
        return out

    def base_env(self) -> dict[str, str]:
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/tmp",
            "CUDA_CACHE_DISABLE": "1",  # no JIT cache files left behind
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        if self.node.simulated:
            env["PYTHONPATH"] = str(REPO_ROOT)
            env["DRA_GPU_SIM_ROOT"] = str(self.node.driver_root)
        return env

    def probe_uid(self) -> None:
        """Can the client's interpreter run as the non-root uid here? Else clients run as root (a NOTE)."""
        if self.uid == 0:
            return
        probe = "import dra_gpu" if self.node.simulated else "import ctypes"
        done = subprocess.run(
            ["setpriv", "--reuid", str(self.uid), "--regid", str(self.uid), "--clear-groups",
             sys.executable, "-c", probe],
            env=self.base_env(), cwd="/", capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            self.report.check(
                "NOTE",
                f"clients as uid {self.uid}",
                f"not possible here ({sys.executable} or the checkout is not readable by it: "
                f"{done.stderr.strip()[-200:]}); clients run as root",
            )
            self.uid = 0

    def spawn(
        self,
        claim: Claim | None,
        argv: Sequence[str],
        env_over: Mapping[str, str] | None = None,
        uid: int | None = None,
    ) -> subprocess.Popen[str]:
        env = self.base_env()
        if claim is None:
            env["CUDA_MPS_PIPE_DIRECTORY"] = str(self.empty_pipe)
            command = list(argv)
        else:
            assert claim.plan is not None
            env.update(claim.plan.env)
            command = namespace_command(claim.plan, self.uid if uid is None else uid, argv)
        env.update(env_over or {})
        return subprocess.Popen(
            command, env=env, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def run(
        self,
        claims: Sequence[Claim | None],
        timeout: float = 180,
        env_over: Mapping[str, str] | None = None,
        uid: int | None = None,
        **argv_options: Any,
    ) -> list[dict[str, Any]]:
        """One client per entry (None: bare on the host), started together; their JSON answers."""
        if "iterations" in argv_options:
            argv_options.setdefault("start_at", time.time() + self.node.args.start_margin)
        procs = [self.spawn(c, self.argv(**argv_options), env_over, uid) for c in claims]
        answers = []
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                err += f"\n(killed after {timeout}s)"
            try:
                answer = json.loads(out)
            except ValueError:
                answer = {"exit": proc.returncode, "stdout": out[-500:], "stderr": err[-800:]}
            else:
                answer.setdefault("exit", proc.returncode)
                if proc.returncode:
                    answer["stderr"] = err[-800:]
            answers.append(answer)
        return answers


def sms_of(answer: Mapping[str, Any]) -> int | None:
    value = answer.get("contextSMs", answer.get("smCount"))
    return int(value) if isinstance(value, int | float) else None


def memory_limit_mib(answer: Mapping[str, Any]) -> float | None:
    """What the client may use: the CUDA context's free memory, or the simulated client's pinned limit."""
    if isinstance(answer.get("freeMiB"), int | float):
        return float(answer["freeMiB"])
    limits = answer.get("pinnedDeviceMemoryLimits") or {}
    for value in limits.values() if isinstance(limits, dict) else ():
        if isinstance(value, str) and value.endswith("M"):
            return float(value[:-1])
        if isinstance(value, str) and value.endswith("G"):
            return float(value[:-1]) * GIB_MIB
    return None


def elapsed_of(answer: Mapping[str, Any]) -> float | None:
    value = answer.get("elapsedSeconds")
    return float(value) if isinstance(value, int | float) else None


# ------------------------------------------------------------------------------------------------- the run


SHARE_CLASS = "gpu-share.nvidia.com"


def share_request(compute: int, memory_gib: int) -> dict[str, Any]:
    capacity = {"requests": {"memory": f"{memory_gib}Gi", "compute": str(compute)}}
    return {"name": "share", "exactly": {"deviceClassName": SHARE_CLASS, "capacity": capacity}}


def mps_config(threads: int, memory_gib: int) -> dict[str, Any]:
    parameters = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {
            "strategy": "MPS",
            "mpsConfig": {
                "defaultActiveThreadPercentage": threads,
                "defaultPinnedDeviceMemoryLimit": f"{memory_gib}Gi",
            },
        },
    }
    return {"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": parameters}}


class ProductPath:
    def __init__(self, args: argparse.Namespace, node: Node, report: Report) -> None:
        self.args = args
        self.node = node
        self.report = report
        self.server = ClaimServer()
        self.kubeconfig = node.base / "kubeconfig"
        self.slices: list[dict[str, Any]] = []
        self.prepared: dict[str, Claim] = {}  # uid -> claim, prepared and not yet unprepared
        self.records_seen: list[dict[str, Any]] = []
        self.clients = Clients(node, report)
        self.device_sms: int | None = None
        self.iterations = 0
        self.alone: float | None = None
        self.created_targets: list[Path] = []

    # -- claims
    def allocate(self, name: str, request: dict[str, Any], configs: Sequence[dict[str, Any]] = ()) -> Claim:
        obj = claim_object(NAMESPACE, name, request, configs)
        allocate(obj, self.slices, self.node.name, self.server.allocated())
        self.server.put(obj)
        result = obj["status"]["allocation"]["devices"]["results"][0]
        self.report.data.setdefault("allocations", {})[name] = result
        return Claim(name, obj)

    def prepare(self, claims: Sequence[Claim]) -> bool:
        from tests.plugin.kubelet_client import ClaimId

        ids = [ClaimId(NAMESPACE, c.uid, c.name) for c in claims]
        response = self.node.kubelet.prepare(ids, timeout=120)
        ok = True
        for claim in claims:
            answer = response.claims[claim.uid]
            if answer.error:
                ok = self.report.check("FAIL", f"prepare {claim.name}", answer.error)
                continue
            claim.cdi_ids = [i for d in answer.devices for i in d.cdi_device_ids]
            self.prepared[claim.uid] = claim
            claim.plan = self.view(claim)
        self.records_seen += self.node.daemon_records()
        return ok

    def view(self, claim: Claim) -> ViewPlan:
        from dra_gpu.cdi.spec_builder import spec_file_name

        spec = read_spec(self.node.cdi_root / spec_file_name(claim.uid))
        plan = view_plan(spec, claim.cdi_ids, host_kind)
        for target in plan.create_dirs:
            path = Path(target)
            if not path.exists():
                path.mkdir(mode=0o755)
                self.created_targets.append(path)
        self.report.data.setdefault("views", {})[claim.name] = plan.to_json()
        return plan

    def unprepare(self, claims: Sequence[Claim]) -> bool:
        from tests.plugin.kubelet_client import ClaimId

        ids = [ClaimId(NAMESPACE, c.uid, c.name) for c in claims]
        response = self.node.kubelet.unprepare(ids, timeout=120)
        ok = True
        for claim in claims:
            error = response.claims[claim.uid].error
            if error:
                ok = self.report.check("FAIL", f"unprepare {claim.name}", error)
            else:
                self.prepared.pop(claim.uid, None)
                self.server.remove(claim.obj)
        return ok

    def cleanup_check(self, what: str, claims: Sequence[Claim]) -> None:
        """After unprepare: no daemon process, no daemon directory (pipe, shm), no CDI spec of the claims."""
        from dra_gpu.cdi.spec_builder import spec_file_name

        records = daemon_records(self.records_seen)
        alive = [int(r["pid"]) for r in records if pid_alive(r.get("pid"))]
        dirs = [r["dir"] for r in records if Path(r["dir"]).exists()]
        specs = [c.name for c in claims if (self.node.cdi_root / spec_file_name(c.uid)).exists()]
        mounts = self.node.mounts_under(self.node.plugin_dir)
        problems = [f"daemons alive {alive}"] * bool(alive) + [f"daemon dirs left {dirs}"] * bool(dirs)
        problems += [f"CDI specs left for {specs}"] * bool(specs) + [f"mounts left {mounts}"] * bool(mounts)
        self.report.expect(
            not problems,
            f"{what}: unprepare cleans up",
            "; ".join(problems)
            or f"{len(records)} daemon(s) gone with their pipe and shm directories, no CDI spec",
        )

    # -- phases
    def bare(self) -> None:
        """The bare GPU: device SMs; one batch job alone (calibrated to --job-seconds); 4 time-sliced."""
        [probe] = self.clients.run([None])
        self.report.data["bare"] = probe
        self.device_sms = sms_of({"smCount": probe.get("deviceSMs")}) or self._device_sms_from_slices()
        self.report.figure("device SMs", self.device_sms)
        if self.node.simulated:
            self.iterations = 1
        else:
            trial = 20_000_000
            [first] = self.clients.run([None], iterations=trial)
            seconds = elapsed_of(first)
            if seconds is None:
                self.report.check("FAIL", "bare GPU: FMA batch job runs", json.dumps(first)[:600])
                return
            self.iterations = max(1, min(4_000_000_000, int(trial * self.args.job_seconds / seconds)))
        [alone] = self.clients.run([None], iterations=self.iterations)
        self.alone = elapsed_of(alone)
        self.report.data["alone"] = alone
        if self.alone is None:
            self.report.check("SKIP", "bare GPU: one job alone", f"no time: {json.dumps(alone)[:400]}")
            return
        self.report.figure("1 job alone (16 blocks)", self.alone, f"seconds, {self.iterations} iterations")
        together = self.clients.run([None] * 4, iterations=self.iterations)
        self.report.data["bareTogether"] = together
        r = ratio([elapsed_of(a) for a in together], self.alone)
        self.report.figure("4 jobs time-sliced, no MPS", r, "x alone (slowest of 4)")
        self.report.check(
            "NOTE" if r is not None else "SKIP", "bare GPU: 4 jobs time-sliced", f"{_text(r)}x alone"
        )

    def _device_sms_from_slices(self) -> int | None:
        for s in self.slices:
            for device in s["spec"].get("devices", []):
                if device["name"] == "gpu-0":
                    return int(device["capacity"]["multiprocessors"]["value"])
        return None

    def share_checks(self, claim: Claim, compute: int, memory_gib: int) -> dict[str, Any]:
        """SMs and memory of one share from its container view."""
        limit_mib = memory_gib * GIB_MIB
        [answer] = self.clients.run([claim], alloc_mib=[limit_mib - 2 * GIB_MIB, limit_mib + GIB_MIB])
        self.report.data.setdefault("probes", {})[claim.name] = answer
        sms, memory = sms_of(answer), memory_limit_mib(answer)
        label = f"{claim.name} ({compute} %, {memory_gib}Gi)"
        if sms is not None and self.device_sms:
            self.report.expect(
                sm_share_ok(sms, self.device_sms, compute), f"{label}: SMs", f"{sms} of {self.device_sms}"
            )
        elif "activeThreadPercentage" in answer:
            got = answer["activeThreadPercentage"]
            self.report.expect(got == compute, f"{label}: active thread percentage", f"{got}")
        else:
            self.report.check("FAIL", f"{label}: SMs", f"no answer: {json.dumps(answer)[:500]}")
        if memory is not None:
            self.report.expect(memory <= limit_mib, f"{label}: memory within the share", f"{memory:.0f} MiB")
        allocations = answer.get("allocations")
        if isinstance(allocations, dict):
            below, past = (
                allocations.get(str(limit_mib - 2 * GIB_MIB)),
                allocations.get(str(limit_mib + GIB_MIB)),
            )
            self.report.expect(
                below == "ok" and past != "ok",
                f"{label}: allocation past the share fails",
                f"{memory_gib - 2} GiB {below}, {memory_gib + 1} GiB {past}",
            )
        elif not self.node.simulated:
            self.report.check("FAIL", f"{label}: allocations", json.dumps(answer)[:500])
        self.report.figure(f"{label} SMs / memory", f"{_text(sms)} / {_text(memory)} MiB")
        return answer

    def concurrency(self, label: str, claims: Sequence[Claim], goal: bool = False) -> float | None:
        answers = self.clients.run(claims, iterations=self.iterations)
        self.report.data.setdefault("jobs", {})[label] = answers
        r = ratio([elapsed_of(a) for a in answers], self.alone)
        self.report.figure(label, r, "x alone (slowest of 4)")
        if r is None:
            detail = json.dumps([a for a in answers if elapsed_of(a) is None][:1])[:500]
            self.report.check("SKIP" if self.node.simulated else "FAIL", label, f"no time: {detail}")
        elif goal:
            self.report.expect(
                r <= CONCURRENCY_GOAL, f"goal: {label} <= {CONCURRENCY_GOAL}x alone", f"{r:.2f}x"
            )
        else:
            self.report.check("NOTE", label, f"{r:.2f}x alone")
        return r

    def quarter_shares(self) -> None:
        claims = [self.allocate(f"quarter-{i}", share_request(25, 10)) for i in range(4)]
        results = [c.obj["status"]["allocation"]["devices"]["results"][0] for c in claims]
        self.report.expect(
            all(r["device"].endswith("-shared") and r.get("shareID") for r in results)
            and len({r["shareID"] for r in results}) == 4,
            "allocator: 4 shares of 25 % / 10Gi on one GPU",
            ", ".join(f"{r['device']} {r.get('consumedCapacity')}" for r in results[:1]) + " x4",
        )
        if not self.prepare(claims):
            return
        first = {c.name: list(c.cdi_ids) for c in claims}
        answers = [self.share_checks(c, 25, 10) for c in claims]
        self.concurrency("4 jobs in 4 shares of 25 %", claims, goal=True)
        self.leave_share(claims[0], sms_of(answers[0]))
        self.plugin_restart(claims, first, sms_of(answers[0]))
        self.unprepare(claims)
        self.cleanup_check("4 shares", claims)

    def leave_share(self, claim: Claim, share_sms: int | None) -> None:
        """A client in the share's view that points CUDA_MPS_PIPE_DIRECTORY elsewhere."""
        elsewhere = str(self.clients.empty_pipe)
        # the simulator's GPU state is root's: a simulated process without MPS must be root to take a context
        uid = 0 if self.node.simulated else None
        [answer] = self.clients.run([claim], env_over={"CUDA_MPS_PIPE_DIRECTORY": elsewhere}, uid=uid)
        self.report.data["leaveShare"] = answer
        [raised] = self.clients.run([claim], env_over=RAISE)
        self.report.data["raiseShare"] = raised
        self.report.figure(
            "client raising its env limits (100 %, 80G): SMs", sms_of(raised), "in a 25 % share"
        )
        self.report.check(
            "NOTE",
            "a client that raises its own MPS limits in its env",
            f"{_text(sms_of(raised))} SMs, {_text(memory_limit_mib(raised))} MiB "
            f"(share: {_text(share_sms)} SMs)",
        )
        sms = sms_of(answer)
        self.report.figure("client that leaves its share: SMs", sms, "CUDA_MPS_PIPE_DIRECTORY elsewhere")
        whole = sms is not None and self.device_sms is not None and sms >= self.device_sms - 2
        self.report.check(
            "NOTE",
            "a client that leaves its share",
            f"got {_text(sms)} SMs (share: {_text(share_sms)}): "
            + (
                f"the whole GPU, the documented effect of {LAB_OPTION} (compute mode left Default)"
                if whole
                else f"not the whole GPU: {json.dumps(answer)[:300]}"
            ),
        )

    def plugin_restart(
        self, claims: Sequence[Claim], first: Mapping[str, list[str]], sms: int | None
    ) -> None:
        records = self.node.daemon_records()
        self.node.kill_plugin(signal.SIGKILL)
        alive = [r["id"] for r in records if pid_alive(r.get("pid"))]
        self.report.expect(
            len(alive) == len(records) > 0,
            "plugin SIGKILLed: the MPS daemons live on",
            f"{len(alive)} of {len(records)}",
        )
        [answer] = self.clients.run([claims[0]])
        got = sms_of(answer)
        if got is None and "activeThreadPercentage" in answer:
            self.report.expect(answer["activeThreadPercentage"] == 25, "plugin down: a share is still served")
        else:
            self.report.expect(
                got is not None and got == sms, "plugin down: a share is still served", f"{got} SMs"
            )
        seconds = self.node.start_plugin(self.kubeconfig)
        self.report.figure("plugin restart to registration", seconds, "seconds")
        if self.prepare(claims):
            same = all(c.cdi_ids == first[c.name] for c in claims)
            self.report.expect(same, "restarted plugin: re-prepare answers the same CDI ids")
        after = {r["id"]: r.get("pid") for r in self.node.daemon_records()}
        self.report.expect(
            after == {r["id"]: r.get("pid") for r in records},
            "restarted plugin: the same daemons serve the shares",
        )

    def half_share(self) -> None:
        claim = self.allocate("half", share_request(50, 20))
        if not self.prepare([claim]):
            return
        self.share_checks(claim, 50, 20)
        self.concurrency("4 jobs as 4 clients of one 50 % share", [claim] * 4)
        self.unprepare([claim])
        self.cleanup_check("50 % share", [claim])

    def caps_follow_shares(self) -> None:
        """Issue 36: a tenant that raises its env limits gets the largest share on its GPU and no more, and
        once the larger share left, no more than the largest share still there (its server's caps shrink, the
        running server's too). Each answer is a fresh client in the 25 % share's container view."""
        small = self.allocate("caps-small", share_request(25, 10))
        large = self.allocate("caps-large", share_request(50, 20))
        if not self.prepare([small, large]):
            return
        probe = [8 * GIB_MIB, 16 * GIB_MIB]  # within the 50 % share, past the 25 % one
        [beside] = self.clients.run([small], env_over=RAISE, alloc_mib=probe)
        self._capped("beside a 50 % / 20Gi share", beside, 50, 20)
        self.unprepare([large])
        [after] = self.clients.run([small], env_over=RAISE, alloc_mib=probe)
        self._capped("after the 50 % share left", after, 25, 10)
        self.report.data["capsFollowShares"] = {"beside": beside, "after": after}
        self.unprepare([small])
        self.cleanup_check("caps follow the shares", [small, large])

    def _capped(self, when: str, answer: Mapping[str, Any], compute: int, memory_gib: int) -> None:
        label = f"25 % share, env raised, {when}"
        sms, memory = sms_of(answer), memory_limit_mib(answer)
        if sms is not None and self.device_sms:
            self.report.expect(
                sm_share_ok(sms, self.device_sms, compute), f"{label}: {compute} % of the SMs", f"{sms}"
            )
        else:
            got = answer.get("activeThreadPercentage")
            self.report.expect(got == compute, f"{label}: active thread percentage {compute}", f"{got}")
        if memory is not None:
            self.report.expect(
                memory <= memory_gib * GIB_MIB, f"{label}: memory within {memory_gib}Gi", f"{memory:.0f}"
            )
        allocations = answer.get("allocations")
        if isinstance(allocations, dict):
            past = allocations.get(str(16 * GIB_MIB))
            self.report.expect((past == "ok") == (memory_gib > 16), f"{label}: 16 GiB allocation", f"{past}")
        self.report.figure(f"{label}: SMs / memory", f"{_text(sms)} / {_text(memory)} MiB")

    def whole_gpu_mps(self) -> None:
        claim = self.allocate(
            "whole", {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}, [mps_config(50, 10)]
        )
        self.report.expect(
            claim.obj["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0",
            "allocator: gpu-0 whole, with an MPS GpuConfig",
        )
        if not self.prepare([claim]):
            return
        self.share_checks(claim, 50, 10)
        during = settings_of(self.node.nvidia_smi_q())
        modes = {k: v for k, v in during.items() if k.endswith("Compute Mode")}
        self.report.expect(
            all(v == "Default" for v in modes.values()),
            f"whole-GPU MPS claim under {LAB_OPTION}: compute mode left Default",
            json.dumps(modes),
        )
        self.unprepare([claim])
        self.cleanup_check("whole-GPU MPS", [claim])

    # -- the whole flow
    def run(self) -> None:
        self.report.echo(f"hardware {self.node.hardware}, driver root {self.node.driver_root}")
        before = settings_of(self.node.nvidia_smi_q())
        self.report.data["settingsBefore"] = before
        self.slices = self.node.slices()
        self.node.make_dirs()
        self.server.start()
        self.node.undo.append(self.server.stop)
        self.server.write_kubeconfig(self.kubeconfig)
        seconds = self.node.start_plugin(self.kubeconfig)
        self.report.check(
            "PASS", "plugin started as on a node", f"{seconds:.2f}s to registration, {self.node.plugins_dir}"
        )
        self.report.figure("plugin start to registration", seconds, "seconds")
        self.clients.probe_uid()
        phases = (
            self.bare,
            self.quarter_shares,
            self.half_share,
            self.caps_follow_shares,
            self.whole_gpu_mps,
        )
        for phase in phases:
            try:
                phase()
            except Exception as err:  # one phase's failure is reported; the others still run
                self.report.check("FAIL", f"phase {phase.__name__}", f"{type(err).__name__}: {err}")
                self.unprepare_all()
        self.node.kill_plugin(signal.SIGTERM)
        after = settings_of(self.node.nvidia_smi_q())
        self.report.data["settingsAfter"] = after
        diff = settings_diff(before, after)
        self.report.expect(
            bool(before) and not diff,
            "no GPU setting changed (nvidia-smi -q, before vs after)",
            "; ".join(diff) or f"{len(before)} setting fields the same",
        )
        left = self.node.leftover_daemon_pids(daemon_records(self.records_seen))
        self.report.expect(not left, "no MPS daemon process left", f"{left}" if left else "")

    def unprepare_all(self) -> None:
        """On the way out: unprepare what is still prepared (restarting the plugin if it is down)."""
        if not self.prepared:
            return
        with contextlib.suppress(Exception):
            if self.node.proc is None or self.node.proc.poll() is not None:
                self.node.start_plugin(self.kubeconfig)
            self.unprepare(list(self.prepared.values()))

    def teardown(self) -> None:
        with contextlib.suppress(Exception):
            self.unprepare_all()
        self.node.kill_plugin(signal.SIGTERM)
        for pid in self.node.leftover_daemon_pids(daemon_records(self.records_seen)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for mount in self.node.mounts_under(self.node.plugin_dir):
            subprocess.run(["umount", "-l", mount], check=False)
        for path in self.created_targets:
            with contextlib.suppress(OSError):
                path.rmdir()


@contextlib.contextmanager
def work_dir(simulated: bool) -> Iterator[Path]:
    # short: the simulated plugin directory's sockets and pipe directories must stay short
    base = Path(tempfile.mkdtemp(prefix="pp-", dir="/tmp"))
    os.chmod(base, 0o755)
    try:
        yield base
    finally:
        for mount in sorted((line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                             if line.split()[1].startswith(f"{base}/")), reverse=True):  # fmt: skip
            subprocess.run(["umount", "-l", mount], check=False)
        shutil.rmtree(base, ignore_errors=True)


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nvidia-driver-root", default="/")
    parser.add_argument("--simulated", metavar="PROFILE", help="run on the simulator (e.g. h100-80gb)")
    parser.add_argument("--dry-run", action="store_true", help="--simulated h100-80gb")
    parser.add_argument("--plugins-dir", help="default /var/lib/kubelet/plugins (simulated: a temporary one)")
    parser.add_argument("--registrar-dir", help="default /var/lib/kubelet/plugins_registry")
    parser.add_argument("--cdi-root", help="default /var/run/cdi")
    parser.add_argument("--job-seconds", type=float, default=3.0, help="one batch job alone takes about this")
    parser.add_argument(
        "--start-margin", type=float, default=6.0, help="seconds to start clients before a job"
    )
    parser.add_argument(
        "--client-uid", type=int, help=f"uid of the clients in claim views (default {CLIENT_UID})"
    )
    parser.add_argument("--plugin-arg", action="append", default=[], help="one more plugin flag")
    parser.add_argument(
        "--without-lab-option",
        action="store_true",
        help=f"simulator only: start the plugin without {LAB_OPTION} (a plugin that lacks it)",
    )
    parser.add_argument("--out", default=os.environ.get("OUT"), help="directory for product-path.json ($OUT)")
    args = parser.parse_args(argv)
    if args.dry_run and args.simulated is None:
        args.simulated = "h100-80gb"
    if args.without_lab_option and args.simulated is None:
        parser.error("--without-lab-option would let the plugin change a real GPU's compute mode")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments(argv)
    if os.geteuid() != 0:
        print(
            "product_path.py needs root (mount namespaces, the kubelet's directories, MPS)", file=sys.stderr
        )
        return 2
    report = Report()
    started = time.monotonic()
    with work_dir(args.simulated is not None) as base:
        node = Node(args, base)
        flow: ProductPath | None = None
        try:
            flow = ProductPath(args, node, report)
            flow.run()
        except Exception as err:
            report.check("FAIL", "product path", f"{type(err).__name__}: {err}")
        finally:
            if flow is not None:
                flow.teardown()
            for undo in reversed(node.undo):
                with contextlib.suppress(Exception):
                    undo()
            for log in sorted(base.glob("plugin-*.log")):
                report.data.setdefault("pluginLogTail", {})[log.name] = log.read_text(errors="replace")[
                    -4000:
                ]
    report.figure("run", round(time.monotonic() - started, 1), "seconds")
    print()
    print(figures_table(report.figures))
    failed = report.failed()
    print(
        f"\n{len(report.checks)} checks, {len(failed)} failed"
        + (f": {', '.join(c['name'] for c in failed)}" if failed else "")
    )
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "product-path.json").write_text(json.dumps(report.to_json(), indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
