"""A simulated MPS client: what limits a CUDA process with this environment would get from the MPS server.

    python -m dra_gpu.hardware.sim_tools.mps_client     (env: CUDA_MPS_PIPE_DIRECTORY and, optionally, the
                                                          client's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
                                                          CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)

prints JSON `{"activeThreadPercentage": N, "pinnedDeviceMemoryLimits": {"<uuid>": "<N>M" | null}}`.

It models what NVIDIA's MPS documentation says, not what would be convenient: the control daemon's defaults
(`set_default_active_thread_percentage`, `set_default_device_pinned_mem_limit`) are a ceiling; a client's own
environment "will only further constrain the limit set by the control daemon ... if the control daemon has a
lower setting, the control daemon setting is obeyed" (MPS docs 4.2.5 / 4.2.7). So a client gets
min(daemon, env) for each limit, and a tenant that sets 100 in its container still gets its share.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from dra_gpu.hardware.sim_tools.mps_control import (
    DEFAULT_PIPE_DIR,
    SOCKET_NAME,
    CommandError,
    _connect,
    mib,
    parse_pinned_env,
)


class ClientError(CommandError):
    pass


def effective_limits(
    daemon_thread: int | None,
    daemon_pinned: Mapping[str, int | None],
    env: Mapping[str, str],
) -> dict[str, object]:
    """The limits a client gets: for each, the lower of the daemon's and the client's own (env) setting."""
    thread = 100 if daemon_thread is None else daemon_thread
    own = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    if own is not None and own.strip():
        if not own.strip().isdigit() or not 0 <= int(own) <= 100:
            raise ClientError(f"invalid CUDA_MPS_ACTIVE_THREAD_PERCENTAGE {own!r}: expected 0..100")
        thread = min(thread, int(own))
    visible = list(daemon_pinned)
    own_pinned = parse_pinned_env(env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", ""), visible)
    pinned: dict[str, str | None] = {}
    for uuid, daemon_mib in daemon_pinned.items():
        candidates = [v for v in (daemon_mib, own_pinned.get(uuid)) if v is not None]
        pinned[uuid] = f"{min(candidates)}M" if candidates else None
    return {"activeThreadPercentage": thread, "pinnedDeviceMemoryLimits": pinned}


def _ask(pipe_dir: Path, line: str) -> str:
    try:
        conn = _connect(pipe_dir)
    except OSError:
        raise ClientError(f"no MPS control daemon at {pipe_dir}/{SOCKET_NAME}") from None
    with conn:
        conn.settimeout(10)
        conn.sendall(line.encode() + b"\n")
        reply = b""
        while chunk := conn.recv(4096):
            reply += chunk
    if reply.endswith(b"\x00"):
        raise ClientError(reply.rstrip(b"\x00").decode(errors="replace").strip())
    return reply.decode(errors="replace").strip()


def query(env: Mapping[str, str]) -> dict[str, object]:
    """Ask the daemon at the client's pipe directory for its defaults, then apply the client's env."""
    pipe_dir = Path(env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR)
    visible = json.loads(_ask(pipe_dir, "sim_get_visible_devices") or "[]")
    thread_text = _ask(pipe_dir, "get_default_active_thread_percentage")
    daemon_pinned: dict[str, int | None] = {}
    for uuid in visible:
        value = _ask(pipe_dir, f"get_default_device_pinned_mem_limit {uuid}")
        daemon_pinned[uuid] = None if value in ("", "0") else mib(value)
    return effective_limits(round(float(thread_text)), daemon_pinned, env)


def main(argv: Sequence[str] | None = None) -> int:
    if list(sys.argv[1:] if argv is None else argv):
        print(
            "usage: python -m dra_gpu.hardware.sim_tools.mps_client   (reads the client env)", file=sys.stderr
        )
        return 2
    try:
        print(json.dumps(query(os.environ), sort_keys=True))
    except CommandError as err:
        print(f"mps client: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
