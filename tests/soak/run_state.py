"""What one run of the soak knows about its node (`RunState`): the simulated node and its plugin, the claims
as the kubelet and the scheduler see them, a log of recent steps, and how a broken invariant is reported
(`InvariantBrokenError`, with the seed, the last steps, the plugin's warnings and every claim's history).
The steps (tests/soak/*_steps.py) build on it."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, NoReturn

from tests.soak.allocation import SchedulerModel
from tests.soak.environment import NAMESPACE, SoakEnvironment
from tests.soak.fault_timeline import FaultTimeline
from tests.soak.invariants import Violation
from tests.soak.kubelet_view import Phase, SoakClaim, device_facts
from tests.soak.pacing import FAULT_GAP
from tests.soak.profiles import Profile, node_slices
from tests.soak.soak_node import SoakNode
from tests.soak.stats import SoakStats


def node_name(node_seed: int) -> str:
    return f"soak-{node_seed:08x}"


class InvariantBrokenError(AssertionError):
    def __init__(self, violation: Violation, message: str) -> None:
        super().__init__(message)
        self.violation = violation


class RunState:
    """One node under soak, started with its plugin: the state every family of steps reads and changes."""

    def __init__(
        self,
        profile: Profile,
        environment: SoakEnvironment,
        stats: SoakStats,
        node_seed: int = 0,
        plugin_env: Mapping[str, str] | None = None,
    ) -> None:
        """`node_seed` names the node, and the name seeds its simulated hardware: the same seed, the same
        node. `plugin_env`: more of the plugin's environment (a test-only injected bug)."""
        from kubernetes import client

        self.profile, self.stats = profile, stats
        self.kubeconfig, self.api_address = environment.kubeconfig, environment.api_address
        self.api_client_factory = environment.api_client
        self.stats.runs += 1
        name = node_name(node_seed)
        self.stats.nodes.append(name)
        self.soak = SoakNode(self.profile, self.kubeconfig, *self.api_address, name, plugin_env)
        self.api: Any = client.ResourceV1Api(self.api_client_factory())
        slices = node_slices(self.profile, self.soak.node)
        self.facts = device_facts(slices)
        self.scheduler = SchedulerModel(self.soak.node.name, slices)
        self.claims: list[SoakClaim] = []
        self.deleted: list[SoakClaim] = []  # for failure reports
        self.created = 0
        self.since_kill = FAULT_GAP
        self.log: list[str] = []
        self.timeline = FaultTimeline()  # when each injected fault was in force (explains refusals)
        self.touched: set[str] = set()  # uids of the claims under a call in the step under way
        self.just_prepared: list[SoakClaim] = []  # claims freshly prepared in that step: checked right after
        self.prepared_again: list[SoakClaim] = []  # claims prepared again in that step (another pod)
        self.repairs_until = 0.0  # until then (time.monotonic()), repairs the plugin makes later may be due
        self.armed = 0  # fault points armed so far on this node
        self.soak.start_plugin()

    def close(self) -> None:
        for claim in self.claims:
            with contextlib.suppress(Exception):
                self.api.delete_namespaced_resource_claim(claim.name, NAMESPACE, _preload_content=False)
        self.soak.close()

    def _note(self, line: str) -> None:
        self.log.append(line)
        del self.log[:-200]

    def _pick(self, pick: int, phases: tuple[Phase, ...]) -> SoakClaim | None:
        found = [c for c in self.claims if c.phase in phases]
        return found[pick % len(found)] if found else None

    def _fail(self, violation: Violation) -> NoReturn:
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
