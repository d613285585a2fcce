"""NVIDIA's own chart values (tests/deploy/data/nvidia-values.yaml, copied from its repository) against
ours: every key is accepted by values.schema.json; the keys of the plugin DaemonSet (featureGates,
logVerbosity, resources, kubeletPlugin.*) work as in NVIDIA's chart or are refused at install with a message
that names the value and the fix (the top-level and webhook keys: test_nvidia_chart_keys.py); the two with
nothing to act on here are named at install (NOTES.txt) instead of being silently dropped."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from .manifest_walk import REPO
from .test_chart import CHART, KUBE_VERSION, NAMESPACE, _render_chart, _run_helm, helm  # noqa: F401  (helm: fixture)

NVIDIA_VALUES = Path(__file__).parent / "data" / "nvidia-values.yaml"
# NVIDIA's values.yaml turns its ComputeDomain components on, which dra-gpu refuses with a message (below).
WITHOUT_COMPUTE_DOMAINS = ("--set", "resources.computeDomains.enabled=false")
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
IGNORED_MARK = "NVIDIA chart key without effect in dra-gpu"


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


def test_nvidias_values_as_they_are_are_refused_for_compute_domains(helm: str) -> None:  # noqa: F811
    out = _run_helm(
        helm, "template", "dra-gpu", str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION,
        "-f", str(NVIDIA_VALUES),
    )  # fmt: skip
    assert out.returncode != 0
    assert "resources.computeDomains.enabled=true: ComputeDomains" in out.stderr
    assert "set resources.computeDomains.enabled=false" in out.stderr


def test_chart_renders_with_nvidias_values(helm: str) -> None:  # noqa: F811
    out = _run_helm(
        helm, "template", "dra-gpu", str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION,
        "-f", str(NVIDIA_VALUES), *WITHOUT_COMPUTE_DOMAINS,
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
    # NVIDIA's values that now work: log verbosity, the health port of its gpus container, its update strategy
    assert env["LOG_VERBOSITY"] == "4" and env["HEALTHCHECK_PORT"] == "51516"
    assert pod["containers"][0]["livenessProbe"]["grpc"]["port"] == 51516
    assert daemonset["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "100%"},
    }
    assert env["HTTP_ENDPOINT"] == ":8080" and env["METRICS_PATH"] == "/metrics"
    # NVIDIA's default: no webhook.
    assert not [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]


def test_install_notes_name_the_ignored_nvidia_keys(helm: str, tmp_path: Path) -> None:  # noqa: F811
    def notes(*args: str) -> str:
        out = _run_helm(
            helm, "install", "dra-gpu", str(CHART), "--dry-run=client", "--namespace", NAMESPACE, *args,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return out.stdout.split("NOTES:", 1)[1]

    def listed(text: str) -> list[str]:
        assert "Ignored values" in text, text
        return text.split('"Coming from NVIDIA\'s chart"):', 1)[1].replace(",", " ").split()

    with_nvidia = notes("-f", str(NVIDIA_VALUES), *WITHOUT_COMPUTE_DOMAINS)
    # Only the two keys with nothing to act on; the rest of NVIDIA's keys work (or are refused).
    assert listed(with_nvidia) == ["gpuResourcesEnabledOverride", "controller"]
    assert "Ignored values" not in notes()  # our own defaults: nothing to report
    one = tmp_path / "one.yaml"
    one.write_text("gpuResourcesEnabledOverride: true\nnamespaceOverride: other\n")
    assert listed(notes("-f", str(one))) == ["gpuResourcesEnabledOverride"]


@pytest.mark.parametrize("bad", ["logVerbosity=[1]", "controller=3"])
def test_ignored_keys_still_reject_wrong_types(helm: str, bad: str) -> None:  # noqa: F811
    key, _, raw = bad.partition("=")
    out = _run_helm(
        helm, "template", "dra-gpu", str(CHART), "--kube-version", KUBE_VERSION, "--set-json", f"{key}={raw}"
    )
    assert out.returncode != 0 and key in out.stderr, out.stderr


def test_repo_docs_mention_nvidia_values() -> None:
    assert "nvidia-values.yaml" in (REPO / "docs" / "install.md").read_text()


# ------------------------------------------ NVIDIA's DaemonSet keys: each works, or is refused with a message


def _plugin(helm: str, *args: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:  # noqa: F811
    """(DaemonSet, its pod spec, the plugin container's env by name) rendered with `args`."""
    out = _render_chart(helm, *args)
    assert out.returncode == 0, out.stderr
    daemonset = next(d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    return daemonset, pod, {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}


def test_feature_gates_and_log_verbosity_reach_the_plugin(helm: str) -> None:  # noqa: F811
    _ds, _pod, env = _plugin(helm)
    assert "FEATURE_GATES" not in env and "LOG_VERBOSITY" not in env  # our defaults: the plugin's own
    _ds, _pod, env = _plugin(
        helm, "--set-json", 'featureGates={"MPSSupport":false,"DynamicMIG":false}', "--set", "logVerbosity=6"
    )
    assert (
        env["FEATURE_GATES"] == "DynamicMIG=false,MPSSupport=false,"
    )  # NVIDIA's rendering; the plugin parses it
    assert env["LOG_VERBOSITY"] == "6"
    from dra_gpu.cli.feature_gates import parse_feature_gates

    assert parse_feature_gates(env["FEATURE_GATES"])["MPSSupport"] is False


def test_chart_knows_the_plugins_gates() -> None:
    from dra_gpu.cli.feature_gates import GATES, GateKind

    template = (CHART / "templates" / "kubelet-plugin-daemonset.yaml").read_text()
    known = re.search(r"\$knownGates := list ((?:\"[^\"]+\" ?)+)", template)
    unsupported = re.search(r"\$unsupportedGates := dict (.*) -\}\}", template)
    assert known and unsupported
    assert set(re.findall(r'"([^"]+)"', known.group(1))) == set(GATES)
    assert set(re.findall(r'"([A-Za-z]+)" "', unsupported.group(1))) == {
        name for name, gate in GATES.items() if gate.kind is GateKind.UNSUPPORTED
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "featureGates.NoSuchGate=true"], "featureGates.NoSuchGate: unknown feature gate; known"),
        (["--set", "featureGates.PassthroughSupport=true"], "featureGates.PassthroughSupport=true: VFIO"),
        (["--set", "featureGates.FabricManagerPartitioning=true"], "remove it or set it to false"),
        (
            ["--set", "featureGates.ConsumableShares=false", "--set", "consumableShares=memory"],
            "consumableShares=memory requires featureGates.ConsumableShares",
        ),
        (["--set", "resources.gpus.enabled=false"], "resources.gpus.enabled=false: dra-gpu's kubelet plugin"),
        (["--set", "resources.computeDomains.enabled=true"], "ComputeDomains (IMEX channels"),
        (
            ["--set", "kubeletPlugin.containers.gpus.securityContext.privileged=false"],
            "securityContext.privileged=false: the plugin needs a privileged container",
        ),
        (
            ["--set", "kubeletPlugin.containers.init.resources.limits.memory=1Gi"],
            "kubeletPlugin.containers.init.resources: dra-gpu's plugin pod has no init container",
        ),
        (["--set", "featureGates.MPSSupport=maybe"], "featureGates/MPSSupport"),  # the schema: a boolean
        (["--set", "logVerbosity=high"], "logVerbosity"),
        (["--set", "kubeletPlugin.metrics.gpuHttpEndpoint=8080"], "gpuHttpEndpoint"),
    ],
)
def test_nvidia_keys_that_cannot_work_are_refused_with_a_message(
    helm: str,  # noqa: F811
    args: list[str],
    message: str,
) -> None:
    out = _render_chart(helm, *args)
    assert out.returncode != 0 and message in out.stderr, out.stderr


def test_nvidia_gates_of_features_we_lack_are_accepted_when_off(helm: str) -> None:  # noqa: F811
    gates = '{"PassthroughSupport":false,"IMEXDaemonsWithDNSNames":true,"ContextualLogging":true}'
    _ds, _pod, env = _plugin(helm, "--set-json", f"featureGates={gates}")
    assert (
        env["FEATURE_GATES"]
        == "ContextualLogging=true,IMEXDaemonsWithDNSNames=true,PassthroughSupport=false,"
    )


def test_kubelet_directories_follow_nvidias_paths(helm: str) -> None:  # noqa: F811
    _ds, pod, env = _plugin(
        helm,
        "--set", "kubeletPlugin.kubeletRegistrarDirectoryPath=/var/lib/k0s/kubelet/plugins_registry",
        "--set", "kubeletPlugin.kubeletPluginsDirectoryPath=/var/lib/k0s/kubelet/plugins",
    )  # fmt: skip
    assert env["KUBELET_REGISTRAR_DIRECTORY_PATH"] == "/var/lib/k0s/kubelet/plugins_registry"
    assert env["KUBELET_PLUGINS_DIRECTORY_PATH"] == "/var/lib/k0s/kubelet/plugins"
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    paths = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
    for name, path in (
        ("plugins-registry", "/var/lib/k0s/kubelet/plugins_registry"),
        ("plugins", "/var/lib/k0s/kubelet/plugins"),
    ):
        assert mounts[name] == path and paths[name] == path
    _ds, _pod, env = _plugin(helm, "--set", "kubeletDir=/data/kubelet")  # without them: below kubeletDir
    assert env["KUBELET_PLUGINS_DIRECTORY_PATH"] == "/data/kubelet/plugins"


def test_metrics_values(helm: str) -> None:  # noqa: F811
    _ds, pod, env = _plugin(
        helm,
        "--set", "kubeletPlugin.metrics.gpuHttpEndpoint=:9400",
        "--set", "kubeletPlugin.metrics.metricsPath=/prom",
    )  # fmt: skip
    assert env["HTTP_ENDPOINT"] == ":9400" and env["METRICS_PATH"] == "/prom"
    assert {"name": "http", "containerPort": 9400, "protocol": "TCP"} in pod["containers"][0]["ports"]
    _ds, pod, env = _plugin(helm, "--set", "kubeletPlugin.metrics.enabled=false")
    assert "HTTP_ENDPOINT" not in env
    assert [p["name"] for p in pod["containers"][0]["ports"]] == ["health"]


def test_gpus_container_values(helm: str) -> None:  # noqa: F811
    _ds, pod, env = _plugin(
        helm,
        "--set-json", 'kubeletPlugin.containers.gpus.env=[{"name":"EXTRA","value":"1"}]',
        "--set", "kubeletPlugin.containers.gpus.resources.limits.memory=2Gi",
        "--set", "kubeletPlugin.containers.gpus.securityContext.readOnlyRootFilesystem=true",
        "--set", "kubeletPlugin.containers.gpus.healthcheckPort=51600",
    )  # fmt: skip
    container = pod["containers"][0]
    assert env["EXTRA"] == "1"
    assert container["resources"] == {"limits": {"memory": "2Gi"}}
    assert container["securityContext"] == {
        "privileged": True,
        "runAsUser": 0,
        "readOnlyRootFilesystem": True,
    }
    assert env["HEALTHCHECK_PORT"] == "51600" and container["readinessProbe"]["grpc"]["port"] == 51600
    _ds, pod, env = _plugin(helm, "--set", "kubeletPlugin.containers.gpus.healthcheckPort=-1")
    container = pod["containers"][0]
    assert env["HEALTHCHECK_PORT"] == "-1"
    assert not {"startupProbe", "livenessProbe", "readinessProbe"} & set(container)
    assert "health" not in [p["name"] for p in container["ports"]]


def test_pod_values_and_network_policy(helm: str) -> None:  # noqa: F811
    daemonset, pod, env = _plugin(
        helm,
        "--set", "kubeletPlugin.podSecurityContext.fsGroup=0",
        "--set", "kubeletPlugin.updateStrategy.type=OnDelete",
        "--set", "kubeletPlugin.kubeApiQps=50",
        "--set", "kubeletPlugin.kubeApiBurst=100",
    )  # fmt: skip
    assert pod["securityContext"] == {"fsGroup": 0}
    assert daemonset["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert (env["KUBE_API_QPS"], env["KUBE_API_BURST"]) == ("50", "100")
    out = _render_chart(helm, "--set", "kubeletPlugin.networkPolicy.enabled=true")
    assert out.returncode == 0, out.stderr
    (policy,) = [
        d
        for d in yaml.safe_load_all(out.stdout)
        if d
        and d["kind"] == "NetworkPolicy"
        and d["spec"]["podSelector"]["matchLabels"].get("app.kubernetes.io/component") == "kubelet-plugin"
    ]
    assert policy["spec"]["policyTypes"] == ["Egress"]
    assert [p["port"] for p in policy["spec"]["egress"][0]["ports"]] == [443, 6443]
