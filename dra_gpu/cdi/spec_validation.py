"""Check a CDI spec against the rules of the CDI specification before a runtime sees it (pure).

Covers what container runtimes reject at container creation: the version, the kind (`vendor/class`), device
names, and the shape of the container edits (absolute paths, `KEY=VALUE` env, known hook names, no device
without edits). Each problem is reported with its JSON path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

KNOWN_CDI_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
DEVICE_NODE_TYPES = ("", "b", "c", "u", "p")

_VENDOR_RE = re.compile(r"^[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_CLASS_RE = re.compile(r"^[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_DEVICE_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_ENV_KEY_RE = re.compile(r"^[^=\x00]+$")


class CdiSpecError(ValueError):
    """The spec breaks a CDI rule; the message lists every problem with its path."""


def _check_edits(edits: Any, where: str, problems: list[str]) -> bool:
    """Append problems; return whether the edits contain anything."""
    if edits is None:
        return False
    if not isinstance(edits, Mapping):
        problems.append(f"{where}: must be an object")
        return False
    known = {"env", "deviceNodes", "mounts", "hooks", "additionalGids", "intelRdt", "netDevices"}
    for key in edits:
        if key not in known:
            problems.append(f"{where}.{key}: unknown field")
    for i, entry in enumerate(edits.get("env") or ()):
        if not isinstance(entry, str) or "=" not in entry or not _ENV_KEY_RE.match(entry.split("=", 1)[0]):
            problems.append(f"{where}.env[{i}]: {entry!r} is not KEY=VALUE")
    for i, node in enumerate(edits.get("deviceNodes") or ()):
        path = node.get("path") if isinstance(node, Mapping) else None
        if not isinstance(path, str) or not path.startswith("/"):
            problems.append(f"{where}.deviceNodes[{i}].path: {path!r} must be an absolute path")
        host = node.get("hostPath") if isinstance(node, Mapping) else None
        if host is not None and (not isinstance(host, str) or not host.startswith("/")):
            problems.append(f"{where}.deviceNodes[{i}].hostPath: {host!r} must be an absolute path")
        node_type = node.get("type", "") if isinstance(node, Mapping) else ""
        if node_type not in DEVICE_NODE_TYPES:
            problems.append(f"{where}.deviceNodes[{i}].type: {node_type!r} is not one of b, c, u, p")
    for i, mount in enumerate(edits.get("mounts") or ()):
        if not isinstance(mount, Mapping):
            problems.append(f"{where}.mounts[{i}]: must be an object")
            continue
        for key in ("hostPath", "containerPath"):
            value = mount.get(key)
            if not isinstance(value, str) or not value.startswith("/"):
                problems.append(f"{where}.mounts[{i}].{key}: {value!r} must be an absolute path")
    for i, hook in enumerate(edits.get("hooks") or ()):
        name = hook.get("hookName") if isinstance(hook, Mapping) else None
        if name not in HOOK_NAMES:
            problems.append(f"{where}.hooks[{i}].hookName: {name!r} is not one of {', '.join(HOOK_NAMES)}")
        path = hook.get("path") if isinstance(hook, Mapping) else None
        if not isinstance(path, str) or not path.startswith("/"):
            problems.append(f"{where}.hooks[{i}].path: {path!r} must be an absolute path")
    return any(edits.get(k) for k in known)


def spec_problems(spec: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    version = spec.get("cdiVersion")
    if version not in KNOWN_CDI_VERSIONS:
        problems.append(f"cdiVersion: {version!r} is not one of {', '.join(KNOWN_CDI_VERSIONS)}")
    kind = spec.get("kind")
    vendor, _, cdi_class = kind.partition("/") if isinstance(kind, str) else ("", "", "")
    if not _VENDOR_RE.match(vendor) or not _CLASS_RE.match(cdi_class):
        problems.append(
            f"kind: {kind!r} must be <vendor>/<class>, each starting with a letter, ending with a letter or "
            "digit, containing letters, digits, '-', '_' and '.'"
        )
    devices = spec.get("devices")
    if not isinstance(devices, Sequence) or not devices:
        problems.append("devices: at least one device is required")
        devices = []
    seen: set[str] = set()
    for i, device in enumerate(devices):
        name = device.get("name") if isinstance(device, Mapping) else None
        if not isinstance(name, str) or not _DEVICE_NAME_RE.match(name):
            problems.append(
                f"devices[{i}].name: {name!r} must start and end with a letter or digit and contain only "
                "letters, digits, '-', '_', '.' and ':'"
            )
        elif name in seen:
            problems.append(f"devices[{i}].name: {name!r} is used twice")
        else:
            seen.add(name)
        edits = device.get("containerEdits") if isinstance(device, Mapping) else None
        if not _check_edits(edits, f"devices[{i}].containerEdits", problems):
            problems.append(f"devices[{i}].containerEdits: a device needs at least one edit")
    _check_edits(spec.get("containerEdits"), "containerEdits", problems)
    return problems


def validate_spec(spec: Mapping[str, Any]) -> None:
    problems = spec_problems(spec)
    if problems:
        raise CdiSpecError("invalid CDI spec: " + "; ".join(problems))
