"""Runs one example folder against the cluster: apply, wait for its promises, delete, check the cleanup.

Shared by `e2e/test_examples.py` and the demo. Pure checks live in `expectations.py`; this module does the
I/O (kubectl, the driver's view of the hardware and of /var/run/cdi) and the waiting.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from e2e.lib.claims import allocated_devices
from e2e.lib.container_client import client_in_container
from e2e.lib.container_report import ClientReport, ContainerReport, parse_report
from e2e.lib.driver import DriverControl
from e2e.lib.expectations import (
    Observed,
    check_all,
    check_hardware_reset,
    claim_gpus,
    leftover_cdi_specs,
    mps_client_containers,
    phase,
    row_devices,
    row_pods,
    runtime_start_flake,
)
from e2e.lib.images import mapping_from_dict, substitute_images
from e2e.lib.kubectl import Kubectl
from e2e.lib.settings import DRIVER_NAME, E2ESettings
from e2e.lib.sim_view import sharing_effect
from e2e.lib.summary import ExampleRow
from e2e.lib.waiting import namespace_report
from tests.deploy.expect_model import Expectation, load_expectation

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
PENDING_SETTLE_S = 10.0  # a Pending expectation must still hold this long after it first holds

# A selector the scheduler cannot evaluate against the published devices ("CEL runtime error: no such key")
# fails the same way at every retry until the slices change, which an example does not do: no point waiting
# out the example's timeout (NVIDIA's stale gpu-test6 cost every run 3 minutes). A few seconds first, so that
# the first scheduling attempts of a slow start are not taken for it.
HOPELESS_AFTER_S = 15.0


def unschedulable_for_good(events: Sequence[Mapping[str, Any]]) -> str | None:
    """The first FailedScheduling message that names a CEL runtime error, else None."""
    for event in events:
        message = str(event.get("message", ""))
        if event.get("reason") == "FailedScheduling" and "CEL runtime error" in message:
            return message
    return None


def example_folders(root: Path = EXAMPLES_DIR) -> list[Path]:
    return sorted(p.parent for p in root.glob("*/expect.yaml"))


@dataclass
class ExampleOutcome:
    observed: Observed | None = None
    claim_uids: set[str] = field(default_factory=set)
    cdi_specs: set[str] = field(default_factory=set)  # spec files that belonged to the example's claims
    sharing: str = "-"
    devices: str = "-"
    pods: str = "-"
    timings: dict[str, float] = field(default_factory=dict)
    recreated: list[str] = field(default_factory=list)  # pods made again after a runtime start flake


class ExampleFailedError(AssertionError):
    pass


def slice_devices(kubectl: Kubectl) -> dict[tuple[str, str], dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for s in kubectl.items("resourceslices.resource.k8s.io"):
        spec = s.get("spec", {})
        if spec.get("driver") != DRIVER_NAME:
            continue
        pool = spec.get("pool", {}).get("name", "")
        for dev in spec.get("devices") or []:
            out[(pool, dev["name"])] = dev
    return out


class ExampleRun:
    def __init__(
        self,
        folder: Path,
        kubectl: Kubectl,
        driver: DriverControl,
        settings: E2ESettings,
        log: Callable[[str], None] = lambda _msg: None,
    ) -> None:
        self.folder = folder
        self.exp: Expectation = load_expectation(folder / "expect.yaml")
        self.kubectl = kubectl
        self.driver = driver
        self.settings = settings
        self.log = log
        self.outcome = ExampleOutcome()
        self._reports: dict[str, ContainerReport] = {}
        self._clients: dict[str, ClientReport] = {}
        self._held_gpus: dict[str, frozenset[str]] = {}
        self._sim_before: dict[str, Any] | None = None

    @property
    def namespace(self) -> str:
        return self.exp.namespace

    def _needs_hardware(self) -> bool:
        return any(c.hardware is not None for c in self.exp.claims) or self.exp.cleanup.hardwareReset

    # --------------------------------------------------------------------------------------------- apply
    def documents(self) -> list[list[dict[str, Any]]]:
        """The manifests (in expect.yaml order), images swapped for the local test image."""
        convert = mapping_from_dict({}, default=self.settings.test_image)
        out = []
        for name in self.exp.manifests:
            docs = [d for d in yaml.safe_load_all((self.folder / name).read_text()) if isinstance(d, dict)]
            out.append(substitute_images(docs, convert)[0])
        return out

    def apply(self) -> list[str]:
        """Apply everything; returns failures about `rejected` (refused objects, or wrongly accepted ones)."""
        self._sim_before = self.driver.sim_state() if self._needs_hardware() else None
        self._cdi_before = set(self.driver.cdi_spec_names())
        rejected = {(r.kind, r.name): r for r in self.exp.rejected}
        failures: list[str] = []
        for docs in self.documents():
            if not rejected:
                self.kubectl.apply(yaml.safe_dump_all(docs))
                continue
            # One object at a time, so that each refusal is tied to its object.
            for doc in docs:
                key = (doc.get("kind", ""), doc.get("metadata", {}).get("name", ""))
                result = self.kubectl.try_apply(yaml.safe_dump(doc))
                want = rejected.pop(key, None)
                if want is None and result.returncode != 0:
                    failures.append(f"{key[0]}/{key[1]} was refused: {result.stderr.strip()}")
                elif want is not None and result.returncode == 0:
                    failures.append(
                        f"{key[0]}/{key[1]} was accepted, expected a refusal /{want.messageRegex}/"
                    )
                elif want is not None and not re.search(want.messageRegex, result.stderr):
                    failures.append(
                        f"{key[0]}/{key[1]} refused, but the message does not match /{want.messageRegex}/: "
                        f"{result.stderr.strip()}"
                    )
        failures += [f"{k}/{n}: not in the manifests" for k, n in rejected]
        return failures

    # ------------------------------------------------------------------------------------------- observe
    def observe(self) -> Observed:
        pods = self.kubectl.items("pods", self.namespace)
        claims = self.kubectl.items("resourceclaims.resource.k8s.io", self.namespace)
        for c in claims:
            self.outcome.claim_uids.add(c["metadata"]["uid"])
        wanted = {
            (pexp_container.name)
            for pexp in self.exp.pods
            for pexp_container in pexp.containers
            if pexp_container.env or pexp_container.envAbsent or pexp_container.deviceNodes
        }
        for pod in pods:
            if phase(pod) not in ("Running", "Succeeded"):
                continue
            for ctr in pod["spec"].get("containers", []):
                key = f"{pod['metadata']['name']}/{ctr['name']}"
                if ctr["name"] in wanted and not self._reports.get(key, ContainerReport()).complete:
                    log = self.kubectl.logs(self.namespace, pod["metadata"]["name"], ctr["name"])
                    self._reports[key] = parse_report(log)
        sim_now = self.driver.sim_state() if self._needs_hardware() else None
        devices = slice_devices(self.kubectl)
        for claim in claims:
            gpus = claim_gpus(claim, devices)
            if gpus:
                name = claim["metadata"]["name"]
                self._held_gpus[name] = self._held_gpus.get(name, frozenset()) | gpus
        observed = Observed(
            pods=pods,
            claims=claims,
            slice_devices=devices,
            reports=dict(self._reports),
            events=self.kubectl.events(self.namespace),
            sim_before=self._sim_before,
            sim_now=sim_now,
            held_gpus=dict(self._held_gpus),
        )
        return replace(observed, clients=self._ask_clients(observed))

    def _ask_clients(self, observed: Observed) -> dict[str, ClientReport]:
        """What a CUDA process in each container that an MPS expectation names gets from MPS, asked from
        inside the container (container_client.py). A container that was served keeps its answer; the others
        are asked again at each poll (their daemon may still be starting)."""
        pods = {p["metadata"]["name"]: p for p in observed.pods}
        for key in mps_client_containers(self.exp, observed):
            if key in self._clients and self._clients[key].mps:
                continue
            pod_name, container = key.split("/", 1)
            # no simulator root for the client: one that reaches no daemon must fail, not take the GPU
            self._clients[key] = client_in_container(pods[pod_name], container, driver_root=None)
        return dict(self._clients)

    def _note_cdi_specs(self) -> None:
        names = set(self.driver.cdi_spec_names()) - self._cdi_before
        for name in names:
            if any(uid in name for uid in self.outcome.claim_uids):
                self.outcome.cdi_specs.add(name)
                continue
            try:
                text = yaml.safe_dump(self.driver.cdi_spec(name))
            except (OSError, yaml.YAMLError):
                continue
            if any(uid in text for uid in self.outcome.claim_uids):
                self.outcome.cdi_specs.add(name)

    def wait_expectations(self) -> Observed:
        """Poll until every promise of expect.yaml holds; at the deadline fail with all that do not."""
        deadline = time.monotonic() + self.exp.timeoutSeconds
        t0 = time.monotonic()
        ends_pending = any(p.phase == "Pending" or (p.phases or {}).get("Pending") for p in self.exp.pods)
        held_since: float | None = None
        while True:
            observed = self.observe()
            if self._recreate_runtime_flakes(observed.pods):
                continue
            failures = check_all(self.exp, observed)
            now = time.monotonic()
            if not failures:
                held_since = held_since or now
                if not ends_pending or now - held_since >= PENDING_SETTLE_S:
                    break
            else:
                held_since = None
            hopeless = unschedulable_for_good(observed.events)
            if failures and hopeless and now - t0 >= HOPELESS_AFTER_S:
                raise ExampleFailedError(
                    f"example {self.exp.name}: the scheduler cannot evaluate its selectors ({hopeless}); "
                    "these expect.yaml promises do not hold:\n  - " + "\n  - ".join(failures)
                )
            if now > deadline:
                raise ExampleFailedError(
                    f"example {self.exp.name}: after {self.exp.timeoutSeconds}s these expect.yaml promises"
                    " do not hold:\n  - "
                    + "\n  - ".join(failures)
                    + "\n"
                    + namespace_report(self.kubectl, self.namespace, self.driver.log_tail)
                )
            time.sleep(1.0)
        self.outcome.timings["settled_s"] = time.monotonic() - t0
        self._note_cdi_specs()
        self.outcome.observed = observed
        self.outcome.sharing = sharing_effect(observed.sim_before, observed.sim_now)
        self.outcome.devices = row_devices(observed.claims)
        self.outcome.pods = row_pods(observed.pods)
        return observed

    def _recreate_runtime_flakes(self, pods: Sequence[Mapping[str, Any]]) -> bool:
        """Create again, once each, the example's own Pods that Failed because the container runtime could not
        create their container for a reason of the host (expectations.runtime_start_flake): with
        restartPolicy Never nothing else would. True when one was made again."""
        made_again = False
        for pod in pods:
            name = pod["metadata"]["name"]
            message = runtime_start_flake(pod)
            if message is None or name in self.outcome.recreated:
                continue
            doc = next(
                (d for docs in self.documents() for d in docs
                 if d.get("kind") == "Pod" and d.get("metadata", {}).get("name") == name),
                None,
            )  # fmt: skip
            if doc is None:
                continue  # made by a controller (a Job, a Deployment), which makes its own next pod
            self.outcome.recreated.append(name)
            note = f"pod {name}: the container runtime could not create it ({message[:300]}); made again"
            print(note, flush=True)
            self.log(note)
            manifest = yaml.safe_dump({**doc, "metadata": {**doc["metadata"], "namespace": self.namespace}})
            self.kubectl.delete_manifest(manifest, wait=True)
            self.kubectl.apply(manifest)
            made_again = True
        return made_again

    def prepared_claims_without_cdi_spec(self) -> list[str]:
        """Allocated claims of running pods without a CDI spec file (a prepare that wrote nothing)."""
        observed = self.outcome.observed
        if observed is None:
            return []
        running_claims = {
            ref.get("resourceClaimName")
            for p in observed.pods
            if phase(p) == "Running"
            for ref in (p.get("status") or {}).get("resourceClaimStatuses") or []
        }
        missing = []
        for claim in observed.claims:
            name = claim["metadata"]["name"]
            if name in running_claims and any(d.is_ours for d in allocated_devices(claim)):
                uid = claim["metadata"]["uid"]
                if not any(uid in spec for spec in self.outcome.cdi_specs) and not self._spec_mentions(uid):
                    missing.append(name)
        return missing

    def _spec_mentions(self, uid: str) -> bool:
        for name in self.outcome.cdi_specs:
            try:
                if uid in yaml.safe_dump(self.driver.cdi_spec(name)):
                    return True
            except (OSError, yaml.YAMLError):
                continue
        return False

    # ------------------------------------------------------------------------------------------- cleanup
    def delete(self) -> None:
        """Delete every manifest (the Namespace with it) and wait until the namespace is gone."""
        t0 = time.monotonic()
        for docs in reversed(self.documents()):
            self.kubectl.run(
                "delete",
                "-f",
                "-",
                "--ignore-not-found",
                "--wait=false",
                stdin=yaml.safe_dump_all(docs),
                check=False,
            )
        self.kubectl.delete_namespace(self.namespace, wait=True, timeout_s=180)
        self.outcome.timings["delete_s"] = time.monotonic() - t0

    def wait_cleanup(self, timeout_s: float = 90) -> list[str]:
        """After deletion: the claims' CDI specs removed and (if promised) the hardware back to baseline."""
        deadline = time.monotonic() + timeout_s
        failures: list[str] = []
        while time.monotonic() < deadline:
            failures = []
            left = leftover_cdi_specs(self.driver.cdi_spec_names(), self.outcome.claim_uids)
            left += sorted(self.outcome.cdi_specs & set(self.driver.cdi_spec_names()))
            if left:
                failures.append(
                    f"CDI spec files of deleted claims still in {self.settings.cdi_root}: {sorted(set(left))}"
                )
            if self.exp.cleanup.hardwareReset and self._sim_before is not None:
                failures += check_hardware_reset(self._sim_before, self.driver.sim_state())
            if not failures:
                return []
            time.sleep(1.0)
        return failures

    def row(self, result: str, detail: str = "") -> ExampleRow:
        return ExampleRow(
            example=self.exp.name,
            pods=self.outcome.pods,
            devices=self.outcome.devices,
            sharing=self.outcome.sharing,
            result=result,
            detail=detail.splitlines()[0] if detail else "",
        )


def cluster_has(requirement: str, kubectl: Kubectl) -> tuple[bool, str]:
    """Whether the cluster offers what an example `requires`, and why not when it does not."""
    if requirement == "webhook":
        hooks = kubectl.items("validatingwebhookconfigurations")
        ok = any(
            "resource-claim-parameters" in ((w.get("clientConfig") or {}).get("url") or "")
            or "resource-claim-parameters"
            in (((w.get("clientConfig") or {}).get("service") or {}).get("path") or "")
            for h in hooks
            for w in h.get("webhooks", [])
        )
        return ok, "no ValidatingWebhookConfiguration for /validate-resource-claim-parameters"
    if requirement == "extended-resource":
        classes = kubectl.items("deviceclasses.resource.k8s.io")
        ok = any(c.get("spec", {}).get("extendedResourceName") for c in classes)
        return (
            ok,
            "no DeviceClass with spec.extendedResourceName (DRAExtendedResource off, or not in the chart)",
        )
    if requirement == "resource-quota":
        return True, ""
    if requirement == "consumable-shares":
        # NVIDIA's consumable shares: the whole GPUs themselves allow multiple allocations (our own
        # gpu-<minor>-shared devices always do, so they do not count)
        ok = any(
            d.get("allowMultipleAllocations")
            and d.get("attributes", {}).get("type", {}).get("string") == "gpu"
            for s in kubectl.items("resourceslices.resource.k8s.io")
            for d in s.get("spec", {}).get("devices") or []
        )
        return ok, (
            "no whole GPU allows multiple allocations (the driver runs without --consumable-shares; "
            "e2e/test_consumable_shares.py runs this example with the mode switched)"
        )
    if requirement.startswith("kubernetes>="):
        # Some examples need scheduler behaviour that older releases lack (e.g. 1.34's alpha consumable
        # capacity does not allocate the share devices, which also consume the GPU's shared counters).
        wanted = tuple(int(p) for p in requirement.removeprefix("kubernetes>=").split("."))
        server = json.loads(kubectl.run("version", "-o", "json").stdout)["serverVersion"]
        have = (int(server["major"]), int("".join(ch for ch in server["minor"] if ch.isdigit())))
        return have >= wanted, f"the cluster runs Kubernetes {have[0]}.{have[1]}"
    return False, f"unknown requirement {requirement!r}"


def hardware_matches(exp: Expectation, settings: E2ESettings) -> bool:
    """The suite's node is what the example is written for: that layout, nothing set up out of band (an
    example with `nvidiaSmi` steps needs a fresh node: e2e/lib/other_hardware.py)."""
    return exp.hardware == settings.hardware and not exp.nvidiaSmi


def summarize_devices(observed: Observed) -> Mapping[str, list[str]]:
    """pod -> device names, for the demo table."""
    from e2e.lib.expectations import container_devices

    out: dict[str, list[str]] = {}
    for pod in observed.pods:
        names: set[str] = set()
        for ctr in pod["spec"].get("containers", []):
            names |= {d.device for d in container_devices(pod, ctr["name"], observed.claims) if d.is_ours}
        out[pod["metadata"]["name"]] = sorted(names)
    return out
