"""Read ResourceClaims from the API server, as plain JSON dicts (camelCase, as on the wire).

The prepare path only needs a few fields of the claim, so the response is not turned into client models
(`_preload_content=False`): less time per Prepare, and no strictness surprises from generated models.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

ClaimJson = dict[str, Any]


class ClaimReadError(Exception):
    """The API server could not be asked (network, auth, 5xx); the message names the claim and the cause."""


class ClaimReader(Protocol):
    def get(self, namespace: str, name: str) -> ClaimJson | None:
        """The claim, or None when it does not exist. Raises ClaimReadError on any other failure."""
        ...

    def warm_up(self) -> None:
        """Load what `get` needs (called once, off the start-up path)."""
        ...


class KubeClaimReader:
    """`ResourceV1Api.read_namespaced_resource_claim` over a kubernetes `ApiClient`."""

    def __init__(
        self,
        api_client: Any,
        *,
        timeout_s: float = 10.0,
        on_wait: Callable[[float], None] | None = None,
    ) -> None:
        self._api_client = api_client
        self._api: Any = None  # ResourceV1Api, made on first use: its import is ~0.4 s of a plugin's start
        self._api_lock = threading.Lock()
        self._timeout_s = timeout_s
        self._on_wait = on_wait

    def warm_up(self) -> None:
        """Load the API client now rather than in the first `get`."""
        self._resource_api()

    def _resource_api(self) -> Any:
        with self._api_lock:
            if self._api is None:
                from kubernetes.client import ResourceV1Api

                self._api = ResourceV1Api(self._api_client)
            return self._api

    def get(self, namespace: str, name: str) -> ClaimJson | None:
        from kubernetes.client.exceptions import ApiException

        started = time.perf_counter()
        try:
            response: Any = self._resource_api().read_namespaced_resource_claim(
                name, namespace, _preload_content=False, _request_timeout=self._timeout_s
            )
            body = response.data
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise ClaimReadError(
                f"reading ResourceClaim {namespace}/{name}: API server answered {exc.status} {exc.reason}"
            ) from exc
        except Exception as exc:  # urllib3 / socket errors: the API server is unreachable
            raise ClaimReadError(f"reading ResourceClaim {namespace}/{name}: {exc}") from exc
        finally:
            if self._on_wait is not None:
                self._on_wait(time.perf_counter() - started)
        claim: ClaimJson = json.loads(body)
        return claim
