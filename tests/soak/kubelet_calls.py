"""How a kubelet call reaches the plugin and what its answer does to the claims (`KubeletCalls`): one call or
several at once (each in its own thread, with the plugin optionally SIGKILLed under them), each answer moving
its claim's phase (prepared, refused, idle, in doubt), and a plugin that died under a call checked and
started again as its DaemonSet would. Every step that talks to the plugin goes through here, so that all of
them judge answers by the same rules:

- every refusal and every failed call is explained by a fault in force while it ran or by a documented
  conflict (tests/soak/refusals.py), else it is a violation;
- every death of the plugin has a cause: the fault point it was armed with (its log says it killed itself
  there) or the soak's own SIGKILL; a death nobody caused is a violation;
- a claim freshly prepared is queued for its own checks right after the step, with no time to settle."""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.soak.invariants import Violation
from tests.soak.kubelet_view import Phase, SoakClaim
from tests.soak.refusals import causes_of, explain
from tests.soak.run_state import RunState
from tests.soak.soak_node import PluginDiedError


def refusal_reason(error: str) -> str:
    """An error's gist, for the figures: without the claim's name, UUIDs, paths and numbers."""
    text = error.split("): ", 1)[-1]
    text = re.sub(r"[0-9a-fA-F-]{36}|GPU-[0-9a-f-]+|/[^\s:,]+|\d+", "_", text)
    return text[:90]


class KubeletCalls(RunState):
    """Calls to the plugin as the kubelet makes them, and the claims' phases their answers lead to."""

    def _call(self, method: str, claims: list[SoakClaim]) -> dict[str, Any] | None:
        """A kubelet call; None when the plugin died under it (its claims are then in doubt and the plugin
        restarted). The plugin may only die where the soak killed it or armed a fault point."""
        self.stats.calls[method] += 1
        self.touched.update(c.uid for c in claims)
        started = time.monotonic()
        try:
            answers = self.soak.call(method, [c.ref for c in claims])
        except PluginDiedError:
            self._plugin_died([(c, method) for c in claims], killed_by_soak=False)
            return None
        window = (started, time.monotonic())
        for claim in claims:
            self._apply(method, claim, answers.get(claim.uid), window)
        return answers

    def _plugin_died(self, plans: list[tuple[SoakClaim, str]], *, killed_by_soak: bool) -> None:
        """The plugin died (under these calls, or with none in flight): it killed itself at the fault point it
        was armed with, or the soak killed it; anything else is a violation. Its calls' claims are in doubt;
        it is started again, as its DaemonSet would."""
        self._count_death(killed_by_soak=killed_by_soak)
        for claim, method in plans:
            claim.phase, claim.retry = Phase.IN_DOUBT, method
            self.stats.outcomes[f"{method}-cut"] += 1
        self._note(f"  plugin died under {[(c.index, m) for c, m in plans]}")
        self._restart_after_kill()

    def _count_death(self, *, killed_by_soak: bool) -> None:
        plugin = self.soak.plugin
        code = plugin.proc.returncode if plugin is not None else None
        point = self.soak.fault_point_reached()
        if point is not None and code == -signal.SIGKILL:
            self.stats.kills["fault-point"] += 1
            self.stats.fault_points[point] += 1
            self._note(f"  plugin killed itself at fault point {point}")
        elif killed_by_soak and code == -signal.SIGKILL:
            self.stats.kills["random"] += 1
        else:
            tail = plugin.log_tail() if plugin is not None else ""
            why = f"plugin exited with {code}; nobody killed it (armed: {self.soak.armed_step}):\n{tail}"
            self.stats.unexplained_deaths.append(why[:300])
            self._fail(Violation("plugin-died-unexplained", why))

    def _apply(self, method: str, claim: SoakClaim, answer: Any, window: tuple[float, float]) -> None:
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
                if claim.phase is not Phase.PREPARED:
                    self.just_prepared.append(claim)  # its own checks, right after the step
                else:
                    self.prepared_again.append(claim)  # another pod of it: its tenants again
                claim.phase, claim.retry, claim.answer = Phase.PREPARED, None, devices
                claim.pods = max(claim.pods, 1)
                self.stats.outcomes["prepared"] += 1
            elif claim.phase is Phase.PREPARED:
                self._fail(Violation("repeat-prepare-failed", f"claim {claim.index}: {error}"))
            elif claim.phase is Phase.IN_DOUBT:
                self._explain(method, claim, error, window)
                claim.retry = "prepare"  # what was left of the cut call is still there: retried later
                self.stats.outcomes["retry-refused"] += 1
            else:
                cause = self._explain(method, claim, error, window)
                # A full disk can also stop the plugin from undoing what the prepare made (its checkpoint says
                # what is left, for a retry or its stale-claim pass): such a claim may hold things until the
                # kubelet's retry; any other refused claim must have left nothing.
                claim.phase = Phase.IN_DOUBT if cause == "disk" else Phase.REFUSED
                claim.retry = "prepare" if cause == "disk" else None
                self.stats.outcomes["refused"] += 1
                self.stats.refusals[refusal_reason(error)] += 1
        else:
            if not error:
                claim.phase, claim.retry, claim.answer, claim.pods = Phase.IDLE, None, None, 0
                claim.hardware_lost = False
                self.stats.outcomes["unprepared"] += 1
            else:
                self._explain(method, claim, error, window)
                claim.phase, claim.retry = Phase.IN_DOUBT, "unprepare"
                self.stats.outcomes["unprepare-failed"] += 1
        claim.history.append(f"{method}: {refusal_reason(error)[:60] if error else 'ok'}")
        self._note(
            f"  {method} claim {claim.index} ({claim.kind}): {error[:160] or 'ok'} -> {claim.phase.value}"
        )

    def _explain(self, method: str, claim: SoakClaim, error: str, window: tuple[float, float]) -> str:
        """A refused prepare or a failed call must have a cause that was there while it ran; its cause."""
        others = [c for c in self.claims if c is not claim and (c.explained or c.uid in self.touched)]
        cause = explain(error, claim, others, self.facts, self.timeline, window)
        if cause is not None:
            self.stats.explained_by[cause] += 1
            return cause
        detail = (
            f"claim {claim.index} ({claim.kind}): {method} failed with no fault in force and no conflict "
            f"to explain it (causes its text names: {causes_of(error) or 'none'}): {error[:400]}"
        )
        self.stats.unexplained_refusals.append(detail)
        self._fail(Violation("refusal-unexplained", detail))

    def _next_call(self, claim: SoakClaim) -> str:
        """What the kubelet sends for this claim next: its retry, else a prepare or (last pod gone) an
        unprepare."""
        if claim.phase is Phase.IN_DOUBT:
            return claim.retry or "unprepare"
        if claim.phase is Phase.PREPARED and claim.pods <= 1:
            return "unprepare"
        return "prepare"

    def _run_together(
        self,
        plans: list[tuple[SoakClaim, str]],
        kill_after_s: float | None = None,
        raced: Collection[str] = (),
    ) -> None:
        """The calls at once, each in its own thread (one claim each); with `kill_after_s`, SIGKILL the
        plugin that long after they went out."""
        results: list[tuple[SoakClaim, str, Any, tuple[float, float]]] = []
        cut: list[tuple[SoakClaim, str]] = []
        lock = threading.Lock()
        self.touched.update(c.uid for c, _ in plans)

        def one(claim: SoakClaim, method: str) -> None:
            self.stats.calls[method] += 1
            started = time.monotonic()
            try:
                answers = self.soak.call(method, [claim.ref])
            except PluginDiedError:
                with lock:
                    cut.append((claim, method))
                return
            with lock:
                results.append((claim, method, answers.get(claim.uid), (started, time.monotonic())))

        with ThreadPoolExecutor(len(plans)) as pool:
            futures = [pool.submit(one, c, m) for c, m in plans]
            if kill_after_s is not None:
                time.sleep(kill_after_s)
                self.soak.kill_plugin()
            for future in futures:
                future.result()
        # every success first: a refusal that conflicts with a claim prepared by a call beside it is
        # explained by that claim
        results.sort(key=lambda r: bool(r[2] is None or r[2].error))
        for claim, method, answer, window in results:
            if claim.uid in raced:
                # a prepare and an unprepare of one claim raced: which ran first is unknown, so neither
                # answer says what the claim holds now (the caller puts it in doubt: the kubelet unprepares)
                error = "no answer" if answer is None else answer.error
                claim.history.append(f"{method} (raced): {refusal_reason(error)[:60] if error else 'ok'}")
                continue
            self._apply(method, claim, answer, window)
        if cut or kill_after_s is not None:
            self._plugin_died(cut, killed_by_soak=kill_after_s is not None)

    def _restart_after_kill(self) -> None:
        self.soak.stop_plugin(signal.SIGKILL)
        self.soak.start_plugin()
        self.since_kill = 0
