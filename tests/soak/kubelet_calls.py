"""How a kubelet call reaches the plugin and what its answer does to the claims (`KubeletCalls`): one call or
several at once (each in its own thread, with the plugin optionally SIGKILLed under them), each answer moving
its claim's phase (prepared, refused, idle, in doubt), and a plugin that died under a call checked (killed,
never crashed) and started again as its DaemonSet would. Every step that talks to the plugin goes through
here, so that all of them judge answers by the same rules."""

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
