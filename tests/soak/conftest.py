"""`soak_env`: the session's API server, set up for soak nodes (their namespace, admin access allowed)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.soak.environment import SoakEnvironment


@pytest.fixture(scope="session")
def soak_env(kube_apiserver: Any) -> SoakEnvironment:
    return SoakEnvironment.of(kube_apiserver)
