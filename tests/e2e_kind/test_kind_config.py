"""The kind path's files (e2e/kind/) agree with the local cluster and with the chart.

`make e2e-kind` runs kind for real (e2e/kind/run.sh), but it takes minutes and is not part of `make test`;
these checks keep its files honest between runs: same DRA feature gates as the local cluster, CDI on in
containerd, the GPU node label the chart selects on, one simulated driver root per GPU node, chart values that
exist in the chart and fit its schema.
"""

from __future__ import annotations

import subprocess
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gpu.hardware.loader import PREPARED_SIMULATOR, known_hardware
from e2e.lib.incluster import PLUGIN_SELECTOR
from e2e.lib.settings import DriverMode, load_settings

REPO = Path(__file__).resolve().parents[2]
KIND = REPO / "e2e" / "kind"
CHART = REPO / "manifests" / "helm" / "dra-gpu"


def _cluster_module() -> Any:
    import importlib
    import sys

    sys.path.insert(0, str(REPO / "e2e" / "cluster"))
    try:
        return importlib.import_module("cluster")
    finally:
        sys.path.pop(0)


@pytest.fixture(scope="module")
def kind_config() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((KIND / "cluster.yaml").read_text())
    return data


def test_kind_config_is_a_kind_cluster(kind_config: dict[str, Any]) -> None:
    assert kind_config["kind"] == "Cluster"
    assert kind_config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    roles = [n["role"] for n in kind_config["nodes"]]
    assert roles.count("control-plane") == 1 and "worker" in roles


def _local_gates() -> set[str]:
    return {*_cluster_module().NODE_FEATURE_GATES, "DynamicResourceAllocation"}


def _known_gates() -> set[str] | None:
    """Gates the pinned kube-apiserver knows, or None when it is not built."""
    from tests.support.control_plane import bin_dir, usable_feature_gates

    apiserver = bin_dir() / "kube-apiserver"
    return usable_feature_gates(apiserver) if apiserver.exists() else None


def test_feature_gates_are_the_local_clusters_all_on(kind_config: dict[str, Any]) -> None:
    gates = kind_config["featureGates"]
    extra = sorted(set(gates) - _local_gates())
    assert not extra, f"kind sets gates the local cluster does not: {extra}"
    assert all(v is True for v in gates.values()), gates


def test_feature_gates_are_those_the_pinned_kubernetes_knows(kind_config: dict[str, Any]) -> None:
    """The local cluster passes only the gates a binary knows (a GA gate gets removed, and an unknown gate
    stops the component); kind cannot filter, so the file must hold exactly that intersection."""
    known = _known_gates()
    if known is None:
        pytest.skip("kube-apiserver not built (e2e/cluster/build.sh control-plane)")
    gates = set(kind_config["featureGates"])
    want = _local_gates() & known
    assert gates == want, f"unknown to Kubernetes: {sorted(gates - known)}; missing: {sorted(want - gates)}"


def test_resource_api_v1_is_served(kind_config: dict[str, Any]) -> None:
    assert kind_config["runtimeConfig"]["resource.k8s.io/v1"] == "true"


def test_containerd_reads_cdi_specs_where_the_plugin_writes_them(kind_config: dict[str, Any]) -> None:
    cluster = _cluster_module()
    patches = [tomllib.loads(p) for p in kind_config["containerdConfigPatches"]]
    cri = [
        p["plugins"]["io.containerd.grpc.v1.cri"]
        for p in patches
        if "io.containerd.grpc.v1.cri" in p.get("plugins", {})
    ]
    assert cri and cri[0]["enable_cdi"] is True
    assert tuple(cri[0]["cdi_spec_dirs"]) == tuple(cluster.CDI_DIRS)
    values = yaml.safe_load((KIND / "values.yaml").read_text())
    assert values["cdiRoot"] in cri[0]["cdi_spec_dirs"]


def test_workers_are_gpu_nodes_each_with_its_own_simulated_driver_root(kind_config: dict[str, Any]) -> None:
    cluster = _cluster_module()
    workers = [n for n in kind_config["nodes"] if n["role"] == "worker"]
    assert len(workers) == 4  # DGX H100, L40S, DGX A100 (MIG as gpu-test4 needs), 2x GH200 (run.sh SIM_NODES)
    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())
    values = yaml.safe_load((KIND / "values.yaml").read_text())
    run_sh = (KIND / "run.sh").read_text()
    # kind names workers <cluster>-worker, <cluster>-worker2, ...; run.sh prepares a root per name.
    for i, worker in enumerate(workers):
        assert worker["labels"] == cluster.NODE_LABELS
        assert worker["labels"].get(chart_values["kubeletPlugin"]["gpuNodeLabel"]) == "true"
        node = f"{kind_config['name']}-worker{i + 1 if i else ''}"
        mounts = {m["containerPath"]: m["hostPath"] for m in worker["extraMounts"]}
        assert mounts[values["nvidiaDriverRoot"]] == f"/tmp/dra-gpu-kind/{node}/driver-root"
        assert f'["$CLUSTER-{node.removeprefix(kind_config["name"] + "-")}"]=' in run_sh
    assert f"DRA_GPU_E2E_DRIVER_ROOT={values['nvidiaDriverRoot']}" in run_sh
    assert values["hardware"] == PREPARED_SIMULATOR


def test_nvkind_template_shares_the_cluster_settings() -> None:
    base = (KIND / "cluster.yaml").read_text()
    template = (KIND / "nvkind-template.yaml").read_text()
    # Gates and runtime config, then the containerd patches; not the CNI and kubeadm patches, which are for
    # the node image assembled here (nvkind uses kind's published one).
    for start, end in (("featureGates:", "networking:"), ("containerdConfigPatches:", "nodes:")):
        assert base[base.index(start) : base.index(end)] in template, start
    assert yaml.safe_load((KIND / "nvkind-values.yaml").read_text())["workers"][0]["devices"]


def _schema_errors(value: Any, schema: Mapping[str, Any], path: str, root: Mapping[str, Any]) -> list[str]:
    """The subset of JSON Schema the chart's values.schema.json uses: type, enum, properties, additional."""
    if "$ref" in schema:
        target: Any = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        schema = target
    errors: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    types = schema.get("type")
    python = {
        "string": str,
        "boolean": bool,
        "integer": int,
        "object": dict,
        "array": list,
        "number": (int, float),
    }
    if isinstance(types, str) and types in python and not isinstance(value, python[types]):  # type: ignore[arg-type]
        errors.append(f"{path}: {value!r} is not of type {types}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key, item in value.items():
            if key in props:
                errors += _schema_errors(item, props[key], f"{path}.{key}", root)
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}.{key}: not a value of the chart")
    return errors


@pytest.mark.parametrize("values_file", ["values.yaml", "values-real.yaml"])
def test_kind_values_are_valid_chart_values(values_file: str) -> None:
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((KIND / values_file).read_text())
    assert _schema_errors(values, schema, "values", schema) == []
    assert values["hardware"] in known_hardware()


def test_schema_check_catches_a_typo() -> None:
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert _schema_errors({"hardwre": "dgx-h100"}, schema, "values", schema) == [
        "values.hardwre: not a value of the chart"
    ]


def test_chart_renders_with_kind_values_when_helm_exists() -> None:
    from e2e.lib.chart import find_helm, plugin_container

    helm = find_helm()
    if helm is None:
        pytest.skip("no helm binary (e2e/cluster/build.sh helm)")
    proc = subprocess.run(
        [helm, "template", "dra-gpu", str(CHART), "-n", "dra-gpu", "-f", str(KIND / "values.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if isinstance(d, dict)]
    env = {e["name"]: e.get("value") for e in plugin_container(docs).get("env", [])}
    assert env["HARDWARE"] == PREPARED_SIMULATOR
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    key, value = PLUGIN_SELECTOR.split("=")
    assert ds["spec"]["template"]["metadata"]["labels"][key] == value


def test_plugin_selector_matches_the_chart_template() -> None:
    text = (CHART / "templates" / "kubelet-plugin-daemonset.yaml").read_text()
    key, value = PLUGIN_SELECTOR.split("=")
    assert f"{key}: {value}" in text


def test_run_script_selects_in_cluster_mode() -> None:
    text = (KIND / "run.sh").read_text()
    assert "DRA_GPU_E2E_MODE=in-cluster" in text
    assert load_settings({"DRA_GPU_E2E_MODE": "in-cluster"}).mode is DriverMode.IN_CLUSTER
    with pytest.raises(ValueError, match="DRA_GPU_E2E_MODE='kind' is not one of: host, in-cluster"):
        load_settings({"DRA_GPU_E2E_MODE": "kind"})
    syntax = subprocess.run(["bash", "-n", str(KIND / "run.sh")], capture_output=True, text=True, check=False)
    assert syntax.returncode == 0, syntax.stderr


def test_config_rendered_for_a_version_keeps_the_gates_that_version_knows(
    kind_config: dict[str, Any],
) -> None:
    """run.sh renders cluster.yaml per version (cluster_config.py): the gates are the local cluster's that the
    version's kube-apiserver knows (1.34 still has DRAAdminAccess, which 1.37 made GA and removed), each
    worker mounts its own driver root, and the image tags are filled in."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cluster_config", KIND / "cluster_config.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    known_134 = {"DRAAdminAccess", "DRAPartitionableDevices", "DynamicResourceAllocation", "NoSuchGate"}
    config = module.render(
        kind_config, known_134 | {"DRADeviceTaints"}, "other", "/roots", "3.6.0-0", "v1.12.0"
    )
    assert config["runtimeConfig"]["resource.k8s.io/v1alpha3"] == "true"  # DeviceTaintRules while gated
    config = module.render(kind_config, known_134, "other", "/roots", "3.6.0-0", "v1.12.0")
    assert "resource.k8s.io/v1alpha3" not in config["runtimeConfig"]
    assert config["featureGates"] == {
        "DRAPartitionableDevices": True, "DRAAdminAccess": True, "DynamicResourceAllocation": True
    }  # fmt: skip
    assert config["name"] == "other"
    roots = [m["hostPath"] for n in config["nodes"] if n["role"] == "worker" for m in n["extraMounts"]]
    assert roots == [f"/roots/other-worker{s}/driver-root" for s in ("", "2", "3", "4")]
    assert "imageTag: 3.6.0-0" in config["kubeadmConfigPatches"][0]
    assert "v1.12.0" in config["kubeadmConfigPatches"][0]
    known = _known_gates()
    if known is not None:  # for the pinned version, the rendering is cluster.yaml's own gates
        pinned = module.render(kind_config, known, "dra-gpu", "/tmp/dra-gpu-kind", "x", "y")
        assert pinned["featureGates"] == kind_config["featureGates"]


def test_clusters_leave_off_the_gates_broken_in_their_release() -> None:
    """On 1.34 the alpha DRAConsumableCapacity makes the scheduler panic on a claim for more devices than a
    node's slice holds (kind 1.34: a five-GPU claim with the 4-GPU node's one-GPU slices in the cluster), and
    then it schedules nothing; neither cluster may turn it on there, and both keep it from 1.35 on."""
    from tests.support.control_plane import broken_feature_gates

    assert broken_feature_gates((1, 34)) == {"DRAConsumableCapacity"}
    assert broken_feature_gates((1, 35)) == broken_feature_gates((1, 37)) == set()
