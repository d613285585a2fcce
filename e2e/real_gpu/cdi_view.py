"""A claim's container view from the CDI spec the kubelet plugin wrote (pure, apart from `read_spec`).

`view_plan(spec, cdi_ids, exists)` turns a CDI spec (JSON) and the CDI device ids NodePrepareResources
answered into what a container runtime would apply: the environment (spec-level edits, then each named
device's, later entries winning as in CDI), the bind mounts in order, the device nodes and the hooks.
`namespace_script(plan)` is the shell that applies the mounts in a private mount namespace
(`unshare --mount --propagation private sh -c SCRIPT ...`) and then runs the client, as root or as another
uid (setpriv). What it does not do, said in the plan: no hooks are run (nvidia-cdi-hook's symlinks and
ldcache), no device cgroup (every host device node stays reachable), no new root file system: the host's
files are the container's apart from the mounts.

A target that is missing on the host is created only when it is a directory whose parent exists (the MPS pipe
directory `/tmp/nvidia-mps`); the plan lists those (`create_dirs`) for the caller to make and remove again.
Any other missing target (a driver library a host does not have at that path) is skipped and listed.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any


@dataclass(frozen=True)
class BindMount:
    source: str
    target: str
    read_only: bool


@dataclass
class ViewPlan:
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[BindMount] = field(default_factory=list)
    create_dirs: list[str] = field(default_factory=list)  # missing directory targets the caller creates
    skipped: list[str] = field(default_factory=list)  # "target: why", mounts not applied
    device_nodes: list[str] = field(default_factory=list)
    hooks: list[str] = field(default_factory=list)  # "hookName: path args...", not run

    def to_json(self) -> dict[str, Any]:
        return {
            "env": self.env,
            "mounts": [
                {"source": m.source, "target": m.target, "readOnly": m.read_only} for m in self.mounts
            ],
            "createDirs": self.create_dirs,
            "skipped": self.skipped,
            "deviceNodes": self.device_nodes,
            "hooks": self.hooks,
        }


class CdiViewError(ValueError):
    pass


def read_spec(path: Path) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(path.read_text())
    return spec


def split_cdi_id(cdi_id: str) -> tuple[str, str]:
    """("vendor/class", name) of a fully qualified CDI device id `vendor/class=name`."""
    kind, sep, name = cdi_id.partition("=")
    if not sep or "/" not in kind or not name:
        raise CdiViewError(f"not a qualified CDI device id: {cdi_id!r}")
    return kind, name


def _edits_of(spec: Mapping[str, Any], cdi_ids: Sequence[str]) -> list[Mapping[str, Any]]:
    kind = spec.get("kind")
    devices = {d.get("name"): d for d in spec.get("devices") or ()}
    edits: list[Mapping[str, Any]] = [spec.get("containerEdits") or {}]
    for cdi_id in cdi_ids:
        id_kind, name = split_cdi_id(cdi_id)
        if id_kind != kind:
            raise CdiViewError(f"{cdi_id}: the spec is of kind {kind!r}")
        if name not in devices:
            raise CdiViewError(f"{cdi_id}: no device {name!r} in the spec ({sorted(devices)})")
        edits.append(devices[name].get("containerEdits") or {})
    return edits


def _env(entries: Iterable[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key:
            raise CdiViewError(f"env entry without '=': {entry!r}")
        env[key] = value
    return env


def view_plan(
    spec: Mapping[str, Any], cdi_ids: Sequence[str], exists: Callable[[str], str | None]
) -> ViewPlan:
    """The container view of `cdi_ids` in `spec`. `exists(path)` says what is at a host path: "dir", "file"
    (anything else that is not a directory) or None."""
    plan = ViewPlan()
    by_target: dict[str, BindMount] = {}
    seen_nodes: dict[str, None] = {}
    for edits in _edits_of(spec, cdi_ids):
        plan.env.update(_env(edits.get("env") or ()))
        for node in edits.get("deviceNodes") or ():
            seen_nodes[str(node["path"])] = None
        for mount in edits.get("mounts") or ():
            options = list(mount.get("options") or ())
            target = str(PurePosixPath(mount["containerPath"]))
            by_target.pop(target, None)  # a later edit of the same path replaces it (and goes after)
            by_target[target] = BindMount(str(mount["hostPath"]), target, "ro" in options)
        for hook in edits.get("hooks") or ():
            plan.hooks.append(
                " ".join([f"{hook.get('hookName')}:", str(hook.get("path")), *hook.get("args", [])])
            )
    plan.device_nodes = list(seen_nodes)
    for mount in by_target.values():
        source_kind = exists(mount.source)
        if source_kind is None:
            plan.skipped.append(f"{mount.target}: source {mount.source} missing")
            continue
        target_kind = exists(mount.target)
        if target_kind is None:
            parent = str(PurePosixPath(mount.target).parent)
            if source_kind == "dir" and exists(parent) == "dir":
                plan.create_dirs.append(mount.target)
            else:
                plan.skipped.append(f"{mount.target}: missing on this host")
                continue
        elif target_kind != source_kind:
            plan.skipped.append(f"{mount.target}: a {target_kind} here, the source is a {source_kind}")
            continue
        plan.mounts.append(mount)
    return plan


def host_kind(path: str) -> str | None:
    """`exists` for `view_plan` on this host."""
    p = Path(path)
    if p.is_dir():
        return "dir"
    return "file" if p.exists() else None


# The script's positional parameters: $1 = uid to run the client as (0: stay root), then the client's argv.
def namespace_script(plan: ViewPlan) -> str:
    """Shell run as `unshare --mount --propagation private sh -c SCRIPT sh UID CMD...`: bind the plan's mounts
    (read-only ones remounted read-only), then exec the client, as root or as UID through setpriv."""
    lines = ["set -e"]
    for m in plan.mounts:
        source, target = shlex.quote(m.source), shlex.quote(m.target)
        lines.append(f"mount --bind {source} {target}")
        if m.read_only:
            lines.append(f"mount -o remount,bind,ro {target}")
    lines += [
        'uid="$1"; shift',
        'if [ "$uid" = 0 ]; then exec "$@"; fi',
        'exec setpriv --reuid "$uid" --regid "$uid" --clear-groups "$@"',
    ]
    return "\n".join(lines)


def namespace_command(plan: ViewPlan, uid: int, argv: Sequence[str]) -> list[str]:
    """The full command line: a private mount namespace with the plan applied, then `argv` as `uid`."""
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        namespace_script(plan),
        "sh",
        str(uid),
        *argv,
    ]
