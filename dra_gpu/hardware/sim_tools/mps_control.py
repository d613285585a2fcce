"""A fake `nvidia-cuda-mps-control` for simulated driver roots (`DRA_GPU_SIM_ROOT`): the one model of it.

    nvidia-cuda-mps-control -d [-M]     start a control daemon in the background and return (like the real -d;
                                        -M: multi-user mode, one server for every uid)
    nvidia-cuda-mps-control -f [-M]     run the control daemon in the foreground (as in a daemon's own pod)
    echo CMD | nvidia-cuda-mps-control  send each stdin line to the daemon and print its answers

The daemon is a real, detached process (double fork + setsid, so it outlives whoever started it). It serves a
Unix socket `control` in `CUDA_MPS_PIPE_DIRECTORY` (default /tmp/nvidia-mps), writes `control.log` in
`CUDA_MPS_LOG_DIRECTORY` (default /var/log/nvidia-mps) and its pid to `nvidia-cuda-mps-control.pid` in the
pipe directory (unless DRA_GPU_SIM_MPS_PID_FILE=0). Its record (mps_records.py) holds every command it
received, its defaults and its MPS servers, so tests and `dra-gpu hardware state` see what the driver asked
for and what each server gives.

MPS servers are modelled inside the daemon, not as processes: a server has a synthetic pid (above any real
pid, mps_records.SERVER_PID_BASE), the uid of the client that made it, the devices it serves, its own active
thread percentage and pinned memory limits, and its clients; while it runs it holds an "mps-server" context on
each of its devices (simulator/contexts.py), which is what compute mode EXCLUSIVE_PROCESS counts. A CUDA
process is simulated by mps_client.py; it connects to the daemon and stays connected while it runs (its
connection closing is its exit, however it ends).

Commands: `get_server_list`, `get_client_list PID`, `set_default_active_thread_percentage N`,
`get_default_active_thread_percentage`, `set_default_device_pinned_mem_limit DEV VALUE`,
`get_default_device_pinned_mem_limit DEV`, `set_active_thread_percentage PID N`,
`get_active_thread_percentage PID`, `set_device_pinned_mem_limit PID DEV VALUE`,
`get_device_pinned_mem_limit PID DEV`, `shutdown_server PID [-f]`, `quit [-t TIMEOUT]`; and, simulator only,
`sim_get_visible_devices` and `sim_client_attach` (mps_client.py). DEV is a UUID or an index into
`CUDA_VISIBLE_DEVICES`; VALUE is `<N>M` or `<N>G`. Invalid commands get an error answer and the client
exits 1.

A thread percentage in the daemon's own environment (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`) is its default from
the moment it starts (MPS docs 4.2.5, "MPS control daemon level"); `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` there is
ignored, as a real daemon ignores it (H100, driver 580.159.04). Answers are printed as the real tool prints
them: `30.0` for a thread percentage, `2G` (or `1500M`) for a pinned limit, nothing for an unset one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import selectors
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dra_gpu.hardware.sim_tools import mps_records

# Imported where used: the simulator package loads the whole simulated NVML (~150 ms), which the client mode
# (every `echo CMD | nvidia-cuda-mps-control`) does not need.
if TYPE_CHECKING:
    from dra_gpu.hardware.simulator.state import SimState, StateStore

SOCKET_NAME = "control"
PID_FILE = "nvidia-cuda-mps-control.pid"
# Whether the daemon writes PID_FILE. Driver 580 does (seen on an H200, driver 580.159.04, 2026-11-27; MPS
# docs, "Appendix: Tools and Interface Reference": the control daemon creates nvidia-cuda-mps-control.pid in
# CUDA_MPS_PIPE_DIRECTORY); "0" models a driver that does not, so the driver must not depend on it.
PID_FILE_ENV = "DRA_GPU_SIM_MPS_PID_FILE"
LOCK_FILE = "control_lock"  # one control session ("UI") at a time, as the real daemon's pipe directory has
BUSY_MESSAGE = "Cannot send command to MPS control daemon process"
NOT_RUNNING_MESSAGE = "Cannot find MPS control daemon process"
LOG_FILE = "control.log"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
DEFAULT_LOG_DIR = "/var/log/nvidia-mps"
STATE_PATH = "var/lib/nvml-sim/state.json"
# The longest pipe directory a daemon starts with. Seen on an H200 (driver 580.159.04, CUDA 13.0, 2026-11-27):
# `-d` exits 1, printing nothing useful, with a pipe directory path of 88 characters or more, and works at 86
# (its sockets live there and must fit a Unix socket path). 87 was not tried; it is refused here, to be safe.
MAX_PIPE_DIR_CHARS = 86
ATTACH = "sim_client_attach"  # the simulated CUDA client's request (mps_client.py), not a tool command
KEEP_STOPPED_SERVERS = 20  # ended servers kept in the record for inspection
_LIMIT_RE = re.compile(r"^([0-9]+)([MG])$")
_COMPUTE_KINDS = ("compute", "graphics")  # contexts of their own: each one time-slices the device


class CommandError(Exception):
    pass


def _store() -> StateStore | None:
    from dra_gpu.hardware.simulator.state import StateStore

    root = os.environ.get("DRA_GPU_SIM_ROOT")
    return StateStore(Path(root) / STATE_PATH) if root else None


def _known_uuids(store: StateStore) -> set[str]:
    state = store.read()
    uuids = {g.uuid for g in state.gpus}
    for g in state.gpus:
        for gi in g.gpu_instances:
            uuids.update(ci.uuid for ci in gi.compute_instances)
    return uuids


def multiprocessors(state: SimState, uuid: str) -> int:
    """The SMs of a simulated GPU or MIG device (a compute instance gets its share of its GPU instance's)."""
    from dra_gpu.hardware import profiles

    for gpu, gstate in zip(profiles.simulated_gpus(state.layout(), state.seed), state.gpus, strict=True):
        if gstate.uuid == uuid:
            return gpu.profile.multiprocessors
        specs = {spec.gi_profile_id: spec for spec in gpu.profile.mig_profiles}
        for gi in gstate.gpu_instances:
            for ci in gi.compute_instances:
                spec = specs.get(gi.profile_id)
                if ci.uuid == uuid and spec is not None:
                    return spec.multiprocessors * ci.slice_count // max(spec.compute_slices, 1)
    raise CommandError(f"no simulated GPU or MIG device has UUID {uuid}")


def sms_for_percentage(total: int, percentage: int) -> int:
    """The SMs a context limited to `percentage` gets: whole TPCs (2 SMs), rounded down. Seen on an H100
    (driver 580.159.04): 25 % of 132 SMs gave 32, not 33."""
    if percentage >= 100:
        return total
    return max(2, int(total * percentage / 100) // 2 * 2)


def time_sliced_contexts(driver_root: str, uuid: str) -> int:
    """How many contexts take turns on `uuid`: each process with a context of its own, and each MPS server
    that has clients (an idle server's context runs nothing). Seen on an H200 (driver 580.159.04,
    2026-11-27): 4 jobs in 4 servers took 4.25x one job alone, as 4 plain processes do; 4 clients of one
    server took 1.00x."""
    from dra_gpu.hardware.simulator.contexts import list_contexts

    servers = mps_records.live_servers(driver_root)
    count = 0
    for context in list_contexts(driver_root, uuid):
        active_server = context.kind == "mps-server" and bool(servers.get(context.pid, {}).get("clients"))
        count += context.kind in _COMPUTE_KINDS or active_server
    return count


def prune_dead_daemons(driver_root: str) -> None:
    """Drop the contexts of the servers (and their clients) of daemons that died without cleaning up
    (SIGKILL): an MPS server does not outlive its control daemon, so its context must not keep a GPU busy."""
    from dra_gpu.hardware.simulator.contexts import remove_context

    for record in mps_records.dead_daemons(driver_root):
        for server in record.get("servers") or ():
            pids = [int(server["pid"]), *(int(client["pid"]) for client in server.get("clients") or ())]
            for uuid in server.get("gpus") or ():
                for pid in pids:
                    with contextlib.suppress(ValueError):  # a MIG device that is gone took them along
                        remove_context(driver_root, uuid, pid)


@dataclass
class Client:
    """A CUDA process attached to a server; `conn` is its open connection to the daemon."""

    pid: int
    uid: int
    conn: socket.socket
    since: float = field(default_factory=time.time)


@dataclass
class Server:
    """One simulated `nvidia-cuda-mps-server`."""

    pid: int
    uid: int
    gpus: list[str]
    thread_percentage: int
    pinned: dict[str, int]  # device uuid -> MiB (no entry: no limit)
    started: float = field(default_factory=time.time)
    clients: list[Client] = field(default_factory=list)
    shutting_down: bool = False

    def as_record(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "uid": self.uid,
            "gpus": list(self.gpus),
            "active_thread_percentage": self.thread_percentage,
            "pinned_mem_limits": {uuid: f"{value}M" for uuid, value in sorted(self.pinned.items())},
            "clients": [{"pid": c.pid, "uid": c.uid, "since": c.since} for c in self.clients],
            "started": self.started,
            "shutting_down": self.shutting_down,
        }

    def device(self, spec: str) -> str:
        if spec in self.gpus:
            return spec
        if spec.isdigit() and int(spec) < len(self.gpus):
            return self.gpus[int(spec)]
        raise CommandError(f"device {spec!r} is not served by MPS server {self.pid}")


class Daemon:
    """The control daemon's state and command handling (one command per control connection)."""

    def __init__(self, pipe_dir: Path, log_dir: Path, visible: list[str], store: StateStore | None) -> None:
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self.visible = visible
        self.store = store
        self.driver_root = os.environ.get("DRA_GPU_SIM_ROOT", "")
        self.entry: dict[str, Any] = {}
        self.thread_percentage: int | None = None
        self.pinned: dict[str, str] = {}
        self.multi_user = False
        self.servers: list[Server] = []
        self.stopped_servers: list[dict[str, Any]] = []
        self.selector = selectors.DefaultSelector()
        self.quit_deadline: float | None = None  # set by `quit`: the daemon ends once its servers have
        self._fallback_pid = mps_records.SERVER_PID_BASE + os.getpid() * 1000  # without a driver root

    def log(self, text: str) -> None:
        """A line in control.log. A line that cannot be written (the log directory's disk is full) is lost and
        the daemon goes on serving: losing its log is no reason for a daemon to stop (the soak found that a
        simulated daemon which died of it made every MPS claim's daemon die whenever the plugin's directory
        filled up). Writing its pid file at start is another matter: `start_daemon` fails then."""
        with contextlib.suppress(OSError), open(self.log_dir / LOG_FILE, "a", encoding="utf-8") as out:
            out.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {text}\n")

    def record(self, **changes: Any) -> None:
        """Update this daemon's record (mps_records.py): its defaults and servers included."""
        if self.store is None:
            return
        self.entry.update(changes)
        self.entry["default_active_thread_percentage"] = self.thread_percentage
        self.entry["default_pinned_mem_limits"] = dict(self.pinned)
        self.entry["servers"] = [s.as_record() for s in self.servers]
        self.entry["stopped_servers"] = list(self.stopped_servers)
        if self.entry.get("running"):
            mps_records.write_running(self.driver_root, self.entry)
        else:
            mps_records.write_stopped(self.driver_root, self.entry)

    def record_command(self, line: str, ok: bool) -> None:
        self.entry.setdefault("commands", []).append({"command": line, "ok": ok})
        self.record()

    def device(self, spec: str) -> str:
        if spec in self.visible:
            return spec
        if spec.isdigit() and int(spec) < len(self.visible):
            return self.visible[int(spec)]
        raise CommandError(
            f"device {spec!r} is not visible to this daemon (CUDA_VISIBLE_DEVICES={','.join(self.visible)})"
        )

    def server(self, spec: str) -> Server:
        for server in self.servers:
            if spec.isdigit() and server.pid == int(spec):
                return server
        raise CommandError(f"no MPS server with pid {spec!r}")

    def handle(self, line: str) -> tuple[str, bool]:
        """(answer, quit?) for one control command; raises CommandError."""
        words = line.split()
        if not words:
            raise CommandError("empty command")
        name, args = words[0], words[1:]
        # nvidia-cuda-mps-control(1) / MPS docs "Legacy MPS v2 Interface": get_server_list prints the pids of
        # the running servers, one per line (none before a client has connected); get_client_list PID the pids
        # of that server's clients. Seen on an H200 (driver 580.159.04, 2026-11-27): one pid per line.
        if name == "get_server_list" and not args:
            self._end_servers_that_lost_their_gpu()
            return "\n".join(str(s.pid) for s in self.servers), False
        if name == "get_client_list" and len(args) == 1:
            return "\n".join(str(c.pid) for c in self.server(args[0]).clients), False
        # set_default_*: "If there is already a server spawned, this command will only affect the next
        # server" (MPS docs, Legacy MPS v2 Interface). Seen on an H200 (driver 580.159.04): defaults set after
        # a server started did not reach its next client (still 132 SMs and 12 GiB). A server copies them at
        # spawn.
        if name == "set_default_active_thread_percentage" and len(args) == 1:
            self.thread_percentage = thread_percentage(args[0])
            return f"{self.thread_percentage:.1f}", False  # the real tool answers "30.0"
        if name == "get_default_active_thread_percentage" and not args:
            return f"{self.thread_percentage if self.thread_percentage is not None else 100:.1f}", False
        if name == "set_default_device_pinned_mem_limit" and len(args) == 2:
            uuid = self.device(args[0])
            mib(args[1], what="pinned memory limit")
            self.pinned[uuid] = args[1]
            return "", False
        if name == "get_default_device_pinned_mem_limit" and len(args) == 1:
            value = self.pinned.get(self.device(args[0]))
            return ("" if value is None else _as_the_tool_prints(value)), False  # unset: no answer
        # Per-server limits change a running server (MPS docs, Legacy MPS v2 Interface:
        # set_active_thread_percentage <PID>, set_device_pinned_mem_limit <PID> <dev> <value>). Seen on an
        # H200 (driver 580.159.04, 2026-11-27): 25 % and 2G set on the running server -> its next client got
        # 32 SMs and 1903 MiB free.
        if name == "get_active_thread_percentage" and len(args) == 1:
            return f"{self.server(args[0]).thread_percentage:.1f}", False
        if name == "set_active_thread_percentage" and len(args) == 2:
            server = self.server(args[0])
            server.thread_percentage = thread_percentage(args[1])
            return f"{server.thread_percentage:.1f}", False
        if name == "get_device_pinned_mem_limit" and len(args) == 2:
            server = self.server(args[0])
            limit = server.pinned.get(server.device(args[1]))
            return ("" if limit is None else _as_the_tool_prints(f"{limit}M")), False
        if name == "set_device_pinned_mem_limit" and len(args) == 3:
            server = self.server(args[0])
            server.pinned[server.device(args[1])] = mib(args[2], what="pinned memory limit")
            return "", False
        # shutdown_server PID [-f] (nvidia-cuda-mps-control(1)): the server takes no new client and exits when
        # its clients are gone; -f ends it at once. A client that comes later gets a new server (seen on an
        # H200, driver 580.159.04: the new server took the defaults of that moment).
        if name == "shutdown_server" and len(args) in (1, 2) and args[1:] in ([], ["-f"]):
            server = self.server(args[0])
            server.shutting_down = True
            if args[1:] == ["-f"] or not server.clients:
                self.end_server(server)
            return "", False
        if name == "sim_get_visible_devices" and not args:  # simulator only: for tests
            return json.dumps(self.visible), False
        # quit [-t TIMEOUT] (nvidia-cuda-mps-control(1)): the daemon stops accepting new clients, waits for
        # its servers' clients to finish, and with a TIMEOUT forces the servers down after that many seconds.
        if name == "quit" and (not args or (len(args) == 2 and args[0] == "-t" and args[1].isdigit())):
            timeout = float(args[1]) if args else float("inf")
            self.quit_deadline = time.monotonic() + timeout
            return "", True
        raise CommandError(f"unknown command or wrong arguments: {line!r}")

    # ---- servers and their clients ----
    def spawn_server(self, uid: int) -> Server:
        """A new server with the daemon's defaults as they are now; it takes a context on each device it
        serves, which CUDA refuses in compute mode EXCLUSIVE_PROCESS while another process holds one there (or
        in PROHIBITED): ContextRefusedError."""
        if self.driver_root:
            from dra_gpu.hardware.simulator.contexts import add_context, remove_context

            prune_dead_daemons(self.driver_root)
            pid = mps_records.next_server_pid(self.driver_root)
            taken: list[str] = []
            try:
                for uuid in self.visible:
                    add_context(self.driver_root, uuid, pid, kind="mps-server")
                    taken.append(uuid)
            except Exception:
                for uuid in taken:
                    remove_context(self.driver_root, uuid, pid)
                raise
        else:
            self._fallback_pid += 1
            pid = self._fallback_pid
        server = Server(
            pid=pid,
            uid=uid,
            gpus=list(self.visible),
            thread_percentage=100 if self.thread_percentage is None else self.thread_percentage,
            pinned={uuid: mib(value) for uuid, value in self.pinned.items()},
        )
        self.servers.append(server)
        self.log(f"Starting new server {pid} for user {uid}")
        return server

    def end_server(self, server: Server) -> None:
        for client in server.clients:
            self._drop_client(server, client)
        server.clients = []
        if self.driver_root:
            from dra_gpu.hardware.simulator.contexts import remove_context

            for uuid in server.gpus:
                with contextlib.suppress(ValueError):
                    remove_context(self.driver_root, uuid, server.pid)
        self.servers.remove(server)
        self.stopped_servers = [*self.stopped_servers, {**server.as_record(), "stopped": time.time()}][
            -KEEP_STOPPED_SERVERS:
        ]
        self.log(f"Server {server.pid} exited")

    def _drop_client(self, server: Server, client: Client) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(client.conn)
        client.conn.close()
        if self.driver_root:
            from dra_gpu.hardware.simulator.contexts import remove_context

            for uuid in server.gpus:
                with contextlib.suppress(ValueError):
                    remove_context(self.driver_root, uuid, client.pid)

    def attach(self, conn: socket.socket, reported_pid: int) -> tuple[dict[str, Any], bool]:
        """A CUDA process asks for a server: (answer, keep the connection as its attachment)."""
        pid, uid = _peer(conn, reported_pid)
        server = self._server_for(uid)
        if server is None:
            # nvidia-cuda-mps-control(1): a server of another uid is asked "to shutdown as soon as all its
            # clients are done. Once the existing server has terminated, the control daemon launches a new
            # server" for the waiting client. Not in multi-user mode (-M, NVIDIA's mpsConfig.multiUser).
            return {"status": "wait", "reason": "an MPS server of another user runs"}, False
        if isinstance(server, str):
            return {"status": "error", "message": server}, False
        client = Client(pid=pid, uid=uid, conn=conn)
        server.clients.append(client)
        self.selector.register(conn, selectors.EVENT_READ, (server, client))
        sm_counts: dict[str, int] = {}
        sliced: dict[str, int] = {}
        if self.driver_root and self.store is not None:
            from dra_gpu.hardware.simulator.contexts import add_context

            for uuid in server.gpus:
                with contextlib.suppress(ValueError):
                    add_context(self.driver_root, uuid, pid, kind="mps-client")
            self.record()  # before counting: others count this server's clients from its record
            state = self.store.read()
            for uuid in server.gpus:
                sm_counts[uuid] = multiprocessors(state, uuid)
                sliced[uuid] = time_sliced_contexts(self.driver_root, uuid)
        self.log(f"New client {pid} (uid {uid}) connected to server {server.pid}")
        self.record()
        answer = {"status": "attached", "server": server.as_record(), "smCounts": sm_counts}
        return {**answer, "timeSliced": sliced}, True

    def _server_for(self, uid: int) -> Server | str | None:
        """The server a client of `uid` gets (spawned if needed), None to wait, or CUDA's refusal text."""
        from dra_gpu.hardware.simulator.contexts import ContextRefusedError

        self._end_servers_that_lost_their_gpu()
        if not self.multi_user:
            others = [s for s in self.servers if s.uid != uid]
            asked = [s for s in others if not s.shutting_down]
            for other in others:
                other.shutting_down = True
                if not other.clients:
                    self.end_server(other)
            if any(s.uid != uid for s in self.servers):
                if asked:
                    self.record()  # the servers asked to end say so in the record
                return None
        found = next((s for s in self.servers if not s.shutting_down), None)
        if found is not None:
            return found
        try:
            return self.spawn_server(uid)
        except ContextRefusedError as err:
            self.log(f"Server failed to start: {err} ({err.detail})")
            return str(err)

    def _end_servers_that_lost_their_gpu(self) -> None:
        """A server whose context is gone from its GPU (the GPU fell off the bus and came back: NVML's
        `recover_gpu` drops every context it had) died with it: a CUDA context does not survive its device
        going away. The next client gets a new server, with a context of its own (so compute mode
        EXCLUSIVE_PROCESS sees it again; found by the soak: a bare process took such a GPU from its MPS
        claim)."""
        if not self.driver_root or self.store is None:
            return
        held = {(c.device_uuid, c.pid) for c in self.store.read().contexts if c.kind == "mps-server"}
        for server in [s for s in self.servers if any((uuid, s.pid) not in held for uuid in s.gpus)]:
            self.log(f"Server {server.pid} lost its device")
            self.end_server(server)

    def detach(self, server: Server, client: Client) -> None:
        if client not in server.clients:
            return
        self._drop_client(server, client)
        server.clients.remove(client)
        self.log(f"Client {client.pid} disconnected from server {server.pid}")
        if server.shutting_down and not server.clients and server in self.servers:
            self.end_server(server)
        self.record()

    def end_all_servers(self) -> None:
        for server in list(self.servers):
            self.end_server(server)

    # ---- the loop ----
    def serve(self, listener: socket.socket) -> None:
        self.selector.register(listener, selectors.EVENT_READ, None)
        while True:
            timeout = None
            if self.quit_deadline is not None:
                if not any(s.clients for s in self.servers) or time.monotonic() >= self.quit_deadline:
                    return
                timeout = min(1.0, max(0.0, self.quit_deadline - time.monotonic()))
            for key, _events in self.selector.select(timeout):
                if key.data is None:
                    conn, _ = listener.accept()
                    if self._handle_connection(conn):  # `quit`: no new clients or commands from now on
                        self.selector.unregister(listener)
                        listener.close()
                        with contextlib.suppress(FileNotFoundError):
                            (self.pipe_dir / SOCKET_NAME).unlink()
                        break
                else:
                    server, client = key.data
                    try:
                        data = client.conn.recv(4096)
                    except OSError:
                        data = b""
                    if not data:  # the client process ended (or closed its connection)
                        self.detach(server, client)

    def _handle_connection(self, conn: socket.socket) -> bool:
        """Serve one control command or a client's attach; True once `quit` was received."""
        line = _read_line(conn)
        if line.split()[:1] == [ATTACH]:
            words = line.split()
            reported = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
            try:
                answer, keep = self.attach(conn, reported)
            except Exception as err:  # the client must hear why; the daemon goes on
                answer, keep = {"status": "error", "message": f"simulator: {err!r}"}, False
            with contextlib.suppress(OSError):
                conn.sendall((json.dumps(answer) + "\n").encode())
            if not keep:
                conn.close()
            return False
        with conn:
            try:
                answer_text, stop = self.handle(line)
                ok = True
            except CommandError as err:
                answer_text, stop, ok = f"ERROR: {err}", False, False
            self.log(f"{'Received' if ok else 'Rejected'} command: {line}")
            self.record_command(line, ok)
            with contextlib.suppress(OSError):
                conn.sendall((answer_text + "\n").encode() if answer_text else b"")
                if not ok:
                    conn.sendall(b"\x00")  # tells the client the command failed
        return stop


def _peer(conn: socket.socket, reported_pid: int) -> tuple[int, int]:
    """(pid, uid) of the process at the other end, from the kernel (SO_PEERCRED), as a real daemon learns
    who its client is; the pid the client reported where the kernel gives none (another pid namespace)."""
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return (pid or reported_pid), uid


def _read_line(conn: socket.socket) -> str:
    data = b""
    conn.settimeout(5)
    try:
        while not data.endswith(b"\n") and len(data) < 4096:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    conn.settimeout(None)
    return data.decode(errors="replace").strip()


def mib(value: str, what: str = "memory limit") -> int:
    """`<N>M` / `<N>G` (the MPS tools' notation) -> MiB."""
    match = _LIMIT_RE.match(value.strip())
    if match is None or int(match.group(1)) == 0:
        raise CommandError(f"invalid {what} {value!r}: expected <N>M or <N>G, N > 0")
    return int(match.group(1)) * (1024 if match.group(2) == "G" else 1)


def parse_pinned_env(text: str, visible: Sequence[str]) -> dict[str, int]:
    """`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` ("0=1G,GPU-...=512M": device index or UUID) -> uuid -> MiB."""
    limits: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        device, _, value = item.partition("=")
        if device.isdigit() and int(device) < len(visible):
            device = visible[int(device)]
        if device not in visible:
            raise CommandError(
                f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT names {device!r}, not a device of this server"
            )
        limits[device] = mib(value)
    return limits


def thread_percentage(text: str) -> int:
    """An active thread percentage as the tool takes it (`30`, `40.5`; 0..100), rounded to a whole one."""
    try:
        value = float(text.strip())
    except ValueError:
        value = -1.0
    if not 0 <= value <= 100:
        raise CommandError(f"invalid active thread percentage {text!r}: expected 0..100")
    return round(value)


def _as_the_tool_prints(value: str) -> str:
    """`2048M` -> `2G`: the real tool answers in whole GiB where it can (seen on driver 580.159.04)."""
    mebibytes = mib(value)
    return f"{mebibytes >> 10}G" if mebibytes % 1024 == 0 else f"{mebibytes}M"


def thread_percentage_from_env(env: Mapping[str, str]) -> int | None:
    """The daemon-level default from the control daemon's own environment (MPS docs 4.2.5, "MPS control
    daemon level"). Only the thread percentage: a real control daemon (H100, driver 580.159.04) ignores
    CUDA_MPS_PINNED_DEVICE_MEM_LIMIT in its own environment (in every notation: index or UUID, M or G), so the
    simulated one does too; pinned limits are set by command."""
    text = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "").strip()
    return thread_percentage(text) if text else None


def _dirs() -> tuple[Path, Path]:
    pipe_dir = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR)
    log_dir = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG_DIR)
    return pipe_dir, log_dir


def start_daemon(foreground: bool = False, multi_user: bool = False) -> int:
    pipe_dir, log_dir = _dirs()
    if len(os.fsencode(pipe_dir)) > MAX_PIPE_DIR_CHARS:
        return 1  # as the real -d: exit status 1 and nothing useful said (see MAX_PIPE_DIR_CHARS)
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    store = _store()
    if not visible:
        print(
            "CUDA_VISIBLE_DEVICES is empty: the MPS control daemon needs the devices it serves",
            file=sys.stderr,
        )
        return 1
    if store is not None:
        unknown = [d for d in visible if d not in _known_uuids(store)]
        if unknown:
            print(
                f"CUDA_VISIBLE_DEVICES names devices that do not exist: {','.join(unknown)}", file=sys.stderr
            )
            return 1
    try:
        daemon_threads = thread_percentage_from_env(os.environ)
    except CommandError as err:
        print(str(err), file=sys.stderr)
        return 1
    pipe_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    if _answers(pipe_dir):  # a daemon serves this pipe directory (found by its socket, pid file or not)
        print(f"An instance of this daemon is already running ({pipe_dir})", file=sys.stderr)
        return 1
    with contextlib.suppress(FileNotFoundError):
        (pipe_dir / SOCKET_NAME).unlink()
    (pipe_dir / LOCK_FILE).touch()
    os.chmod(pipe_dir / LOCK_FILE, 0o666)
    # Bind before forking so that a failure is reported to the caller; bind with a relative name (the length
    # limit the real tool has is MAX_PIPE_DIR_CHARS, checked above).
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cwd = os.getcwd()
    os.chdir(pipe_dir)
    try:
        listener.bind(SOCKET_NAME)
        # As a real daemon's (H100, driver 580.159.04): `control` and `control_lock` are 0666, so clients of
        # any uid (a workload image's non-root user) reach the daemon through the mounted pipe directory.
        os.chmod(SOCKET_NAME, 0o666)
    finally:
        os.chdir(cwd)
    listener.listen(64)
    daemon = Daemon(pipe_dir, log_dir, visible, store)
    daemon.multi_user = multi_user
    daemon.thread_percentage = daemon_threads
    if foreground:
        signal.signal(signal.SIGTERM, _exit_on_signal)
        _daemon_main(listener, None, daemon)
        return 0
    read_end, write_end = os.pipe()
    if os.fork() > 0:  # the caller's process: wait until the daemon has written its pid, then return
        os.close(write_end)
        listener.close()
        ready = os.read(read_end, 16)
        os.close(read_end)
        return 0 if ready else 1
    os.close(read_end)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    _daemon_main(listener, write_end, daemon)
    os._exit(0)


def _pid_file_wanted() -> bool:
    return os.environ.get(PID_FILE_ENV, "1").strip().lower() not in ("0", "false", "no")


def _daemon_main(listener: socket.socket, ready_fd: int | None, daemon: Daemon) -> None:
    os.chdir("/")
    signal.signal(signal.SIGTERM, _exit_on_signal)
    pid = os.getpid()
    pid_file = _pid_file_wanted()
    if pid_file:
        (daemon.pipe_dir / PID_FILE).write_text(f"{pid}\n")
    daemon.log(f"Starting control daemon pid {pid} for devices {','.join(daemon.visible)}")
    st = os.stat(daemon.pipe_dir)
    key = mps_records.pipe_dir_key(daemon.pipe_dir)
    alive_fd = mps_records.hold_alive_lock(daemon.driver_root, key) if daemon.store is not None else None
    daemon.record(
        key=key,
        pipe_dir_id={"dev": st.st_dev, "ino": st.st_ino},
        pid=pid,
        running=True,
        started=time.time(),
        stopped=None,
        visible_devices=daemon.visible,
        multi_user=daemon.multi_user,
        pid_file=pid_file,
        pipe_dir=str(daemon.pipe_dir),
        log_dir=str(daemon.log_dir),
        commands=[],
    )
    if ready_fd is not None:
        os.write(ready_fd, b"1")
        os.close(ready_fd)
    try:
        daemon.serve(listener)
    except Exception as err:  # stdout/stderr are /dev/null: the log is the only place to say why
        daemon.log(f"Control daemon failed: {err!r}")
        raise
    finally:
        listener.close()
        with contextlib.suppress(Exception):
            daemon.end_all_servers()  # its servers end with it (their contexts leave the GPUs)
        with contextlib.suppress(FileNotFoundError):
            (daemon.pipe_dir / SOCKET_NAME).unlink()
        if pid_file:
            with contextlib.suppress(FileNotFoundError):
                (daemon.pipe_dir / PID_FILE).unlink()
        daemon.log("Shutting down control daemon")
        daemon.record(running=False, stopped=time.time())
        if alive_fd is not None:
            os.close(alive_fd)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(0)  # unwinds through _daemon_main's cleanup (servers, socket, pid file, record)


def connect(pipe_dir: Path) -> socket.socket:
    """A connection to the control daemon of `pipe_dir` (OSError when none listens there)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cwd = os.getcwd()
    try:
        os.chdir(pipe_dir)
        conn.connect(SOCKET_NAME)
    except OSError:
        conn.close()
        raise
    finally:
        os.chdir(cwd)
    return conn


def _answers(pipe_dir: Path) -> bool:
    try:
        with connect(pipe_dir) as conn:
            conn.sendall(b"get_server_list\n")
            conn.settimeout(2)
            conn.recv(4096)
        return True
    except OSError:
        return False


def run_client(lines: Iterable[str]) -> int:
    """One control session (a "UI" in the daemon's log): every stdin line as a command, in order.

    A real control daemon serves one UI at a time; a second one fails at once with "Cannot send command to MPS
    control daemon process" and exit status 1, also while the first only holds its stdin open (seen on an
    H100, driver 580.159.04: 15 of 20 concurrent `echo get_server_list | nvidia-cuda-mps-control` failed so).
    The simulated session holds an exclusive lock on the pipe directory's `control_lock` to do the same."""
    pipe_dir, _ = _dirs()
    try:
        lock = open(pipe_dir / LOCK_FILE, "rb")  # noqa: SIM115 (held for the whole session)
    except OSError:
        print(NOT_RUNNING_MESSAGE, file=sys.stderr)
        return 1
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(BUSY_MESSAGE, file=sys.stderr)
            return 1
        status = 0
        for line in lines:
            if not line.strip():
                continue
            try:
                conn = connect(pipe_dir)
            except OSError:
                print(NOT_RUNNING_MESSAGE, file=sys.stderr)
                return 1
            with conn:
                conn.settimeout(10)
                conn.sendall(line.strip().encode() + b"\n")
                reply = b""
                while chunk := conn.recv(4096):
                    reply += chunk
            failed = reply.endswith(b"\x00")
            text = reply.rstrip(b"\x00").decode(errors="replace")
            (sys.stderr if failed else sys.stdout).write(text)
            sys.stdout.flush()
            status = 1 if failed else status
        return status


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-d", "-f") and set(args[1:]) <= {"-M"} and len(args) <= 2:
        return start_daemon(foreground=args[0] == "-f", multi_user="-M" in args)
    if args:
        print("usage: nvidia-cuda-mps-control -d|-f [-M]   (commands on stdin otherwise)", file=sys.stderr)
        return 2
    return run_client(sys.stdin)


if __name__ == "__main__":
    sys.exit(main())
