"""One node under soak (`SoakRun`): every step the driver may draw (the scheduler's, the kubelet's and the
faults', from tests/soak/*_steps.py), run against the real plugin process over its gRPC socket, and the
checks after them (`after_step`):

1. each claim freshly prepared in the step: its own invariants and its tenants (tests/soak/tenants.py), at
   once: nothing about a claim just prepared may take time to appear;
2. the caps of every shares server, from the daemons' command logs (every cap sent since the last look) and,
   where no claim is in doubt, from what each server holds;
3. the invariants of tests/soak/invariants.py over the whole node;
4. after a fault step, the tenants of every prepared claim; after any other, those of the claims prepared
   again (another pod of a prepared claim).

Only `ASYNC_RULES` (repairs the plugin makes in the background) may take time to heal, and only while a fault
that calls for such a repair is recent (`repairs_until`, at most SETTLE_S after it). `teardown_checks` ends
the faults, unprepares everything, prepares each claim once more (every one must be prepared, now that
nothing is in the way), and then nothing may be left."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from tests.soak.fault_steps import FaultSteps
from tests.soak.invariants import ASYNC_RULES, Violation, check
from tests.soak.kubelet_steps import KubeletSteps
from tests.soak.kubelet_view import Phase, SoakClaim
from tests.soak.scheduler_steps import SchedulerSteps
from tests.soak.tenants import CapsLog, TenantChecks, caps_violations, largest_shares

FAULT_STEPS = frozenset(
    {
        "kill_plugin_at_random",
        "arm_fault_point",
        "restart_plugin",
        "lose_gpu",
        "gpu_back",
        "kill_mps_daemon",
        "api_server_away",
        "api_server_back",
        "fill_disk",
        "free_disk",
    }
)
RECHECK_S = 0.2
REDISCOVERY_WAIT_S = 4.5  # two of the soak plugin's rediscovery intervals: a GPU back is published again


class SoakRun(SchedulerSteps, KubeletSteps, FaultSteps):
    """One node under soak: the steps (methods, drawn by tests/soak/driver.py) and the checks after them."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.tenants = TenantChecks(self.soak)
        self.caps_log = CapsLog.empty()
        self.live_before: set[str] = set()

    def begin_step(self) -> None:
        self.touched = set()
        self.just_prepared = []
        self.prepared_again = []
        self.live_before = {c.uid for c in self.claims if c.explained}

    def after_step(self, name: str) -> None:
        self.since_kill += 1
        self.stats.checks += 1
        self._revive_plugin()
        runs = self.tenants.runs
        try:
            for claim in self.just_prepared:
                if claim.phase is Phase.PREPARED and claim in self.claims:
                    self._require(lambda c=claim: self._own_checks(c), settle=False)  # type: ignore[misc]
            self._require(self._caps_checks, settle=True)
            self._require(lambda: check(self.soak, self.claims, self.facts), settle=True)
            if name in FAULT_STEPS:
                self._require(self._all_tenants, settle=True)
            else:
                again = [
                    c
                    for c in self.prepared_again
                    if c.phase is Phase.PREPARED and c not in self.just_prepared
                ]
                self._require(lambda: self._all_tenants(again), settle=True)
        finally:
            self.stats.workload_checks += self.tenants.runs - runs

    def node_matches_claims(self) -> None:
        """The checks of a step that was no fault (at the start of a node, or after steps a test ran by hand),
        and a fresh start for the next step's."""
        self.after_step("check")
        self.begin_step()

    def _require(self, checks: Callable[[], Sequence[Violation]], *, settle: bool) -> None:
        """Fail on the first violation `checks` finds; with `settle`, violations of the rules the plugin
        repairs in the background are looked at again while such repairs are due, and only about claims
        not freshly prepared."""
        fresh = {c.index for c in self.just_prepared}
        while True:
            violations = list(checks())
            if not violations:
                return
            waiting = settle and time.monotonic() < self.repairs_until
            lasting = [
                v
                for v in violations
                if not waiting
                or (v.rule not in ASYNC_RULES and not v.rule.startswith("tenant-"))
                or v.claim in fresh
            ]
            if lasting:
                self._fail(lasting[0])
            time.sleep(RECHECK_S)
            self._revive_plugin()

    def _own_checks(self, claim: SoakClaim) -> list[Violation]:
        found = [v for v in check(self.soak, self.claims, self.facts) if v.claim == claim.index]
        return found + self.tenants.check(claim, self.claims, self.facts, thorough=True)

    def _all_tenants(self, claims: Sequence[SoakClaim] | None = None) -> list[Violation]:
        """The tenants of every prepared claim (of `claims`) whose GPU is there."""
        lost = self.soak.lost_uuids()
        out: list[Violation] = []
        for claim in self.claims if claims is None else claims:
            if (
                claim.phase is Phase.PREPARED
                and not claim.hardware_lost
                and not claim.gpu_uuids(self.facts) & lost
            ):
                out += self.tenants.check(claim, self.claims, self.facts, thorough=False)
        return out

    def _caps_checks(self) -> list[Violation]:
        """Every cap sent to a shares server since the last look fits the largest share of the claims that
        were live or under a call meanwhile; on a GPU where no claim is in doubt, every server holds exactly
        the largest share of the prepared claims."""
        state = self.soak.node.sim_state()
        window = [c for c in self.claims if c.explained or c.uid in self.touched or c.uid in self.live_before]
        allowed = largest_shares(window, self.facts, state)
        unsettled = self.soak.lost_uuids() | {
            u for c in self.claims if c.phase is Phase.IN_DOUBT for u in c.gpu_uuids(self.facts)
        }
        prepared = largest_shares([c for c in self.claims if c.phase is Phase.PREPARED], self.facts, state)
        settled = {gpu: caps for gpu, caps in prepared.items() if gpu not in unsettled}
        return caps_violations(self.soak, self.caps_log, allowed, settled)

    def _revive_plugin(self) -> None:
        """The plugin may die with no call in flight: its armed fault point reached by its own background work
        (the MPS reconcile pass restarting a daemon). Its DaemonSet would start it again; so does the soak
        (after checking that it was that fault point)."""
        if self.soak.plugin is not None and not self.soak.plugin_alive():
            self._plugin_died([], killed_by_soak=False)

    def teardown_checks(self) -> None:
        """Faults end, the kubelet unprepares every claim (retrying); every claim is then prepared once more
        and must be (nothing is in the way now), its tenants checked, and unprepared; then nothing may be
        left at all."""
        self.soak.free_disk()
        self.timeline.end("disk")
        self.soak.proxy.up()
        self.timeline.end("api")
        if self.soak.lost_gpus:
            self.gpu_back()
            time.sleep(REDISCOVERY_WAIT_S)
        if self.soak.armed_step is not None:
            self.soak.stop_plugin()
            self.soak.start_plugin()
        self._unprepare_all()
        self.node_matches_claims()
        for claim in list(self.claims):
            self.begin_step()
            self._call("prepare", [claim])
            if claim.phase is not Phase.PREPARED:
                self._fail(
                    Violation(
                        "teardown-prepare-refused", f"claim {claim.index} ({claim.kind}): {claim.history[-1]}"
                    )
                )
            self.after_step("teardown-prepare")
            self.begin_step()
            self._call("unprepare", [claim])
            self.after_step("teardown-unprepare")
        self._unprepare_all()
        self.node_matches_claims()

    def _unprepare_all(self) -> None:
        for _ in range(3):
            for claim in self.claims:
                if claim.phase is not Phase.IDLE:
                    self._call("unprepare", [claim])
        stuck = [c.index for c in self.claims if c.phase is not Phase.IDLE]
        if stuck:
            self._fail(Violation("unprepare-stuck", f"claims {stuck} could not be unprepared"))
