"""The world's steps against the node (`FaultSteps`): the plugin SIGKILLed at a random moment under calls or
at a named fault point (armed in turn by tests/soak/fault_schedule.py, with the call that reaches it),
restarted gracefully, a GPU falling off the bus and coming back reset, an MPS daemon killed, the API server
unreachable, the checkpoint or CDI directory full. Each fault that lasts has a step that ends it, which the
driver draws more often; each is written in the run's fault timeline (a refusal is explained only by a fault
in force), and the ones the plugin repairs later (a daemon restarted, a GPU's settings put back) open a time
in which those repairs may still be due (`repairs_until`)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from tests.soak.claim_kinds import draw_spec
from tests.soak.fault_schedule import REACHED_BY, Reach
from tests.soak.fault_timeline import GRACE_S
from tests.soak.kubelet_calls import KubeletCalls
from tests.soak.kubelet_view import Phase, SoakClaim
from tests.soak.pacing import MAX_CLAIMS, SETTLE_S
from tests.soak.soak_node import PluginDiedError
from tests.soak.tenants import SHARES_KINDS, expected_share

MAX_SHARE_COMPUTE = 40  # the largest compute share claim_kinds draws


def _compute_of(claim: SoakClaim) -> int:
    return int((claim.results[0].get("consumedCapacity") or {}).get("compute", "0"))


class FaultSteps(KubeletCalls):
    def _repairs_due(self) -> None:
        self.repairs_until = time.monotonic() + SETTLE_S

    def kill_plugin_at_random(self, picks: list[int], delay_ms: int) -> None:
        """SIGKILL the plugin a random moment after calls went out (or while it idles)."""
        self.stats.faults["kill-random"] += 1
        self._repairs_due()
        found = [self.claims[p % len(self.claims)] for p in picks] if self.claims else []
        plans = [(c, self._next_call(c)) for c in {id(c): c for c in found}.values()]
        self._note(f"kill after {delay_ms} ms under {[(c.index, m) for c, m in plans]}")
        if not plans:
            self.soak.kill_plugin()
            self._plugin_died([], killed_by_soak=True)
            return
        self._run_together(plans, kill_after_s=delay_ms / 1000)

    def arm_fault_point(self, point: str, pick: int) -> None:
        """Restart the plugin with a named fault point armed, and make the kubelet call that reaches it, on a
        claim of a kind whose call does (set up first where there is none: allocated, and prepared when the
        point is on the way out). It kills itself when a call reaches the point (this step's, or later)."""
        self.stats.faults["restart"] += 1
        self.stats.faults["armed"] += 1
        self.armed += 1
        self._repairs_due()
        reach = REACHED_BY[point]
        claim = self._claim_reaching(reach, pick) or self._set_up_for(reach, pick)
        self._note(f"arm fault point {point} for claim {claim.index if claim else None}")
        self.soak.stop_plugin()
        try:
            self.soak.start_plugin(kill_at=point)
        except PluginDiedError:
            self._note(f"  plugin died at {point} while starting")
            self._plugin_died([], killed_by_soak=False)
            return
        if claim is None and self.claims:
            claim = self.claims[pick % len(self.claims)]
            self._call(self._next_call(claim), [claim])
        elif claim is not None:
            self._call(reach.method, [claim])

    def _claim_reaching(self, reach: Reach, pick: int) -> SoakClaim | None:
        """A claim whose `reach.method` call passes the point."""
        if reach.method == "prepare":
            found = [
                c
                for c in self.claims
                if c.kind in reach.kinds
                and (
                    c.phase in (Phase.IDLE, Phase.REFUSED)
                    or (c.phase is Phase.IN_DOUBT and c.retry == "prepare")
                )
            ]
        else:
            found = [c for c in self.claims if c.kind in reach.kinds and c.phase is Phase.PREPARED]
            if reach.caps_change:
                found = [c for c in found if self._leaving_shrinks_caps(c)]
        return found[pick % len(found)] if found else None

    def _leaving_shrinks_caps(self, claim: SoakClaim) -> bool:
        """The claim holds its GPU's largest share alone, and a smaller share stays: its leaving shrinks the
        caps of the GPU's shares server."""
        state = self.soak.node.sim_state()
        mine = expected_share(claim, self.facts, state)
        if mine is None:
            return False
        others = [
            expected_share(c, self.facts, state)
            for c in self.claims
            if c is not claim and c.kind in SHARES_KINDS and c.phase in (Phase.PREPARED, Phase.IN_DOUBT)
        ]
        beside = [o for o in others if o is not None and o.gpu == mine.gpu]
        if not beside:
            return False
        return mine.compute > max(o.compute for o in beside) or (mine.memory_mib or 0) > max(
            o.memory_mib or 0 for o in beside
        )

    def _set_up_for(self, reach: Reach, pick: int) -> SoakClaim | None:
        """Make a claim whose call reaches the point: allocate one of a kind that does (prepared too when the
        point is passed on the way out; for a change of caps, two shares of one GPU, the larger one last)."""
        kinds = sorted(reach.kinds & set(self.profile.kinds))
        if not kinds or len(self.claims) >= MAX_CLAIMS - 1:
            return None
        kind = kinds[pick % len(kinds)]
        if reach.caps_change:
            first = self._allocate(kind, pick, lambda compute: compute < MAX_SHARE_COMPUTE)
            floor = _compute_of(first) if first is not None else MAX_SHARE_COMPUTE
            made = [first, self._allocate(kind, pick + 1, lambda compute: compute > floor)]
        else:
            made = [self._allocate(kind, pick)]
        if None in made:
            return None
        if reach.method == "unprepare":
            for claim in made:
                assert claim is not None
                self._call("prepare", [claim])
        return self._claim_reaching(reach, pick)

    def _allocate(
        self, kind: str, pick: int, wanted: Callable[[int], bool] | None = None
    ) -> SoakClaim | None:
        """A new claim of `kind`, drawn from `pick` (for `wanted`: the first draw of a share whose compute it
        accepts)."""
        draw = pick * 1000
        while wanted is not None and draw < pick * 1000 + 50:
            requests = draw_spec(kind, self.profile.hardware, random.Random(draw))["requests"]
            asked = requests[0]["exactly"].get("capacity", {}).get("requests", {})
            if wanted(int(asked.get("compute", 0))):
                break
            draw += 1
        before = len(self.claims)
        self.allocate_claim(self.profile.kinds.index(kind), draw)
        return self.claims[-1] if len(self.claims) > before else None

    def restart_plugin(self) -> None:
        """A graceful restart (an upgrade, a rescheduled pod)."""
        self.stats.faults["restart"] += 1
        self._repairs_due()
        self._note("restart plugin")
        self.soak.stop_plugin()
        self.soak.start_plugin()

    def lose_gpu(self, gpu: int) -> None:
        self.stats.faults["gpu-lost"] += 1
        self._repairs_due()
        self._note(f"GPU {gpu} lost")
        self.timeline.begin("gpu")
        self.soak.lose_gpu(gpu)

    def gpu_back(self) -> None:
        """The GPU is back (a reset): its MIG instances are gone, so its claims with MIG devices are broken;
        their pods fail and the kubelet unprepares them."""
        state = self.soak.node.sim_state()
        back = {state.gpus[i].uuid for i in self.soak.recover_gpus()}
        self.timeline.end("gpu")
        self._repairs_due()
        self._note(f"GPUs back {sorted(back)}")
        for claim in self.claims:
            if claim.explained and any(
                d.gpu_uuid in back and d.mig_placement for d in claim.devices(self.facts)
            ):
                claim.hardware_lost = True

    def kill_mps_daemon(self, pick: int) -> None:
        if self.soak.kill_mps_daemon(pick):
            self.stats.faults["mps-daemon-killed"] += 1
            self.timeline.begin("mps-daemon", lasts_s=GRACE_S["mps-daemon"])
            self._repairs_due()
            self._note("MPS daemon killed")

    def api_server_away(self) -> None:
        self.stats.faults["api-unreachable"] += 1
        self._note("API server unreachable")
        self.timeline.begin("api")
        self.soak.proxy.down()

    def api_server_back(self) -> None:
        self._note("API server back")
        self.soak.proxy.up()
        self.timeline.end("api")

    def fill_disk(self, where: str) -> None:
        self.stats.faults[f"disk-full-{where}"] += 1
        self._note(f"disk full: {where}")
        self.timeline.begin("disk")
        self.soak.fill_disk(where)

    def free_disk(self) -> None:
        self._note("disk freed")
        self.soak.free_disk()
        self.timeline.end("disk")
        self._repairs_due()
