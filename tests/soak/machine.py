"""One node under soak and its steps: each step is what a kubelet, the scheduler or the world around the node
(a fault) does, run against the real plugin process over its gRPC socket; `node_matches_claims` checks the
invariants (tests/soak/invariants.py) after every step. tests/soak/driver.py draws the steps from a seed,
replays them and shrinks a failing run."""

from __future__ import annotations

import contextlib
import json
import random
import re
import signal
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tests.plugin.plugin_harness import ClaimFactory
from tests.soak.allocation import SchedulerModel
from tests.soak.claim_kinds import draw_spec
from tests.soak.invariants import Violation, check
from tests.soak.kubelet_view import Phase, SoakClaim, device_facts
from tests.soak.profiles import Profile, node_slices
from tests.soak.soak_node import PluginDiedError, SoakNode
from tests.soak.stats import SoakStats

NAMESPACE = "soak"
ADMIN_ACCESS_LABEL = {"resource.kubernetes.io/admin-access": "true"}


@dataclass(frozen=True)
class SoakEnvironment:
    """The control plane the soak's nodes use."""

    kubeconfig: Path
    api_address: tuple[str, int]  # where the relay of each node forwards to
    api_client: Callable[[], Any]

    @classmethod
    def of(cls, plane: Any) -> SoakEnvironment:
        """For a tests.support.control_plane.ControlPlane; makes the soak's namespace (admin access
        allowed)."""
        url = urlparse(plane.url)
        ClaimFactory(plane.api_client(), "soak").namespace(NAMESPACE, ADMIN_ACCESS_LABEL)
        return cls(plane.kubeconfig, (url.hostname or "127.0.0.1", url.port or 443), plane.api_client)


MAX_CLAIMS = 20  # allocated at once (the node's eight GPUs fill up well before)
SETTLE_S = 6.0  # how long a broken invariant may take to heal (a killed daemon restarted, a mode restored)
FAULT_GAP = 3  # steps between two plugin kills, so that most steps run against a plugin that lives
# The plugin's named fault points (dra_gpu/plugin/fault_injection.py, the sharing manager's and MPS's).
FAULT_POINTS = (
    "prepare-started",
    "prepare-group-0-applied",
    "prepare-group-0",
    "prepare-group-1-applied",
    "prepare-group-1",
    "prepare-cdi-written",
    "prepare-completed",
    "unprepare-group-0",
    "unprepare-group-1",
    "unprepare-cdi-removed",
    "time-slice-recorded",
    "shares-client-added",
    "shares-client-removed",
    "mps-record-written",
    "mps-shm-mounted",
    "mps-compute-mode-set",
    "mps-daemon-started",
    "mps-limits-set",
    "mps-daemon-placed",
    "mps-limits-recorded",
    "mps-quit-sent",
    "mps-shm-unmounted",
    "mps-modes-restored",
)


def refusal_reason(error: str) -> str:
    """An error's gist, for the figures: without the claim's name, UUIDs, paths and numbers."""
    text = error.split("): ", 1)[-1]
    text = re.sub(r"[0-9a-fA-F-]{36}|GPU-[0-9a-f-]+|/[^\s:,]+|\d+", "_", text)
    return text[:90]


class InvariantBrokenError(AssertionError):
    def __init__(self, violation: Violation, message: str) -> None:
        super().__init__(message)
        self.violation = violation


class SoakRun:
    """One node under soak: the steps (methods, drawn by tests/soak/driver.py) and the invariants."""

    def __init__(self, profile: Profile, environment: SoakEnvironment, stats: SoakStats) -> None:
        from kubernetes import client

        self.profile, self.stats = profile, stats
        self.kubeconfig, self.api_address = environment.kubeconfig, environment.api_address
        self.api_client_factory = environment.api_client
        self.stats.runs += 1
        self.soak = SoakNode(self.profile, self.kubeconfig, *self.api_address)
        self.api: Any = client.ResourceV1Api(self.api_client_factory())
        slices = node_slices(self.profile, self.soak.node)
        self.facts = device_facts(slices)
        self.scheduler = SchedulerModel(self.soak.node.name, slices)
        self.claims: list[SoakClaim] = []
        self.deleted: list[SoakClaim] = []  # for failure reports
        self.created = 0
        self.since_kill = FAULT_GAP
        self.log: list[str] = []
        self.soak.start_plugin()

    # ------------------------------------------------------------------------------------------ helpers

    def _note(self, line: str) -> None:
        self.log.append(line)
        del self.log[:-200]

    def _pick(self, pick: int, phases: tuple[Phase, ...]) -> SoakClaim | None:
        found = [c for c in self.claims if c.phase in phases]
        return found[pick % len(found)] if found else None

    def _allocated_objects(self) -> list[dict[str, Any]]:
        return [
            {
                "metadata": {"namespace": c.namespace, "name": c.name},
                "status": {"allocation": {"devices": {"results": list(c.results)}}},
            }
            for c in self.claims
        ]

    def _call(self, method: str, claims: list[SoakClaim]) -> dict[str, Any] | None:
        """A kubelet call; None when the plugin died under it (its claims are then in doubt and the plugin
        restarted). The plugin may only die where the soak killed it or armed a fault point."""
        self.stats.calls[method] += 1
        try:
            answers = self.soak.call(method, [c.ref for c in claims])
        except PluginDiedError:
            self._died_under(method, claims)
            return None
        for claim in claims:
            self._apply(method, claim, answers.get(claim.uid))
        return answers

    def _died_under(self, method: str, claims: list[SoakClaim]) -> None:
        self._mark_cut([(c, method) for c in claims], killed_by_soak=False)

    def _mark_cut(self, plans: list[tuple[SoakClaim, str]], *, killed_by_soak: bool) -> None:
        """The plugin died under these calls: it must have been killed (by the soak, or at the fault point
        it was started with), never crashed. Their claims are in doubt; the plugin is started again, as its
        DaemonSet would."""
        plugin = self.soak.plugin
        code = plugin.proc.returncode if plugin is not None else None
        if code != -signal.SIGKILL:
            tail = plugin.log_tail() if plugin is not None else ""
            self._fail(Violation("plugin-crashed", f"plugin exited with {code}:\n{tail}"))
        if not killed_by_soak:
            self.stats.faults[f"kill-at:{self.soak.armed_step}"] += 1
        for claim, method in plans:
            claim.phase, claim.retry = Phase.IN_DOUBT, method
            self.stats.outcomes[f"{method}-cut"] += 1
        self._note(f"  plugin died under {[(c.index, m) for c, m in plans]}")
        self._restart_after_kill()

    def _apply(self, method: str, claim: SoakClaim, answer: Any) -> None:
        error = "no answer for the claim" if answer is None else answer.error
        if method == "prepare":
            if not error:
                devices = tuple(
                    (tuple(d.request_names), d.pool_name, d.device_name, tuple(d.cdi_device_ids))
                    for d in answer.devices
                )
                if claim.phase is Phase.PREPARED and claim.answer != devices:
                    self._fail(
                        Violation("answer-changed", f"claim {claim.index}: {claim.answer} -> {devices}")
                    )
                claim.phase, claim.retry, claim.answer = Phase.PREPARED, None, devices
                claim.pods = max(claim.pods, 1)
                self.stats.outcomes["prepared"] += 1
            elif claim.phase is Phase.PREPARED:
                self._fail(Violation("repeat-prepare-failed", f"claim {claim.index}: {error}"))
            elif claim.phase is Phase.IN_DOUBT:
                claim.retry = "prepare"  # what was left of the cut call is still there: retried later
                self.stats.outcomes["retry-refused"] += 1
            else:
                claim.phase = Phase.REFUSED
                self.stats.outcomes["refused"] += 1
                self.stats.refusals[refusal_reason(error)] += 1
        else:
            if not error:
                claim.phase, claim.retry, claim.answer, claim.pods = Phase.IDLE, None, None, 0
                claim.hardware_lost = False
                self.stats.outcomes["unprepared"] += 1
            else:
                claim.phase, claim.retry = Phase.IN_DOUBT, "unprepare"
                self.stats.outcomes["unprepare-failed"] += 1
        claim.history.append(f"{method}: {refusal_reason(error)[:60] if error else 'ok'}")
        self._note(
            f"  {method} claim {claim.index} ({claim.kind}): {error[:160] or 'ok'} -> {claim.phase.value}"
        )

    def _next_call(self, claim: SoakClaim) -> str:
        """What the kubelet sends for this claim next: its retry, else a prepare or (last pod gone) an
        unprepare."""
        if claim.phase is Phase.IN_DOUBT:
            return claim.retry or "unprepare"
        if claim.phase is Phase.PREPARED and claim.pods <= 1:
            return "unprepare"
        return "prepare"

    def _fail(self, violation: Violation) -> None:
        self.stats.violations.append(str(violation))
        recent = "\n".join(self.log[-40:])
        plugin_log = ""
        logs = sorted(self.soak.node.base.glob("plugin-*.log"))
        for path in logs[-2:]:
            lines = [
                line
                for line in path.read_text(errors="replace").splitlines()
                if '"level": "warning"' in line or '"level": "error"' in line or "fault injection" in line
            ]
            plugin_log += f"\n--- {path.name} (warnings, errors):\n" + "\n".join(lines[-12:])
        raise InvariantBrokenError(
            violation,
            f"soak invariant broken (SOAK_SEED={self.stats.seed}, profile {self.profile.name}): {violation}\n"
            f"node {self.soak.node.base}; last steps:\n{recent}{plugin_log}\n"
            f"--- claims:\n{self._claims_table()}",
        )

    def _claims_table(self) -> str:
        return "\n".join(
            f"claim {c.index} ({c.kind}) {c.phase.value} {[r['device'] for r in c.results]}: "
            + "; ".join(c.history[-6:])
            + (" (deleted)" if c in self.deleted else "")
            for c in sorted(self.claims + self.deleted[-20:], key=lambda c: c.index)
        )

    # -------------------------------------------------------------------------------- the scheduler

    def allocate_claim(self, kind: int, draw: int) -> None:
        """A claim of a random kind, allocated by the allocator beside the claims that exist."""
        kind_name = self.profile.kinds[kind % len(self.profile.kinds)]
        self.created += 1
        name = f"c{self.created}-{kind_name}"
        devices = draw_spec(kind_name, self.profile.hardware, random.Random(draw))
        # the claim's spec has no `source`; the allocation's copy says where each config came from
        configs = [{"source": "FromClaim", **c} for c in devices.get("config") or ()]
        if devices.get("config"):
            devices["config"] = [{k: v for k, v in c.items() if k != "source"} for c in devices["config"]]
        spec = {"devices": devices}
        obj: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim"}
        obj["metadata"] = {"name": name, "namespace": NAMESPACE}
        obj["spec"] = spec
        results = self.scheduler.allocate(obj, self._allocated_objects())
        if results is None:
            self.stats.outcomes["unallocatable"] += 1
            return
        for r in results:
            r["pool"] = self.soak.node.name
        created = json.loads(
            self.api.create_namespaced_resource_claim(NAMESPACE, obj, _preload_content=False).data
        )
        allocation = {
            "devices": {"results": results, "config": configs},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [self.soak.node.name]}
                        ]
                    }
                ]
            },
        }
        self.api.patch_namespaced_resource_claim_status(
            name,
            NAMESPACE,
            {"status": {"allocation": allocation}},
            _content_type="application/merge-patch+json",
            _preload_content=False,
        )
        claim = SoakClaim(
            self.created, kind_name, name, NAMESPACE, created["metadata"]["uid"], results, configs
        )
        self.claims.append(claim)
        self.stats.claims[kind_name] += 1
        self._note(f"allocate claim {claim.index} ({kind_name}): {[r['device'] for r in results]}")

    def delete_claim(self, pick: int, again: bool) -> None:
        """A claim no pod uses any more is deleted (its allocation goes back to the scheduler); the kubelet
        may send one more unprepare first (a duplicate: it must change nothing and succeed)."""
        claim = self._pick(pick, (Phase.IDLE, Phase.REFUSED))
        if claim is None:
            return
        if again and self._call("unprepare", [claim]) is None:
            return
        if claim.phase is not Phase.IDLE and claim.phase is not Phase.REFUSED:
            return
        self.api.delete_namespaced_resource_claim(claim.name, NAMESPACE, _preload_content=False)
        self.claims.remove(claim)
        self.deleted.append(claim)
        self._note(f"delete claim {claim.index}")

    # ---------------------------------------------------------------------------------- the kubelet

    def start_pod(self, pick: int) -> None:
        """A pod that uses a claim starts: the kubelet prepares it (again, if another pod already did: a
        repeated call must give the same answer)."""
        claim = self._pick(pick, (Phase.IDLE, Phase.REFUSED, Phase.PREPARED))
        if claim is None:
            return
        self._note(f"start pod of claim {claim.index}")
        was_prepared = claim.phase is Phase.PREPARED
        if self._call("prepare", [claim]) is not None and claim.phase is Phase.PREPARED and was_prepared:
            claim.pods = min(claim.pods + 1, 3)

    def stop_pod(self, pick: int) -> None:
        """A pod ends; after the last one of a claim the kubelet unprepares it."""
        claim = self._pick(pick, (Phase.PREPARED,))
        if claim is None:
            return
        claim.pods -= 1
        self._note(f"stop pod of claim {claim.index} ({claim.pods} left)")
        if claim.pods <= 0:
            self._call("unprepare", [claim])

    def kubelet_retry(self, pick: int) -> None:
        """The kubelet repeats a call that failed or was cut short."""
        claim = self._pick(pick, (Phase.IN_DOUBT, Phase.REFUSED))
        if claim is None:
            return
        self._note(f"retry {self._next_call(claim)} of claim {claim.index}")
        self._call(self._next_call(claim), [claim])

    def prepare_together(self, pick: int) -> None:
        """One NodePrepareResources for several claims (a pod with several claims)."""
        idle = [c for c in self.claims if c.phase in (Phase.IDLE, Phase.REFUSED)]
        if len(idle) < 2:
            return
        start = pick % len(idle)
        chosen = (idle + idle)[start : start + min(3, len(idle))]
        self._note(f"prepare together {[c.index for c in chosen]}")
        self._call("prepare", chosen)

    def concurrent_calls(self, picks: list[int]) -> None:
        """Several kubelet calls at once (pods starting and ending together); the same claim twice makes a
        duplicate, or a prepare and an unprepare racing (reordered): that claim is then in doubt and the
        kubelet unprepares it."""
        if not self.claims:
            return
        chosen = [self.claims[p % len(self.claims)] for p in picks]
        plans: list[tuple[SoakClaim, str]] = []
        raced: set[str] = set()
        for claim in chosen:
            method = self._next_call(claim)
            if any(c is claim for c, _ in plans):  # the same claim again: the other call, racing the first
                method = "prepare" if method == "unprepare" else "unprepare"
                raced.add(claim.uid)
            plans.append((claim, method))
        self._note(f"concurrent {[(c.index, m) for c, m in plans]}")
        self._run_together(plans, raced=raced)
        for claim in chosen:
            if claim.uid in raced and claim.phase is not Phase.IN_DOUBT:
                claim.phase, claim.retry = Phase.IN_DOUBT, "unprepare"

    def _run_together(
        self,
        plans: list[tuple[SoakClaim, str]],
        kill_after_s: float | None = None,
        raced: Collection[str] = (),
    ) -> None:
        """The calls at once, each in its own thread (one claim each); with `kill_after_s`, SIGKILL the
        plugin that long after they went out."""
        results: list[tuple[SoakClaim, str, Any]] = []
        cut: list[tuple[SoakClaim, str]] = []
        lock = threading.Lock()

        def one(claim: SoakClaim, method: str) -> None:
            self.stats.calls[method] += 1
            try:
                answers = self.soak.call(method, [claim.ref])
            except PluginDiedError:
                with lock:
                    cut.append((claim, method))
                return
            with lock:
                results.append((claim, method, answers.get(claim.uid)))

        with ThreadPoolExecutor(len(plans)) as pool:
            futures = [pool.submit(one, c, m) for c, m in plans]
            if kill_after_s is not None:
                time.sleep(kill_after_s)
                self.soak.kill_plugin()
            for future in futures:
                future.result()
        for claim, method, answer in results:  # in the order the answers came
            if claim.uid in raced:
                # a prepare and an unprepare of one claim raced: which ran first is unknown, so neither
                # answer says what the claim holds now (the caller puts it in doubt: the kubelet unprepares)
                error = "no answer" if answer is None else answer.error
                claim.history.append(f"{method} (raced): {refusal_reason(error)[:60] if error else 'ok'}")
                continue
            self._apply(method, claim, answer)
        if cut or kill_after_s is not None:
            self._mark_cut(cut, killed_by_soak=kill_after_s is not None)

    def _restart_after_kill(self) -> None:
        self.soak.stop_plugin(signal.SIGKILL)
        self.soak.start_plugin()
        self.since_kill = 0

    # ------------------------------------------------------------------------------------------- faults

    def kill_plugin_at_random(self, picks: list[int], delay_ms: int) -> None:
        """SIGKILL the plugin a random moment after calls went out (or while it idles)."""
        self.stats.faults["kill-random"] += 1
        found = [self.claims[p % len(self.claims)] for p in picks] if self.claims else []
        plans = [(c, self._next_call(c)) for c in {id(c): c for c in found}.values()]
        self._note(f"kill after {delay_ms} ms under {[(c.index, m) for c, m in plans]}")
        if not plans:
            self.soak.kill_plugin()
            self._restart_after_kill()
            return
        self._run_together(plans, kill_after_s=delay_ms / 1000)

    def arm_fault_point(self, point: str, pick: int) -> None:
        """Restart the plugin with a named fault point armed: it kills itself when a call reaches it (this
        step's call, or a later one)."""
        self.stats.faults["restart"] += 1
        self._note(f"arm fault point {point}")
        self.soak.stop_plugin()
        try:
            self.soak.start_plugin(kill_at=point)
        except PluginDiedError:
            self.stats.faults[f"kill-at:{point}"] += 1
            self._note(f"  plugin died at {point} while starting")
            self._restart_after_kill()
            return
        if self.claims:
            claim = self.claims[pick % len(self.claims)]
            self._call(self._next_call(claim), [claim])

    def restart_plugin(self) -> None:
        """A graceful restart (an upgrade, a rescheduled pod)."""
        self.stats.faults["restart"] += 1
        self._note("restart plugin")
        self.soak.stop_plugin()
        self.soak.start_plugin()

    def lose_gpu(self, gpu: int) -> None:
        self.stats.faults["gpu-lost"] += 1
        self._note(f"GPU {gpu} lost")
        self.soak.lose_gpu(gpu)

    def gpu_back(self) -> None:
        """The GPU is back (a reset): its MIG instances are gone, so its claims with MIG devices are broken;
        their pods fail and the kubelet unprepares them."""
        state = self.soak.node.sim_state()
        back = {state.gpus[i].uuid for i in self.soak.recover_gpus()}
        self._note(f"GPUs back {sorted(back)}")
        for claim in self.claims:
            if claim.explained and any(
                d.gpu_uuid in back and d.mig_placement for d in claim.devices(self.facts)
            ):
                claim.hardware_lost = True

    def kill_mps_daemon(self, pick: int) -> None:
        if self.soak.kill_mps_daemon(pick):
            self.stats.faults["mps-daemon-killed"] += 1
            self._note("MPS daemon killed")

    def api_server_away(self) -> None:
        self.stats.faults["api-unreachable"] += 1
        self._note("API server unreachable")
        self.soak.proxy.down()

    def api_server_back(self) -> None:
        self._note("API server back")
        self.soak.proxy.up()

    def fill_disk(self, where: str) -> None:
        self.stats.faults[f"disk-full-{where}"] += 1
        self._note(f"disk full: {where}")
        self.soak.fill_disk(where)

    def free_disk(self) -> None:
        self._note("disk freed")
        self.soak.free_disk()

    # ----------------------------------------------------------------------------------- invariants

    def node_matches_claims(self) -> None:
        self.since_kill += 1
        self.stats.checks += 1
        self._revive_plugin()
        violations = check(self.soak, self.claims, self.facts)
        deadline = time.monotonic() + SETTLE_S
        while violations and time.monotonic() < deadline:
            time.sleep(0.2)
            self._revive_plugin()
            violations = check(self.soak, self.claims, self.facts)
        if violations:
            self._fail(violations[0])

    def close(self) -> None:
        for claim in self.claims:
            with contextlib.suppress(Exception):
                self.api.delete_namespaced_resource_claim(claim.name, NAMESPACE, _preload_content=False)
        self.soak.close()

    def _revive_plugin(self) -> None:
        """The plugin may die with no call in flight: its armed fault point reached by its own background work
        (the MPS reconcile pass restarting a daemon). Its DaemonSet would start it again; so does the soak
        (after checking that it was that SIGKILL, not a crash)."""
        if self.soak.plugin is not None and not self.soak.plugin_alive():
            self._mark_cut([], killed_by_soak=False)

    def teardown_checks(self) -> None:
        """Faults end, the kubelet unprepares every claim (retrying), and then nothing may be left at all."""
        self.soak.free_disk()
        self.soak.proxy.up()
        if self.soak.lost_gpus:
            self.gpu_back()
        if self.soak.armed_step is not None:
            self.soak.stop_plugin()
            self.soak.start_plugin()
        for _ in range(3):
            for claim in self.claims:
                if claim.phase is not Phase.IDLE:
                    self._call("unprepare", [claim])
        stuck = [c.index for c in self.claims if c.phase is not Phase.IDLE]
        if stuck:
            self._fail(Violation("unprepare-stuck", f"claims {stuck} could not be unprepared"))
        self.node_matches_claims()
