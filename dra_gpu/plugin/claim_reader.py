"""Read ResourceClaims from the API server, as plain JSON dicts (camelCase, as on the wire).

The prepare path only needs a few fields of the claim, so the response is not turned into client models
(`dra_gpu.kube.client.request_json`): less time per Prepare, and no strictness surprises from generated
models.
"""

from __future__ import annotations

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


CLAIM_PATH = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"


class KubeClaimReader:
    """GET of a ResourceClaim over a kubernetes `ApiClient` (`dra_gpu.kube.client.request_json`: the client's
    request layer without the typed API class and its per-call argument validation)."""

    def __init__(
        self,
        api_client: Any,
        *,
        timeout_s: float = 10.0,
        on_wait: Callable[[float], None] | None = None,
    ) -> None:
        self._api_client = api_client
        self._timeout_s = timeout_s
        self._on_wait = on_wait

    def warm_up(self) -> None:
        """Load the API client now (imports, kubeconfig) rather than in the first `get`."""
        from dra_gpu.kube.client import ensure_loaded

        ensure_loaded(self._api_client)

    def get(self, namespace: str, name: str) -> ClaimJson | None:
        from kubernetes.client.exceptions import ApiException

        from dra_gpu.kube.client import request_json

        started = time.perf_counter()
        try:
            claim: ClaimJson = request_json(
                self._api_client,
                "GET",
                CLAIM_PATH,
                {"namespace": namespace, "name": name},
                timeout_s=self._timeout_s,
            )
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
        return claim
