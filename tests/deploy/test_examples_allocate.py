"""The examples against the driver's own tools, on the simulated node their expect.yaml names:

- `dra-gpu lint` finds nothing in the manifests, except exactly the objects an example expects to be rejected;
- `dra-gpu explain` (the scheduler's allocation semantics over the ResourceSlices `dra-gpu slices` publishes)
  allocates every claim of the positive examples, none of the negative one, and what it allocates fits the
  claim expectations: device count, type, request, MIG profiles, shared attributes, attribute regexes,
  minimum capacities and consumed capacity.

These run the real CLI entry point (in-process, for speed), so a wrong profile name or selector in an example
fails here long before the end-to-end suite.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gpu.cel.quantity import parse_quantity_strict
from dra_gpu.cli.main import main

from .expect_model import ClaimExpectation, DeviceExpectation, Expectation, load_expectation
from .manifest_walk import DRIVER, EXAMPLES, claim_spec, load_docs, pod_sources

EXAMPLE_DIRS = sorted(p for p in EXAMPLES.iterdir() if p.is_dir())


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def _dra_gpu(*args: str) -> CliResult:
    """`dra-gpu ARGS` through its real entry point, with stdout and stderr captured."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse errors
            code = int(exc.code or 0)
    return CliResult(code, out.getvalue(), err.getvalue())


def _manifest_paths(example: Path, expect: Expectation) -> list[str]:
    return [str(example / name) for name in expect.manifests]


@cache
def _devices(hardware: str) -> dict[str, dict[str, Any]]:
    """Device name -> wire-format device of the simulated node's ResourceSlices."""
    out = _dra_gpu("slices", "--hardware", hardware, "--node", "node-0", "-o", "json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    slices = data["items"] if isinstance(data, dict) else data
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def _attribute(device: dict[str, Any], name: str) -> Any:
    key = name.removeprefix(f"{DRIVER}/")
    value = device["attributes"].get(key)
    return None if value is None else next(iter(value.values()))


@cache
def _lint_findings() -> list[dict[str, Any]]:
    """`dra-gpu lint` over the manifests of every example at once (one process)."""
    paths = [p for ex in EXAMPLE_DIRS for p in _manifest_paths(ex, load_expectation(ex / "expect.yaml"))]
    out = _dra_gpu("lint", "-o", "json", *paths)
    assert out.returncode in (0, 1), f"dra-gpu lint could not read the examples: {out.stderr}"
    findings: list[dict[str, Any]] = json.loads(out.stdout)["findings"]
    return findings


@pytest.mark.parametrize("example", EXAMPLE_DIRS, ids=lambda p: p.name)
def test_lint_accepts_example_except_rejected_objects(example: Path) -> None:
    expect = load_expectation(example / "expect.yaml")
    findings = [f for f in _lint_findings() if Path(f["file"]).resolve().parent == example.resolve()]
    flagged = {f["object"] for f in findings}
    wanted = {f"{r.kind}/{r.name}" for r in expect.rejected}
    assert flagged == wanted, f"lint findings: {json.dumps(findings, indent=1)}"
    for rejected in expect.rejected:
        messages = [f["message"] for f in findings if f["object"] == f"{rejected.kind}/{rejected.name}"]
        assert any(re.search(rejected.messageRegex, m) for m in messages), messages


def _explain(example: Path, expect: Expectation) -> dict[str, dict[str, Any]]:
    # an example that needs the driver's --consumable-shares gets nodes whose plugin runs with it
    shares = ["--consumable-shares", "memory"] if "consumable-shares" in expect.requires else []
    out = _dra_gpu(
        "explain",
        "--hardware",
        expect.hardware,
        "-o",
        "json",
        *shares,
        *[a for p in _manifest_paths(example, expect) for a in ("-f", p)],
    )
    assert out.returncode in (0, 1), out.stderr
    return {c["name"]: c for c in json.loads(out.stdout)["claims"]}


def _has_claims(example: Path, expect: Expectation) -> bool:
    rejected = {(r.kind, r.name) for r in expect.rejected}
    return any(
        claim_spec(d) is not None and (d.kind, d.name) not in rejected
        for name in expect.manifests
        for d in load_docs(example / name)
    )


ALLOCATING = [p for p in EXAMPLE_DIRS if _has_claims(p, load_expectation(p / "expect.yaml"))]


@pytest.mark.parametrize("example", ALLOCATING, ids=lambda p: p.name)
def test_explain_allocates_what_the_example_expects(example: Path) -> None:
    expect = load_expectation(example / "expect.yaml")
    claims = _explain(example, expect)
    unallocated = {_explain_name(example, expect, c) for c in expect.claims if not c.allocated}
    for name, claim in claims.items():
        if name in {r.name for r in expect.rejected}:
            continue
        assert claim["allocatable"] == (name not in unallocated), (
            f"{name}: allocatable={claim['allocatable']}: {claim.get('reason')}"
        )
    for want in expect.claims:
        if want.allocated and (want.devices or want.consumedCapacity):
            _check_allocation(want, claims[_explain_name(example, expect, want)], _devices(expect.hardware))


def _explain_name(example: Path, expect: Expectation, want: ClaimExpectation) -> str:
    """The name `dra-gpu explain` gives the claim: its own, `<pod>-<pod claim>`, or the template's."""
    ref = want.ref
    if ref.name is not None:
        return ref.name
    docs = [d for name in expect.manifests for d in load_docs(example / name)]
    for src in pod_sources(docs):
        if (ref.pod is not None and src.doc.kind == "Pod" and src.doc.name == ref.pod) or (
            ref.podSelector is not None and ref.podSelector.items() <= src.labels.items()
        ):
            pod_claim = next(pc for pc in src.spec["resourceClaims"] if pc["name"] == ref.podClaim)
            if "resourceClaimName" in pod_claim:
                return str(pod_claim["resourceClaimName"])
            if ref.pod is not None:
                return f"{ref.pod}-{ref.podClaim}"
            return str(pod_claim["resourceClaimTemplateName"])
    raise AssertionError(f"claim ref {ref} matches no pod in the manifests")


def _check_allocation(
    want: ClaimExpectation, claim: dict[str, Any], devices: dict[str, dict[str, Any]]
) -> None:
    results = claim["allocation"]["devices"]["results"]
    got = [devices[r["device"]] for r in results]
    if want.devices is not None:
        _check_devices(want.devices, results, got)
    if want.consumedCapacity is not None:
        for r in results:
            consumed = {k: parse_quantity_strict(v) for k, v in r.get("consumedCapacity", {}).items()}
            for name, quantity in want.consumedCapacity.items():
                assert consumed.get(name) == parse_quantity_strict(quantity), (r["device"], name, consumed)


def _check_devices(want: DeviceExpectation, results: list[dict[str, Any]], got: list[dict[str, Any]]) -> None:
    assert len(results) == want.count, [r["device"] for r in results]
    assert {_attribute(d, "type") for d in got} == {want.type}, [d["name"] for d in got]
    if want.request is not None:
        assert {r["request"] for r in results} == {want.request}
    if want.profiles is not None:
        assert Counter(_attribute(d, "profile") for d in got) == Counter(want.profiles)
    for name in want.sameAttribute:
        values = {json.dumps(_attribute(d, name)) for d in got}
        assert len(values) == 1 and "null" not in values, f"{name}: {values}"
    for name, pattern in want.attributes.items():
        for d in got:
            assert re.search(pattern, str(_attribute(d, name))), f"{d['name']} {name}={_attribute(d, name)!r}"
    for name, minimum in want.minCapacity.items():
        for d in got:
            value = parse_quantity_strict(d["capacity"][name]["value"])
            assert value >= parse_quantity_strict(minimum), f"{d['name']} {name}={value}"


# ----------------------------------------------------------------------------------------------------
# Footprint: the example's claims allocated together, as the scheduler would one pod after another


def _expanded_pods(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The documents with each Deployment/StatefulSet/ReplicaSet/Job replaced by the pods it runs at once
    (replicas, or a Job's parallelism), so every pod gets its own claims from its templates."""
    out: list[dict[str, Any]] = []
    for doc in docs:
        kind = doc.get("kind")
        if kind not in ("Deployment", "StatefulSet", "ReplicaSet", "Job"):
            out.append(doc)
            continue
        spec = doc["spec"]
        count = int(spec.get("parallelism", 1) if kind == "Job" else spec.get("replicas", 1))
        meta = doc["metadata"]
        for i in range(count):
            template = spec["template"]
            out.append({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {**template.get("metadata", {}), "name": f"{meta['name']}-{i}",
                             "namespace": meta.get("namespace", "default")},
                "spec": template["spec"],
            })  # fmt: skip
    return out


def _quota_caps(docs: list[dict[str, Any]]) -> dict[str, int]:
    """DeviceClass -> the most devices a ResourceQuota lets the namespace's claims ask for
    (`<class>.deviceclass.resource.k8s.io/devices`): claims past it are never created."""
    caps: dict[str, int] = {}
    for doc in docs:
        if doc.get("kind") == "ResourceQuota":
            for key, value in (doc.get("spec", {}).get("hard") or {}).items():
                if key.endswith(".deviceclass.resource.k8s.io/devices"):
                    caps[key.removesuffix(".deviceclass.resource.k8s.io/devices")] = int(value)
    return caps


def _gpus_held_together(example: Path, expect: Expectation, tmp: Path) -> dict[str, set[str]]:
    """Claim ("namespace/name") -> GPU uuids, with every pod's claims allocated by the project's allocator
    in order, each seeing what the earlier ones hold (`dra-gpu explain` explains each claim on an empty
    node, which says nothing about how many GPUs they take together). Claims no pod uses are never
    allocated, as in a cluster."""
    from dra_gpu.allocator.explain import explain
    from dra_gpu.allocator.pools import SliceIndex
    from dra_gpu.allocator.search import Existing
    from dra_gpu.cli.explain import _claim_groups, _device_classes, _hardware_inventory
    from dra_gpu.lint.manifests import load_documents

    rejected = {(r.kind, r.name) for r in expect.rejected}
    raw = [
        d.body
        for name in expect.manifests
        for d in load_docs(example / name)
        if (d.kind, d.name) not in rejected
    ]
    docs = _expanded_pods(raw)
    path = tmp / "expanded.yaml"
    path.write_text(yaml.safe_dump_all([d for d in docs if d.get("kind") != "ResourceQuota"]))
    documents = load_documents([str(path)])
    shares = "memory" if "consumable-shares" in expect.requires else "disabled"
    inventory = _hardware_inventory(expect.hardware, 1, "1.37", shares)
    classes, _ = _device_classes(documents, inventory)
    groups, _ = _claim_groups(documents, inventory, classes)
    referenced = {
        (str(d["metadata"].get("namespace", "default")), str(ref["resourceClaimName"]))
        for d in docs
        if d.get("kind") == "Pod"
        for ref in d["spec"].get("resourceClaims") or ()
        if ref.get("resourceClaimName")
    }
    index = SliceIndex(inventory.slices)
    existing = Existing()
    caps = _quota_caps(raw)
    devices = _devices(expect.hardware)
    held: dict[str, set[str]] = {}
    for group in groups:
        if not any(
            (c.namespace, c.name) in referenced or c.source.startswith(("template ", "extended resources"))
            for c in group
        ):
            continue  # a claim no pod uses: never allocated
        todo = [c for c in group if f"{c.namespace}/{c.name}" not in held]
        wanted: Counter[str] = Counter()
        for c in todo:
            for request in c.requests:
                wanted[request.alternatives[0].class_name] += request.alternatives[0].count
        if any(caps.get(k, n) < n for k, n in wanted.items()):
            continue  # the quota refuses the pod's claims: it stays Pending, holding nothing
        for k, n in wanted.items():
            if k in caps:
                caps[k] -= n
        for found in explain([todo], classes, index, inventory.nodes, existing):
            held[f"{found.namespace}/{found.name}"] = set()
            for r in found.results if found.allocatable else ():
                device_id = (r.driver, r.pool, r.device)
                existing.holders[device_id] = found.name
                if r.share_id is not None or r.consumed_capacity:
                    existing.shared.setdefault(device_id, []).append(dict(r.consumed_capacity or {}))
                else:
                    existing.exclusive.add(device_id)
                attrs = devices[r.device]["attributes"]
                held[f"{found.namespace}/{found.name}"].add(
                    (attrs.get("parentUUID") or attrs["uuid"])["string"]
                )
    return held


@pytest.mark.parametrize("example", EXAMPLE_DIRS, ids=lambda p: p.name)
def test_claims_allocated_together_take_the_footprint(example: Path, tmp_path: Path) -> None:
    """`footprint: {gpus: N}`: allocated together, the example's claims are on exactly N distinct GPUs (the
    end-to-end suite checks the same on the cluster, e2e/lib/expectations.py check_footprint)."""
    expect = load_expectation(example / "expect.yaml")
    held = _gpus_held_together(example, expect, tmp_path)
    gpus = set().union(*held.values()) if held else set()
    assert len(gpus) == expect.footprint.gpus, {claim: len(g) for claim, g in held.items()}
