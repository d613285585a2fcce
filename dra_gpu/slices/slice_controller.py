"""Keeps this node's ResourceSlices published: reconcile on start, on inventory change, on every foreign
change.

Threads: a worker that lists the node's slices and applies `slice_sync.plan_sync` (debounced, retried with
exponential back-off on API errors, and re-run every `resync_period` seconds anyway), and a watcher that
watches the
same slices (field selectors `spec.driver`, `spec.nodeName`) and wakes the worker on any change we did not
make
ourselves: the kubelet wiping the node's slices (DeleteCollection), a hand edit, a deletion.

It reads the server version once to pick the slice layout (1.34 vs 1.35+) and the Node UID for ownerReferences
(the
garbage collector then deletes the slices with the Node). Fields the server drops (a feature gate such as
DRAPartitionableDevices or DRAConsumableCapacity off) are reported once and not rewritten forever.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from dra_gpu.inventory.model import DRIVER_NAME, DeviceModel
from dra_gpu.kube.client import node_uid, request, request_json, server_version
from dra_gpu.slices.slice_builder import build_slices
from dra_gpu.slices.slice_sync import SyncPlan, comparable, plan_sync
from dra_gpu.slices.slice_validation import check_slices

log = logging.getLogger(__name__)

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
SLICE = SLICES + "/{name}"


@dataclass
class ApiCallCounts:
    """API calls made, by verb; writes = create + update + delete."""

    list: int = 0
    create: int = 0
    update: int = 0
    delete: int = 0
    get: int = 0
    watch: int = 0

    @property
    def writes(self) -> int:
        return self.create + self.update + self.delete


@dataclass
class SyncStatus:
    syncs: int = 0
    last_error: str | None = None
    generation: int = 0
    published: list[str] = field(default_factory=list)  # slice names at the last successful sync
    dropped_fields_warning: str | None = None


class SliceController:
    def __init__(
        self,
        api_client: client.ApiClient,
        driver_name: str,
        node_name: str,
        model_provider: Callable[[], DeviceModel],
        *,
        kubernetes_version: tuple[int, int] | None = None,
        list_type_attributes: bool = False,
        sync_delay: float = 0.1,
        resync_period: float = 30.0,
        backoff_initial: float = 0.2,
        backoff_max: float = 30.0,
        watch_timeout: int = 60,
    ) -> None:
        self._api_client = api_client  # raw JSON through kube.client.request(_json), not typed models
        self.driver_name = driver_name or DRIVER_NAME
        self.node_name = node_name
        self._model_provider = model_provider
        self._kubernetes_version = kubernetes_version
        # The cluster has DRAListTypeAttributes on (driver flag, as in NVIDIA's driver): list attributes go
        # out as lists on 1.36+ (build_slices checks the release), else one-element lists as scalars.
        self._list_type_attributes = list_type_attributes
        self._sync_delay = sync_delay
        self._resync_period = resync_period
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._watch_timeout = watch_timeout
        self._selector = f"spec.driver={self.driver_name},spec.nodeName={node_name}"
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._synced = threading.Condition(self._lock)
        self._model: DeviceModel | None = None
        self._node_uid: str | None = None
        self._generation = 0
        self._list_version: str | None = None
        self._own_versions: set[tuple[str, str]] = set()  # (name, resourceVersion) our writes produced
        self._own_deletes: set[str] = set()
        self._inflight: set[str] = set()  # names with a write whose response we have not seen yet
        self._write_done = threading.Condition(self._lock)
        self._accepted_forms: dict[str, tuple[str, str]] = {}  # name -> (desired form, form the server kept)
        self._in_sync = False
        # (key, model kept alive so its id stays unique, validated slices at generation 0)
        self._template: tuple[Any, DeviceModel, list[dict[str, Any]]] | None = None
        self._threads: list[threading.Thread] = []
        self._watch_response: Any = None
        self.calls = ApiCallCounts()
        self.status = SyncStatus()

    # ---- lifecycle ----
    def start(self) -> None:
        if self._threads:
            return
        self._wake.set()
        for target, name in ((self._run_worker, "slice-sync"), (self._run_watcher, "slice-watch")):
            thread = threading.Thread(target=target, name=f"{name}-{self.node_name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._wake.set()
        response = self._watch_response
        if response is not None:
            with contextlib.suppress(Exception):  # already closed is fine
                response.shutdown()  # unblocks the watcher's read from this thread (urllib3 >= 2.3)
        for thread in self._threads:
            thread.join(timeout)
        self._threads = []
        with self._lock:
            self._synced.notify_all()

    def update_model(self, model: DeviceModel) -> None:
        """Publish `model` instead of the current one (inventory changed)."""
        with self._lock:
            self._model = model
            self._in_sync = False
        self._wake.set()

    def refresh(self) -> None:
        """Ask the model provider again and republish if it changed."""
        self.update_model(self._model_provider())

    def wait_synced(self, timeout: float) -> bool:
        """Block until the published slices match the current model (True), or `timeout` passes (False)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not self._in_sync:
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping.is_set():
                    return False
                self._synced.wait(left)
            return True

    # ---- worker ----
    def _run_worker(self) -> None:
        failures = 0
        first = True
        while not self._stopping.is_set():
            woken = self._wake.wait(self._resync_period)
            if self._stopping.is_set():
                return
            if woken and not first and self._sync_delay:
                time.sleep(self._sync_delay)  # let a burst of events (a wipe deletes every slice) settle
            first = False
            self._wake.clear()
            try:
                self.sync_once()
                failures = 0
            except Exception as err:  # every API or model error is retried with back-off
                failures += 1
                delay = min(self._backoff_initial * 2 ** (failures - 1), self._backoff_max)
                self.status.last_error = f"{type(err).__name__}: {err}"
                log.warning(
                    "ResourceSlice sync for node %s failed (attempt %d, retry in %.1fs): %s",
                    self.node_name,
                    failures,
                    delay,
                    self.status.last_error,
                )
                if self._stopping.wait(delay):
                    return
                self._wake.set()

    def _prepare(self) -> None:
        if self._kubernetes_version is None:
            self.calls.get += 1
            self._kubernetes_version = server_version(self._api_client)
        if self._node_uid is None:
            self.calls.get += 1
            self._node_uid = node_uid(self._api_client, self.node_name)
            if self._node_uid is None:
                log.warning("Node %s not found: publishing slices without an owner reference", self.node_name)
        if self._model is None:
            model = self._model_provider()
            with self._lock:
                if self._model is None:
                    self._model = model

    def _desired(self, model: DeviceModel) -> Callable[[int], list[dict[str, Any]]]:
        """Slices for `model` at any generation; built and validated once per (model, layout, owner)."""
        version = self._kubernetes_version or (1, 36)
        key = (id(model), version, self._node_uid)
        if self._template is None or self._template[0] != key:
            slices = build_slices(
                model,
                self.node_name,
                version,
                0,
                self._node_uid,
                self.driver_name,
                list_type_attributes=self._list_type_attributes,
            )
            check_slices(slices, version)
            self._template = (key, model, slices)
        template = self._template[2]

        def at(generation: int) -> list[dict[str, Any]]:
            out = copy.deepcopy(template)
            for item in out:
                item["spec"]["pool"]["generation"] = generation
            return out

        return at

    def sync_once(self) -> SyncPlan:
        """One reconciliation pass (the worker calls this; tests and benchmarks may too)."""
        self._prepare()
        with self._lock:
            model = self._model
        assert model is not None
        self.calls.list += 1
        listing = request_json(self._api_client, "GET", SLICES, query=[("fieldSelector", self._selector)])
        self._list_version = listing["metadata"].get("resourceVersion")
        plan = plan_sync(
            listing.get("items") or [],
            self.node_name,
            self._desired(model),
            self._generation,
            self._equivalent,
        )
        self._apply(plan)
        self._generation = max(self._generation, plan.generation)
        self.status.syncs += 1
        self.status.generation = plan.generation
        self.status.last_error = None
        self.status.published = sorted(
            {i["metadata"]["name"] for i in listing.get("items") or []} - {d.name for d in plan.deletes}
            | {c["metadata"]["name"] for c in plan.creates}
        )
        with self._lock:
            if self._model is model:
                self._in_sync = True
                self._synced.notify_all()
        return plan

    def _equivalent(self, name: str, existing_form: str, desired_form: str) -> bool:
        accepted = self._accepted_forms.get(name)
        return accepted is not None and accepted == (desired_form, existing_form)

    def _remember(self, desired: dict[str, Any], response: dict[str, Any]) -> None:
        name = response["metadata"]["name"]
        with self._lock:
            self._own_versions.add((name, response["metadata"]["resourceVersion"]))
        want, have = comparable(desired), comparable(response)
        if want != have:
            self._accepted_forms[name] = (want, have)
            if self.status.dropped_fields_warning is None:
                self.status.dropped_fields_warning = (
                    f"the apiserver changed slice {name} on write (dropped fields?): is a DRA feature gate "
                    "such as DRAPartitionableDevices or DRAConsumableCapacity disabled?"
                )
                log.warning("%s", self.status.dropped_fields_warning)

    def _apply(self, plan: SyncPlan) -> None:
        for obsolete in plan.deletes:  # first, so a shrinking pool never has too many slices
            preconditions = {"uid": obsolete.uid, "resourceVersion": obsolete.resource_version}
            options = {"preconditions": {k: v for k, v in preconditions.items() if v}}
            with self._lock:
                self._own_deletes.add(obsolete.name)
            self.calls.delete += 1
            try:
                request(self._api_client, "DELETE", SLICE, {"name": obsolete.name}, body=options).drain_conn()
            except ApiException as err:
                if err.status != 404:
                    raise
        for item in plan.updates:
            self.calls.update += 1
            self._write(
                item,
                lambda body: request_json(
                    self._api_client, "PUT", SLICE, {"name": body["metadata"]["name"]}, body=body
                ),
            )
        for item in plan.creates:
            self.calls.create += 1
            self._write(item, lambda body: request_json(self._api_client, "POST", SLICES, body=body))

    def _write(self, item: dict[str, Any], call: Callable[[dict[str, Any]], Any]) -> None:
        """Write one slice; while it is in flight the watcher holds back judging events for that name."""
        name = item["metadata"]["name"]
        with self._lock:
            self._inflight.add(name)
        try:
            self._remember(item, call(item))
        finally:
            with self._lock:
                self._inflight.discard(name)
                self._write_done.notify_all()

    # ---- watcher ----
    def _run_watcher(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            version = self._list_version
            if version is None:  # the first list has not happened yet
                self._stopping.wait(0.05)
                continue
            try:
                self._watch_from(version)
                failures = 0
            except Exception as err:  # reconnect; the worker re-lists to catch up
                if self._stopping.is_set():
                    return
                failures += 1
                log.debug("ResourceSlice watch for node %s ended: %s", self.node_name, err)
                if isinstance(err, ApiException) and err.status == 410:
                    self._list_version = None  # too old: wait for a fresh list
                self._wake.set()
                self._stopping.wait(min(self._backoff_initial * 2 ** (failures - 1), self._backoff_max))

    def _watch_from(self, version: str) -> None:
        self.calls.watch += 1
        query = [
            ("fieldSelector", self._selector),
            ("watch", "true"),
            ("resourceVersion", version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self._watch_timeout)),
        ]
        response = request(
            self._api_client, "GET", SLICES, query=query, timeout_s=(10, self._watch_timeout + 10)
        )
        self._watch_response = response
        try:
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                if self._stopping.is_set():
                    return
                if not line or not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                meta = obj.get("metadata") or {}
                if meta.get("resourceVersion"):
                    self._list_version = meta["resourceVersion"]
                if kind == "BOOKMARK" or self._is_own(kind, meta):
                    continue
                log.debug("ResourceSlice %s %s by someone else: resync", meta.get("name"), kind)
                with self._lock:
                    self._in_sync = False
                self._wake.set()
        finally:
            self._watch_response = None
            response.release_conn()

    def _is_own(self, kind: str | None, meta: dict[str, Any]) -> bool:
        name = meta.get("name", "")
        with self._lock:
            # the event of our own write can arrive before the write's response: wait for the response
            self._write_done.wait_for(lambda: name not in self._inflight, timeout=10)
            if kind == "DELETED" and name in self._own_deletes:
                self._own_deletes.discard(name)
                return True
            key = (name, meta.get("resourceVersion", ""))
            if kind in ("ADDED", "MODIFIED") and key in self._own_versions:
                self._own_versions.discard(key)
                return True
        return False
