"""The kubelet plugin process loads only what it needs: never the CEL/explain/lint stack (cel-python, lark,
re2), which is the optional `dra-gpu[tools]` extra and costs memory and start-up time on every node; and
neither the config models nor the typed core API for claims that do not need them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.plugin.kubelet_client import ClaimId, KubeletClient
from tests.plugin.plugin_harness import REPO_ROOT, ClaimFactory, PluginProcess, Result, SimNode

FORBIDDEN = ("celpy", "lark", "re2", "dra_gpu.cel", "dra_gpu.allocator", "dra_gpu.lint")
# `-X importtime` (PYTHONPROFILEIMPORTTIME) writes one line per module the process imports, to stderr.
_IMPORT_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|(?P<indent>\s*)(?P<module>[\w.]+)\s*$", re.M)


def imported_modules(log: str) -> set[str]:
    return {m.group("module") for m in _IMPORT_LINE.finditer(log)}


def forbidden_in(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))


@pytest.mark.apiserver
def test_started_plugin_never_imports_the_cel_stack(
    start_plugin: Callable[..., PluginProcess], node: SimNode, claims: ClaimFactory
) -> None:
    process = start_plugin(env={"PYTHONPROFILEIMPORTTIME": "1"})
    kubelet = KubeletClient(node.registration_socket)  # one prepare, so its lazy imports happen too
    name, uid = claims.make("imports", [Result("gpu", "gpu-0")])
    claim = ClaimId("imports", uid, name)
    assert not kubelet.prepare([claim]).claims[uid].error
    kubelet.unprepare([claim])
    kubelet.close()
    process.stop()
    modules = imported_modules(process.log_path.read_text(errors="replace"))
    assert "dra_gpu.plugin.prepare_service" in modules  # the log is the plugin's import trace
    assert forbidden_in(modules) == []
    # Nor, for claims without an opaque config, the config models (they load with the first config), nor the
    # typed core API (~1 s and 22 MB: the plugin's few pod and node calls go through request_json)
    assert "dra_gpu.config.names" in modules and "dra_gpu.config.api" not in modules
    assert any(m.startswith("kubernetes.client.") for m in modules)  # (threads' lines may interleave)
    assert "kubernetes.client.api.core_v1_api" not in modules


def test_a_kubeconfig_that_cannot_be_loaded_stops_the_plugin(node: SimNode, tmp_path: Path) -> None:
    """The API client loads after the sockets serve (start-up does not wait for its imports); a kubeconfig
    that cannot be loaded still stops the plugin, naming it, and leaves no socket behind."""
    process = PluginProcess(node, str(tmp_path / "missing-kubeconfig"))
    try:
        assert process.wait_dead(30) == 1
    finally:
        process.stop()
    log = process.log_path.read_text(errors="replace")
    assert "cannot start: Kubernetes API client" in log and "missing-kubeconfig" in log
    assert not node.registration_socket.exists()


def test_dra_gpu_kubelet_plugin_command_does_not_load_other_subcommands() -> None:
    """`dra-gpu kubelet-plugin` (what the image runs) parses its flags without importing explain/lint."""
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "dra_gpu.cli.main", "kubelet-plugin", "--help"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    modules = imported_modules(done.stderr)
    assert "dra_gpu.plugin.health_monitor" in modules  # imported by dra_gpu.cli.kubelet_plugin
    assert forbidden_in(modules) == []
    everything = subprocess.run(  # and the check can fail: the full `dra-gpu --help` does load them
        [sys.executable, "-m", "dra_gpu.cli.main", "--help"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "celpy" in imported_modules(everything.stderr)


def test_log_parser_reads_importtime_lines(tmp_path: Path) -> None:
    log = "import time:       952 |      24011 | site\nimport time:        39 |     220415 |   lark.tree\n"
    assert imported_modules(log) == {"site", "lark.tree"}
    assert forbidden_in({"lark.tree", "dra_gpu.cel.quantity", "dra_gpu.celery"}) == [
        "dra_gpu.cel.quantity",
        "lark.tree",
    ]


def test_explain_without_the_tools_extra_says_what_to_install() -> None:
    """In the node image (no `dra-gpu[tools]`), `dra-gpu --help` still works and `dra-gpu explain` says what
    to install instead of a traceback."""
    script = (
        "import sys; sys.modules['celpy'] = None; from dra_gpu.cli.main import main; "  # as if not installed
        "sys.exit(main(sys.argv[1:]))"
    )
    helped = subprocess.run(
        [sys.executable, "-c", script, "--help"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert helped.returncode == 0, helped.stderr
    assert "kubelet-plugin" in helped.stdout and "explain" in helped.stdout
    # as users type them (a lent H100's node venv answered the first with "unrecognized arguments: -f")
    for command in (
        ["explain", "-f", "claim.yaml", "--hardware", "dgx-h100", "-o", "json"],
        ["explain", "claim.yaml"],
        ["lint", "--kubernetes-version", "1.34", "-f", "examples/"],
        ["explain", "--help"],
    ):
        ran = subprocess.run(
            [sys.executable, "-c", script, *command], cwd=REPO_ROOT, capture_output=True, text=True
        )
        assert ran.returncode == 1, (command, ran.stderr)
        assert "pip install 'dra-gpu[tools]'" in ran.stderr and "celpy" in ran.stderr, (command, ran.stderr)
