"""The NVIDIA conformance data (tests/conformance/nvidia): unmodified copies, a catalog and expectations that
cover every copy, an image substitution that changes nothing but images, and the docs table generated from the
catalog.
The cluster part is e2e/test_nvidia_conformance.py."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.lib.container_report import parse_report
from e2e.lib.images import images_in
from e2e.lib.nvidia_conformance import (
    BASH_STAND_IN,
    CONFORMANCE_DIR,
    MAKE_E2E_HARDWARE,
    SAMPLE_STAND_IN,
    STAND_IN_IMAGE,
    CatalogEntry,
    CatalogError,
    consumable_shares_modes,
    expected_hardware,
    load_catalog,
    raw_documents,
    render_table,
    substitute_stand_in,
    table_in,
)
from e2e.lib.settings import load_settings
from tests.deploy.expect_model import load_expectation

REPO_ROOT = Path(__file__).resolve().parents[2]
DOC = REPO_ROOT / "docs" / "differences-from-nvidia.md"
ENTRIES = load_catalog()
RUNNABLE = [e for e in ENTRIES if e.status != "unsupported"]  # with an expect.yaml


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _notice_rows() -> dict[str, tuple[str, str]]:
    rows = {}
    for line in (CONFORMANCE_DIR / "NOTICE.md").read_text().splitlines():
        m = re.fullmatch(r"\| (\S+\.yaml) \| (demo/specs/\S+) \| ([0-9a-f]{40}) \|", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def test_catalog_covers_every_folder_and_file() -> None:
    folders = {p.name for p in CONFORMANCE_DIR.iterdir() if p.is_dir()}
    assert folders == {e.name for e in ENTRIES}
    for e in ENTRIES:
        copies = {p.name for p in e.folder.glob("*.yaml") if p.name != "expect.yaml"}
        assert copies == set(e.files), e.name
        assert (e.folder / "expect.yaml").exists() == (e.status != "unsupported"), (
            f"{e.name}: an expect.yaml exactly for the examples that run, xfail or wait for verification"
        )


def test_copies_are_byte_for_byte_the_upstream_files_named_in_notice() -> None:
    notice = (CONFORMANCE_DIR / "NOTICE.md").read_text()
    source = yaml.safe_load((CONFORMANCE_DIR / "catalog.yaml").read_text())["source"]
    assert source["commit"] in notice and source["repository"] in notice and "Apache License" in notice
    rows = _notice_rows()
    expected = {f"{e.name}/{copy}": upstream for e in ENTRIES for copy, upstream in e.files.items()}
    assert {k: v[0] for k, v in rows.items()} == expected
    for copy, (_, blob) in rows.items():
        assert _git_blob_id((CONFORMANCE_DIR / copy).read_bytes()) == blob, f"{copy} differs from upstream"


@pytest.mark.parametrize("entry", RUNNABLE, ids=[e.name for e in RUNNABLE])
def test_expectations_fit_the_manifests(entry: CatalogEntry) -> None:
    exp = load_expectation(entry.folder / "expect.yaml")
    assert exp.name == entry.name
    assert sorted(exp.manifests) == sorted(entry.files), "every copied manifest is applied"
    docs = raw_documents(entry, exp.manifests)
    namespaces = {d["metadata"]["name"] for d in docs if d.get("kind") == "Namespace"}
    assert namespaces == {exp.namespace}
    pods = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "Pod"}
    templates = [d["spec"]["template"] for d in docs if d.get("kind") in ("Deployment", "Job")]
    for p in exp.pods:
        if p.name is not None:
            spec = pods[p.name]["spec"]
        else:
            assert p.selector is not None
            spec = next(
                t["spec"]
                for t in templates
                if all(t["metadata"]["labels"].get(k) == v for k, v in p.selector.items())
            )
        names = {c["name"] for c in spec["containers"]}
        assert {c.name for c in p.containers} <= names, f"{entry.name}: containers not in the manifest"


def _diff(a: Any, b: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in _diff(a.get(k), b.get(k), (*path, k))]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _diff(x, y, (*path, i))]
    return [] if a == b else [path]


@pytest.mark.parametrize("entry", RUNNABLE, ids=[e.name for e in RUNNABLE])
def test_substitution_touches_only_container_images(entry: CatalogEntry) -> None:
    docs = raw_documents(entry, entry.files)
    out = substitute_stand_in(docs)
    assert images_in(out) == {STAND_IN_IMAGE}
    changed = _diff(docs, out)
    assert changed
    for path in changed:
        assert path[-3] in ("containers", "initContainers"), path
        assert path[-1] in ("image", "imagePullPolicy"), path
    # No pull policy of NVIDIA's was overridden: IfNotPresent is only added where none was set.
    assert all(p[-1] != "imagePullPolicy" or "imagePullPolicy" not in str(docs) for p in changed)


def test_docs_table_is_generated_from_the_catalog() -> None:
    table = table_in(DOC.read_text())
    assert table is not None, f"{DOC}: the generated conformance table's markers are missing"
    assert table == render_table(ENTRIES, expected_hardware(ENTRIES)), (
        "docs/differences-from-nvidia.md: regenerate the table with "
        "`.venv/bin/python -c 'from e2e.lib.nvidia_conformance import *; "
        "print(render_table(load_catalog(), expected_hardware(load_catalog())))'`"
    )


def test_catalog_errors_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "catalog.yaml"
    bad.write_text("examples:\n- {name: x, files: {a.yaml: demo/specs/a.yaml}, nvidia: n, status: xfail}\n")
    with pytest.raises(CatalogError, match=r"examples\[0\]\.reason"):
        load_catalog(bad)
    bad.write_text("examples:\n- {name: x, files: {a.yaml: b}, nvidia: n, status: maybe}\n")
    with pytest.raises(CatalogError, match=r"examples\[0\]\.status: 'maybe'"):
        load_catalog(bad)


def test_stand_ins_run_nvidias_command_lines(tmp_path: Path) -> None:
    bash = tmp_path / "bash"
    bash.write_text(BASH_STAND_IN)
    bash.chmod(0o755)
    # gpu-test1's command line, with a short sleep: trap, background job and wait work in busybox's/dash's sh.
    out = subprocess.run(
        [str(bash), "-c", "echo started; trap 'exit 0' TERM; sleep 0.1 & wait"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    assert out.stdout == "started\n"
    sample = tmp_path / "sample"
    sample.write_text(SAMPLE_STAND_IN)
    sample.chmod(0o755)
    # It reports, then idles until stopped, like the benchmark the examples `wait` on.
    proc = subprocess.run(["timeout", "2", str(sample)], capture_output=True, text=True, timeout=10)
    assert proc.returncode == 124
    assert parse_report(proc.stdout).complete


def test_consumable_shares_mode_from_the_published_gpus() -> None:
    def dev(dtype: str, multi: bool, **capacity: Any) -> dict[str, Any]:
        return {
            "attributes": {"type": {"string": dtype}},
            "allowMultipleAllocations": multi,
            "capacity": capacity,
        }

    memory = {"value": "80Gi", "requestPolicy": {"default": "0"}}
    # dra-gpu's own gpu-N-shared devices (class gpu-share.nvidia.com) are not NVIDIA's consumable shares.
    assert consumable_shares_modes({1: dev("gpu", False), 2: dev("gpu-share", True, memory=memory)}) == set()
    assert consumable_shares_modes({1: dev("gpu", True, memory=memory)}) == {"unlimited"}
    assert consumable_shares_modes({1: dev("gpu", True, memory=memory, shares={"value": "4"})}) == {"integer"}
    full = {"value": "80Gi", "requestPolicy": {"default": "80Gi"}}
    assert consumable_shares_modes({1: dev("gpu", True, memory=full)}) == {"memory"}


def test_make_e2e_hardware_is_the_suite_default() -> None:
    assert load_settings({}).hardware == MAKE_E2E_HARDWARE


@pytest.mark.parametrize(
    "entry",
    [e for e in RUNNABLE if load_expectation(e.folder / "expect.yaml").nvidiaSmi],
    ids=lambda e: e.name,
)
def test_out_of_band_setup_makes_the_example_allocatable(entry: CatalogEntry, tmp_path: Path) -> None:
    """An example's `nvidiaSmi` steps (what NVIDIA's instructions do out of band: gpu-test4 wants mig-parted's
    half-balanced layout, extended-resources-mig-1g-12gb seven 1g.12gb per GH200) run on a fresh simulated
    node of its hardware, whose existing MIG devices its claims then allocate: `dra-gpu explain` over that
    node's slices, as kube-scheduler would (the e2e test runs it for real). The slices leave out the MIG
    placements dra-gpu could create on demand (`--no-dynamic-mig`): on Hopper those alone would serve the
    example without any setup, and this is about the devices the setup made."""
    from e2e.lib.other_hardware import run_nvidia_smi

    exp = load_expectation(entry.folder / "expect.yaml")
    root = tmp_path / "root"
    files = [arg for name in exp.manifests for arg in ("-f", str(entry.folder / name))]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dra_gpu.cli.main", *args], capture_output=True, text=True, timeout=300
        )

    def explain_on_node(label: str) -> subprocess.CompletedProcess[str]:
        node = ("--hardware", exp.hardware, "--driver-root", str(root), "--node", "n1", "--no-dynamic-mig")
        published = cli("slices", *node, "-o", "json")
        assert published.returncode == 0, published.stderr
        (tmp_path / f"{label}.json").write_text(published.stdout)
        return cli("explain", "--slices", str(tmp_path / f"{label}.json"), *files)

    assert cli("hardware", "init-sim", "--hardware", exp.hardware, "--driver-root", str(root)).returncode == 0
    before = explain_on_node("before")
    assert before.returncode == 1, f"allocatable without the setup, so this tests nothing:\n{before.stdout}"
    run_nvidia_smi(root, exp.nvidiaSmi)
    after = explain_on_node("after")
    assert after.returncode == 0, after.stdout + after.stderr
