"""NVIDIA's own chart values (tests/deploy/data/nvidia-values.yaml, copied from its repository) against
ours: every key is accepted by values.schema.json, the chart renders with them, and the keys dra-gpu does not
use are named as ignored at install (NOTES.txt) instead of being silently dropped."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from .manifest_walk import REPO
from .test_chart import CHART, KUBE_VERSION, NAMESPACE, _run_helm, helm  # noqa: F401  (helm: fixture)

NVIDIA_VALUES = Path(__file__).parent / "data" / "nvidia-values.yaml"
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
IGNORED_MARK = "NVIDIA chart key, accepted and ignored by dra-gpu"


def _key_paths(values: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """(path, schema entry or None) per key of `values`, descending while our schema lists properties."""
    found: list[tuple[str, Any]] = []
    properties = schema.get("properties")
    for key, value in values.items():
        path = prefix + key
        entry = None if properties is None else properties.get(key)
        found.append((path, entry))
        if isinstance(value, dict) and entry is not None and entry.get("properties") is not None:
            found += _key_paths(value, entry, path + ".")
    return found


def _ignored_in_schema(schema: dict[str, Any], prefix: str = "") -> set[str]:
    paths: set[str] = set()
    for key, entry in (schema.get("properties") or {}).items():
        if IGNORED_MARK in str(entry.get("description", "")):
            paths.add(prefix + key)
        paths |= _ignored_in_schema(entry, prefix + key + ".")
    return paths


def _notes_ignored_list() -> list[str]:
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    match = re.search(r"\$ignoredKeys := list ((?:\"[^\"]+\" ?)+)", notes)
    assert match, "NOTES.txt has no $ignoredKeys list"
    return re.findall(r'"([^"]+)"', match.group(1))


def test_nvidia_values_file_is_the_copied_chart_values() -> None:
    text = NVIDIA_VALUES.read_text()
    assert "Apache License, Version 2.0" in text and "kubernetes-sigs/dra-driver-nvidia-gpu" in text
    values = yaml.safe_load(text)
    assert {"nvidiaDriverRoot", "kubeletPlugin", "webhook", "controller"} <= set(values)


def test_every_nvidia_key_is_in_our_schema() -> None:
    values = yaml.safe_load(NVIDIA_VALUES.read_text())
    missing = []
    for path, entry in _key_paths(values, SCHEMA):
        parent = path.rpartition(".")[0]
        parent_entry = SCHEMA if not parent else dict(_key_paths(values, SCHEMA)).get(parent)
        closed = parent_entry is not None and parent_entry.get("additionalProperties") is False
        if entry is None and closed:
            missing.append(path)
    assert not missing, f"values.schema.json rejects NVIDIA chart keys: {missing}"


def test_ignored_keys_in_schema_and_notes_agree() -> None:
    assert set(_notes_ignored_list()) == _ignored_in_schema(SCHEMA)


def test_chart_renders_with_nvidias_values(helm: str) -> None:  # noqa: F811
    out = _run_helm(
        helm, "template", "dra-gpu", str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION,
        "-f", str(NVIDIA_VALUES),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    # Honoured: NVIDIA's node affinity (NFD PCI labels or the GPU Operator's label), tolerations, driver root.
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    keys = {e["key"] for t in terms for e in t["matchExpressions"]}
    assert {"feature.node.kubernetes.io/pci-10de.present", "nvidia.com/gpu.present"} <= keys
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["NVIDIA_DRIVER_ROOT"] == "/"
    # NVIDIA's default: no webhook.
    assert not [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]


def test_install_notes_name_the_ignored_nvidia_keys(helm: str, tmp_path: Path) -> None:  # noqa: F811
    def notes(*args: str) -> str:
        out = _run_helm(
            helm, "install", "dra-gpu", str(CHART), "--dry-run=client", "--namespace", NAMESPACE, *args,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return out.stdout.split("NOTES:", 1)[1]

    with_nvidia = notes("-f", str(NVIDIA_VALUES))
    assert "Ignored values" in with_nvidia
    listed = with_nvidia.split("equivalents):", 1)[1]
    for key in (
        "controller",
        "logVerbosity",
        "featureGates",
        "kubeletPlugin.containers",
        "webhook.servicePort",
    ):
        assert re.search(rf"(^|[\s,]){re.escape(key)}(,|$|\s)", listed), f"{key} not reported: {listed}"
    assert "Ignored values" not in notes()  # our own defaults: nothing to report
    one = tmp_path / "one.yaml"
    one.write_text("logVerbosity: '6'\n")
    assert notes("-f", str(one)).split("equivalents):", 1)[1].split() == ["logVerbosity"]


@pytest.mark.parametrize("bad", ["logVerbosity=[1]", "controller=3"])
def test_ignored_keys_still_reject_wrong_types(helm: str, bad: str) -> None:  # noqa: F811
    key, _, raw = bad.partition("=")
    out = _run_helm(
        helm, "template", "dra-gpu", str(CHART), "--kube-version", KUBE_VERSION, "--set-json", f"{key}={raw}"
    )
    assert out.returncode != 0 and key in out.stderr, out.stderr


def test_repo_docs_mention_nvidia_values() -> None:
    assert "nvidia-values.yaml" in (REPO / "docs" / "install.md").read_text()
