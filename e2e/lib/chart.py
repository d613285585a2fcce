"""The Helm chart as the single source of deployment truth: DeviceClasses and the plugin's flags come from it.

Rendering uses the pinned helm (`e2e/cluster/build.sh helm`) when it exists, else the pre-rendered
`manifests/rendered/*.yaml`. The host-process plugin then runs with the chart's own container args, only the
in-container paths swapped for host paths, so the local path and the kind path start the same program.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

from e2e.lib.settings import REPO_ROOT, cluster_bin_dir, pinned_kubernetes_version

CHART_DIR = REPO_ROOT / "manifests" / "helm" / "dra-gpu"
RENDERED_DIR = REPO_ROOT / "manifests" / "rendered"
PLUGIN_CONTAINER_HINTS = ("kubelet-plugin", "plugin", "gpus")


class ChartUnavailableError(RuntimeError):
    pass


def find_helm() -> str | None:
    pinned = cluster_bin_dir() / "helm"
    if pinned.exists():
        return str(pinned)
    return shutil.which("helm")


def load_docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]


def render_chart(
    values: Mapping[str, str] | None = None, namespace: str = "dra-gpu"
) -> tuple[list[dict[str, Any]], str]:
    """(documents, their source). Raises ChartUnavailableError saying what to do when there is no source."""
    helm = find_helm()
    hardware = (values or {}).get("hardware", "real")
    if helm and CHART_DIR.is_dir():
        argv = [
            helm,
            "template",
            "dra-gpu",
            str(CHART_DIR),
            "--namespace",
            namespace,
            "--kube-version",
            pinned_kubernetes_version(),
        ]
        for key, value in (values or {}).items():
            argv += ["--set", f"{key}={value}"]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ChartUnavailableError(f"`{' '.join(argv)}` failed: {proc.stderr.strip()}")
        return load_docs(proc.stdout), f"helm template {CHART_DIR.relative_to(REPO_ROOT)}"
    # Pre-rendered: one file per hardware flavour (render.sh); the simulated one for a simulated node.
    preferred = [RENDERED_DIR / f"dra-gpu-simulated-{hardware}.yaml", RENDERED_DIR / "dra-gpu.yaml"]
    for f in preferred if hardware != "real" else preferred[1:]:
        if f.is_file():
            return load_docs(f.read_text()), str(f.relative_to(REPO_ROOT))
    raise ChartUnavailableError(
        f"no chart to render: build helm with `e2e/cluster/build.sh helm` (chart at {CHART_DIR}) "
        f"or render it into {RENDERED_DIR} with `make manifests`"
    )


def of_kind(docs: Iterable[Mapping[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [dict(d) for d in docs if d.get("kind") == kind]


def plugin_container(docs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The kubelet-plugin container of the chart's DaemonSet."""
    daemonsets = of_kind(docs, "DaemonSet")
    if not daemonsets:
        raise ChartUnavailableError("the rendered chart has no DaemonSet (the kubelet plugin)")
    containers: list[dict[str, Any]] = []
    for ds in daemonsets:
        containers += ds["spec"]["template"]["spec"].get("containers", [])
    for c in containers:
        joined = " ".join([c.get("name", "")] + [str(a) for a in c.get("command", []) + c.get("args", [])])
        if "kubelet-plugin" in joined:
            return c
    for hint in PLUGIN_CONTAINER_HINTS:
        for c in containers:
            if hint in c.get("name", ""):
                return c
    raise ChartUnavailableError(f"no kubelet-plugin container among {[c.get('name') for c in containers]}")


def container_flags(container: Mapping[str, Any]) -> list[str]:
    """The container's command+args from the `kubelet-plugin` word on (the program name stripped)."""
    words = [str(w) for w in list(container.get("command", [])) + list(container.get("args", []))]
    if "kubelet-plugin" in words:
        words = words[words.index("kubelet-plugin") + 1 :]
    return words


def split_flags(words: Sequence[str]) -> list[tuple[str, str | None]]:
    """`--a=1 --b 2 --c` -> [(--a, 1), (--b, 2), (--c, None)]; a value is a word not starting with -."""
    pairs: list[tuple[str, str | None]] = []
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("-"):
            raise ValueError(f"unexpected positional argument {word!r} in the plugin's args {list(words)}")
        if "=" in word:
            flag, value = word.split("=", 1)
            pairs.append((flag, value))
            i += 1
        elif i + 1 < len(words) and not words[i + 1].startswith("-"):
            pairs.append((word, words[i + 1]))
            i += 2
        else:
            pairs.append((word, None))
            i += 1
    return pairs


def host_plugin_flags(chart_words: Sequence[str], overrides: Mapping[str, str]) -> list[str]:
    """The chart's flags with `overrides` (flag -> host value) replacing or adding values, in chart order.

    Values that still reference the pod's environment (`$(NODE_NAME)`) must be overridden: a host process has
    no downward API, so leaving one would start the plugin with a literal `$(...)`.
    """
    out: list[str] = []
    used: set[str] = set()
    for flag, value in split_flags(chart_words):
        if flag in overrides:
            out += [flag, overrides[flag]]
            used.add(flag)
        elif value is None:
            out.append(flag)
        else:
            if "$(" in value:
                raise ValueError(
                    f"chart flag {flag}={value} needs the pod environment; give a host value for {flag}"
                )
            out += [flag, value]
    for flag, value in overrides.items():
        if flag not in used:
            out += [flag, value]
    return out


def host_plugin_env(container: Mapping[str, Any], overrides: Mapping[str, str | None]) -> dict[str, str]:
    """The container's environment for a host process: literal values kept, `overrides` (None drops the
    variable) replacing values; a variable taken from the pod (`valueFrom`) must be overridden, since a host
    process has no downward API."""
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        name = str(item["name"])
        if name in overrides:
            value = overrides[name]
            if value is not None:
                env[name] = value
        elif "value" in item:
            env[name] = str(item["value"])
        else:
            raise ValueError(
                f"chart env {name} comes from {item.get('valueFrom')}; give a host value for {name}"
            )
    for name, value in overrides.items():
        if value is not None and name not in env:
            env[name] = value
    return env
