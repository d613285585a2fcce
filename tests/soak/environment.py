"""The control plane a soak runs against (`SoakEnvironment`) and the namespace its claims live in. Apart from
the steps so that the CLI, the pytest fixture and the runs share one way to set it up."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tests.plugin.plugin_harness import ClaimFactory

NAMESPACE = "soak"
ADMIN_ACCESS_LABEL = {"resource.kubernetes.io/admin-access": "true"}


@dataclass(frozen=True)
class SoakEnvironment:
    """The control plane the soak's nodes use."""

    kubeconfig: Path
    api_address: tuple[str, int]  # where the relay of each node forwards to
    api_client: Callable[[], Any]

    @classmethod
    def of(cls, plane: Any) -> SoakEnvironment:
        """For a tests.support.control_plane.ControlPlane; makes the soak's namespace (admin access
        allowed)."""
        url = urlparse(plane.url)
        ClaimFactory(plane.api_client(), "soak").namespace(NAMESPACE, ADMIN_ACCESS_LABEL)
        return cls(plane.kubeconfig, (url.hostname or "127.0.0.1", url.port or 443), plane.api_client)
