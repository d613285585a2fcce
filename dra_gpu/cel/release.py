"""Which Kubernetes release the CEL environment models, and what differs between the supported minors.

The DRA selector environment grows per release (k8s.io/dynamic-resource-allocation/cel/compile.go and
k8s.io/apiserver/pkg/cel/environment/base.go). What this project models:
- `includes()` (`<dyn>.includes(<dyn>)`: list membership, or equality for a scalar): in the DRA environment
  only with the DRAListTypeAttributes gate on 1.36; from 1.37 part of Kubernetes' lists library (version 1)
  in every CEL environment, gate or not.
- List attribute values (`ints`, `bools`, `strings`, `versions`; DRAListTypeAttributes, alpha since 1.36 and
  still alpha, off by default, in 1.37) reach CEL as lists. The API server drops them when the gate is off,
  so a slice that carries them comes from a cluster that has it on.
Everything else the supported releases (1.34 to 1.37) share.
"""

from __future__ import annotations

from dataclasses import dataclass

MODELED_RELEASE = (1, 37)  # the newest release whose semantics explain, lint and the CEL environment follow
OLDEST_SUPPORTED = (1, 34)  # resource.k8s.io/v1, the only API version the driver speaks, is GA since 1.34


class ReleaseError(ValueError):
    """A Kubernetes version that cannot be parsed or is not supported; the message says which are."""


def parse_minor(text: str, option: str = "--kubernetes-version") -> tuple[int, int]:
    """'1.37', 'v1.37' or 'v1.37.2' -> (1, 37); a supported minor only."""
    parts = text.strip().removeprefix("v").split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        raise ReleaseError(f"{option} {text!r}: expected MAJOR.MINOR such as 1.37") from None
    if not OLDEST_SUPPORTED <= (major, minor) <= MODELED_RELEASE:
        raise ReleaseError(
            f"{option} {text!r}: supported are {_show(OLDEST_SUPPORTED)} to {_show(MODELED_RELEASE)} "
            "(older releases have no resource.k8s.io/v1; newer ones are not modeled yet)"
        )
    return major, minor


def _show(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


@dataclass(frozen=True)
class CelRelease:
    """The Kubernetes minor a selector is compiled for, and the DRAListTypeAttributes gate."""

    version: tuple[int, int] = MODELED_RELEASE
    list_type_attributes: bool = True

    @property
    def label(self) -> str:
        gate = "on" if self.list_type_attributes else "off"
        return f"Kubernetes {_show(self.version)} (DRAListTypeAttributes {gate})"

    def unavailable(self, function: str) -> str | None:
        """Why `function` does not exist in this release's environment, or None when it does."""
        if function != "includes" or self.version >= (1, 37):
            return None
        if self.version >= (1, 36) and self.list_type_attributes:
            return None
        return "includes() needs Kubernetes 1.37, or 1.36 with the DRAListTypeAttributes feature gate"


NEWEST = CelRelease()
