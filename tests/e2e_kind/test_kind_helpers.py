"""The pure parts of the kind path's helpers: pod networking (e2e/kind/cni.py) and the runc wrapper of the
private Docker daemon (e2e/kind/runc_bounded.py). `make e2e-kind` runs both for real."""

from __future__ import annotations

import importlib.util
import json
import resource
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

KIND = Path(__file__).resolve().parents[2] / "e2e" / "kind"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, KIND / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


cni = _load("cni")
runc_bounded = _load("runc_bounded")


def _node(name: str, ip: str | None, cidr: str | None) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"podCIDR": cidr} if cidr else {},
        "status": {
            "addresses": [{"type": "Hostname", "address": name}]
            + ([{"type": "InternalIP", "address": ip}] if ip else [])
        },
    }


def test_nodes_without_a_pod_range_or_address_are_left_out() -> None:
    nodes = cni.nodes_from(
        {
            "items": [
                _node("cp", "172.19.0.2", "10.244.0.0/24"),
                _node("w1", "172.19.0.3", None),
                _node("w2", None, "10.244.2.0/24"),
            ]
        }
    )
    assert nodes == [cni.Node("cp", "172.19.0.2", "10.244.0.0/24")]


def test_each_node_routes_the_other_nodes_pod_ranges_through_them() -> None:
    a = cni.Node("a", "172.19.0.2", "10.244.0.0/24")
    b = cni.Node("b", "172.19.0.3", "10.244.1.0/24")
    c = cni.Node("c", "172.19.0.4", "10.244.2.0/24")
    assert cni.routes(b, [a, b, c]) == [
        ["ip", "route", "replace", "10.244.0.0/24", "via", "172.19.0.2"],
        ["ip", "route", "replace", "10.244.2.0/24", "via", "172.19.0.4"],
    ]


def test_conflist_hands_out_addresses_from_the_nodes_own_range() -> None:
    conf = cni.conflist(cni.Node("a", "172.19.0.2", "10.244.3.0/24"))
    main, portmap = conf["plugins"]
    assert main["type"] == "ptp" and main["ipMasq"] is True
    assert main["ipam"]["ranges"] == [[{"subnet": "10.244.3.0/24"}]]
    assert portmap["type"] == "portmap"


STATUS = "Name:\\tx\\nCapBnd:\\t000001fffeffffff\\nCapAmb:\\t0\\n".replace("\\t", "\t").replace("\\n", "\n")


def test_bounding_set_lacks_exactly_the_withheld_capability() -> None:
    allowed = runc_bounded.bounding_set(STATUS)
    assert "CAP_SYS_RESOURCE" not in allowed  # bit 24, clear in 0x1fffeffffff
    assert {"CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_CHECKPOINT_RESTORE"} <= allowed
    assert len(allowed) == 40


def test_privileged_capabilities_and_rlimits_are_bounded() -> None:
    everything = [f"CAP_{n}" for n in runc_bounded.CAPABILITIES]
    process: dict[str, Any] = {
        "capabilities": {k: list(everything) for k in ("bounding", "effective", "permitted")},
        "rlimits": [
            {"type": "RLIMIT_NOFILE", "hard": 1048576, "soft": 1048576},
            {"type": "RLIMIT_CORE", "hard": 10, "soft": 10},
        ],
    }
    allowed = runc_bounded.bounding_set(STATUS)
    assert runc_bounded.bound_process(
        process, allowed, {"RLIMIT_NOFILE": 20000, "RLIMIT_CORE": resource.RLIM_INFINITY}
    )
    for names in process["capabilities"].values():
        assert "CAP_SYS_RESOURCE" not in names and len(names) == 40
    assert process["rlimits"][0] == {"type": "RLIMIT_NOFILE", "hard": 20000, "soft": 20000}
    assert process["rlimits"][1] == {"type": "RLIMIT_CORE", "hard": 10, "soft": 10}
    # A second pass has nothing left to change: an unprivileged container goes to runc untouched.
    assert not runc_bounded.bound_process(process, allowed, {"RLIMIT_NOFILE": 20000})


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--root", "/r", "create", "--bundle", "/b/x", "id"], ("/b/x/config.json", True)),
        (["run", "--bundle=/b/y", "id"], ("/b/y/config.json", True)),
        (["--root", "/r", "exec", "--process", "/tmp/p.json", "--detach", "id"], ("/tmp/p.json", False)),
        (["--root", "/r", "state", "id"], None),
        (["kill", "id", "9"], None),
    ],
)
def test_which_file_a_runc_call_takes_its_process_from(
    argv: list[str], expected: tuple[str, bool] | None
) -> None:
    got = runc_bounded.spec_file(argv)
    assert (None if got is None else (str(got[0]), got[1])) == expected


def test_exec_process_file_is_rewritten_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wrapper edits the process file and execs the real runc with the arguments unchanged."""
    process = tmp_path / "p.json"
    process.write_text(
        json.dumps({"args": ["cat"], "capabilities": {"effective": ["CAP_SYS_RESOURCE", "CAP_KILL"]}})
    )
    calls: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(runc_bounded.os, "execv", lambda path, args: calls.append((path, args)))
    monkeypatch.setenv("DRA_GPU_REAL_RUNC", "/opt/runc")
    status = tmp_path / "status"
    status.write_text(STATUS)
    real_path = runc_bounded.Path

    def fake_path(p: Any) -> Any:
        return real_path(status) if str(p) == "/proc/self/status" else real_path(p)

    monkeypatch.setattr(runc_bounded, "Path", fake_path)
    monkeypatch.setattr(sys, "argv", ["runc", "exec", "--process", str(process), "id"])
    runc_bounded.main()
    assert json.loads(process.read_text())["capabilities"]["effective"] == ["CAP_KILL"]
    assert calls == [("/opt/runc", ["/opt/runc", "exec", "--process", str(process), "id"])]
