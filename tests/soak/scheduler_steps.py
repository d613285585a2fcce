"""The scheduler's steps (`SchedulerSteps`): a claim of a random kind created and allocated by the project's
allocator beside the claims that exist, and a claim no pod uses deleted. They decide which claims the node's
plugin is asked about; the kubelet's steps (tests/soak/kubelet_steps.py) then prepare and unprepare them."""

from __future__ import annotations

import json
import random
from typing import Any

from tests.soak.claim_kinds import draw_spec
from tests.soak.environment import NAMESPACE
from tests.soak.kubelet_calls import KubeletCalls
from tests.soak.kubelet_view import Phase, SoakClaim


class SchedulerSteps(KubeletCalls):
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

    def _allocated_objects(self) -> list[dict[str, Any]]:
        """The run's claims as the allocator reads allocated claims: what each one holds."""
        return [
            {
                "metadata": {"namespace": c.namespace, "name": c.name},
                "status": {"allocation": {"devices": {"results": list(c.results)}}},
            }
            for c in self.claims
        ]
