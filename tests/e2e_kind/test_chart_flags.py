from __future__ import annotations

import pytest

from e2e.lib.chart import container_flags, host_plugin_flags, plugin_container, split_flags


def test_split_flags_understands_both_spellings() -> None:
    assert split_flags(["--a=1", "--b", "2", "--c", "-v", "6"]) == [
        ("--a", "1"),
        ("--b", "2"),
        ("--c", None),
        ("-v", "6"),
    ]


def test_positional_words_are_refused() -> None:
    with pytest.raises(ValueError, match="unexpected positional argument 'x'"):
        split_flags(["--a", "1", "--b", "2", "x", "y"])


def test_host_flags_keep_chart_flags_and_swap_paths() -> None:
    chart = [
        "--node-name=$(NODE_NAME)",
        "--cdi-root",
        "/var/run/cdi",
        "--feature-gates",
        "MPSSupport=true",
        "--nvidia-driver-root",
        "/driver-root",
    ]
    out = host_plugin_flags(
        chart, {"--node-name": "node-a", "--nvidia-driver-root": "/sim", "--kubeconfig": "/k"}
    )
    assert out == [
        "--node-name",
        "node-a",
        "--cdi-root",
        "/var/run/cdi",
        "--feature-gates",
        "MPSSupport=true",
        "--nvidia-driver-root",
        "/sim",
        "--kubeconfig",
        "/k",
    ]


def test_pod_environment_references_must_be_overridden() -> None:
    with pytest.raises(ValueError, match=r"--image-name=\$\(IMAGE\) needs the pod environment"):
        host_plugin_flags(["--image-name=$(IMAGE)"], {})


def test_plugin_container_is_found_by_its_subcommand() -> None:
    ds = {
        "kind": "DaemonSet",
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {"name": "sidecar", "command": ["sleep"]},
                        {
                            "name": "gpus",
                            "command": ["dra-gpu"],
                            "args": ["kubelet-plugin", "--node-name=$(NODE_NAME)"],
                        },
                    ]
                }
            }
        },
    }
    container = plugin_container([ds])
    assert container["name"] == "gpus"
    assert container_flags(container) == ["--node-name=$(NODE_NAME)"]


def test_host_env_keeps_literals_and_replaces_pod_fields() -> None:
    from e2e.lib.chart import host_plugin_env

    container = {
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "LOG_FORMAT", "value": "json"},
            {"name": "CDI_ROOT", "value": "/var/run/cdi"},
        ]
    }
    env = host_plugin_env(
        container, {"NODE_NAME": "n1", "POD_UID": None, "CDI_ROOT": "/tmp/cdi", "EXTRA": "1"}
    )
    assert env == {"NODE_NAME": "n1", "LOG_FORMAT": "json", "CDI_ROOT": "/tmp/cdi", "EXTRA": "1"}


def test_host_env_refuses_an_unmapped_pod_field() -> None:
    from e2e.lib.chart import host_plugin_env

    container = {
        "env": [{"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]
    }
    with pytest.raises(ValueError, match="chart env NAMESPACE comes from"):
        host_plugin_env(container, {})


def test_the_real_chart_template_is_fully_mapped_for_a_host_process() -> None:
    """Every pod-derived variable of the chart's plugin container has a host value in HostDriver."""
    import re
    from pathlib import Path

    from e2e.lib import driver as driver_module

    template = (
        Path(__file__).resolve().parents[2] / "manifests/helm/dra-gpu/templates/kubelet-plugin-daemonset.yaml"
    )
    if not template.exists():
        pytest.skip("no chart yet")
    names = set(re.findall(r"- name: ([A-Z_]+)\n\s+valueFrom:", template.read_text()))
    source = Path(driver_module.__file__).read_text()
    missing = sorted(n for n in names if f'"{n}":' not in source)
    assert not missing, f"HostDriver.plugin_command gives no host value for {missing}"
