"""One node under soak (`SoakRun`): every step the driver may draw (the scheduler's, the kubelet's and the
faults', from tests/soak/*_steps.py), run against the real plugin process over its gRPC socket, and the
checks after them: `node_matches_claims` after every step (the invariants of tests/soak/invariants.py, given
time to settle) and `teardown_checks` at the end, when the faults end and nothing may be left.
tests/soak/driver.py draws the steps from a seed, replays them and shrinks a failing run."""

from __future__ import annotations

import time

from tests.soak.fault_steps import FaultSteps
from tests.soak.invariants import Violation, check
from tests.soak.kubelet_steps import KubeletSteps
from tests.soak.kubelet_view import Phase
from tests.soak.pacing import SETTLE_S
from tests.soak.scheduler_steps import SchedulerSteps


class SoakRun(SchedulerSteps, KubeletSteps, FaultSteps):
    """One node under soak: the steps (methods, drawn by tests/soak/driver.py) and the invariants."""

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
