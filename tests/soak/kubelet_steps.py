"""The kubelet's steps (`KubeletSteps`): the claim lifecycle as pods start and end: a pod's claim prepared
(again, for a second pod), unprepared after its last pod, a failed or cut call retried, several claims
prepared in one call, and calls sent concurrently, racing a prepare against an unprepare of one claim.
The answers are judged in tests/soak/kubelet_calls.py."""

from __future__ import annotations

from tests.soak.kubelet_calls import KubeletCalls
from tests.soak.kubelet_view import Phase, SoakClaim


class KubeletSteps(KubeletCalls):
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
