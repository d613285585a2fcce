"""`--feature-gates` of the kubelet plugin, in NVIDIA's driver's form (`NAME=true,NAME=false`).

Gates here switch driver behaviour that must follow a cluster setting the plugin cannot read itself:
- DRAListTypeAttributes (alpha, default false): the cluster has the Kubernetes gate of the same name on
  (kube-apiserver and kube-scheduler, 1.36+), so list-typed attributes may be published as lists
  (`resource.kubernetes.io/numaNode` as `ints: [n]`). Without it they go out as scalars.
- ConsumableShares (default false): accepted so that NVIDIA's settings (`ConsumableShares=true` next to
  `--consumable-shares`) work unchanged; NVIDIA's driver needs the gate on before `--consumable-shares` may be
  set, here `--consumable-shares` alone decides, so the gate changes nothing.
"""

from __future__ import annotations

KNOWN_GATES: dict[str, bool] = {"DRAListTypeAttributes": False, "ConsumableShares": False}  # name -> default


def parse_feature_gates(text: str | None) -> dict[str, bool]:
    """Every known gate with its value; ValueError names the bad entry and the known gates."""
    gates = dict(KNOWN_GATES)
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        name, sep, value = item.partition("=")
        if not sep or value.strip().lower() not in ("true", "false"):
            raise ValueError(f"--feature-gates {item!r}: expected NAME=true or NAME=false")
        if name.strip() not in KNOWN_GATES:
            known = ", ".join(KNOWN_GATES)
            raise ValueError(f"--feature-gates {name.strip()!r}: unknown gate; known: {known}")
        gates[name.strip()] = value.strip().lower() == "true"
    return gates
