"""The chart's `consumableShares` (NVIDIA's key) reaches the kubelet plugin as CONSUMABLE_SHARES, in the forms
NVIDIA's chart takes (`--set consumableShares=4` is a number to Helm), and a bad value is refused by name."""

from __future__ import annotations

import json

import pytest
import yaml

from .test_chart import CHART, KUBE_VERSION, NAMESPACE, _render_chart, _run_helm, helm  # noqa: F401  (helm: fixture)


def _plugin_env(helm: str, *args: str) -> dict[str, str | None]:  # noqa: F811
    out = _render_chart(helm, *args)
    assert out.returncode == 0, out.stderr
    daemonset = next(d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "DaemonSet")
    return {e["name"]: e.get("value") for e in daemonset["spec"]["template"]["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize(
    ("setting", "value"),
    [("consumableShares=memory", "memory"), ("consumableShares=unlimited", "unlimited"),
     ("consumableShares=4", "4"), ("consumableShares=disabled", "disabled")],
)  # fmt: skip
def test_the_value_becomes_the_env_var(helm: str, setting: str, value: str) -> None:  # noqa: F811
    assert _plugin_env(helm, "--set", setting)["CONSUMABLE_SHARES"] == value


def test_unset_or_empty_leaves_the_plugin_default(helm: str) -> None:  # noqa: F811
    assert "CONSUMABLE_SHARES" not in _plugin_env(helm)
    assert "CONSUMABLE_SHARES" not in _plugin_env(helm, "--set-json", f"consumableShares={json.dumps('')}")


@pytest.mark.parametrize("bad", ['"half"', "0", '"-1"', "[4]"])
def test_a_bad_value_is_refused_naming_the_key(helm: str, bad: str) -> None:  # noqa: F811
    out = _run_helm(
        helm, "template", "dra-gpu", str(CHART), "--kube-version", KUBE_VERSION,
        "--set-json", f"consumableShares={bad}",
    )  # fmt: skip
    assert out.returncode != 0 and "consumableShares" in out.stderr, out.stderr
