"""The CEL matchConditions that decide which admission requests reach the webhook at all (pure data).

With `failurePolicy: Fail`, every request the webhook configuration matches is refused while the webhook is
unreachable. These conditions keep that blast radius to the objects the webhook has something to say about:

- `has-gpu-nvidia-com-config`: the object carries an opaque config for driver gpu.nvidia.com at the place its
  kind keeps configs (see review.CONFIG_PATHS). Claims for other drivers, and claims without opaque config,
  never wait for our webhook.
- `spec-changed-on-update`: an UPDATE goes to the webhook only when the spec changed. Finalizer removal,
  label/annotation edits and deletion bookkeeping never do, so an object stored before a rule tightened can
  always be cleaned up and deleted.

Every `has()` guard matters: an expression that errors counts as a webhook failure, and with Fail that refuses
the request, the opposite of what the conditions are for. The Helm chart renders this same list
(tests/deploy/test_chart.py checks that they agree); the apiserver integration test installs it verbatim.
"""

from __future__ import annotations

from typing import Final

from dra_gpu.inventory.model import DRIVER_NAME

_OURS = f"has(c.opaque) && c.opaque.driver == '{DRIVER_NAME}'"

HAS_OUR_CONFIG: Final = " || ".join(
    [
        "(request.kind.kind == 'ResourceClaim' && has(object.spec) && has(object.spec.devices)"
        f" && has(object.spec.devices.config) && object.spec.devices.config.exists(c, {_OURS}))",
        "(request.kind.kind == 'ResourceClaimTemplate' && has(object.spec) && has(object.spec.spec)"
        " && has(object.spec.spec.devices) && has(object.spec.spec.devices.config)"
        f" && object.spec.spec.devices.config.exists(c, {_OURS}))",
        "(request.kind.kind == 'DeviceClass' && has(object.spec) && has(object.spec.config)"
        f" && object.spec.config.exists(c, {_OURS}))",
    ]
)

SPEC_CHANGED_ON_UPDATE: Final = (
    "request.operation != 'UPDATE' || !has(oldObject.spec) || !has(object.spec)"
    " || oldObject.spec != object.spec"
)

MATCH_CONDITIONS: Final[tuple[dict[str, str], ...]] = (
    {"name": "has-gpu-nvidia-com-config", "expression": HAS_OUR_CONFIG},
    {"name": "spec-changed-on-update", "expression": SPEC_CHANGED_ON_UPDATE},
)
