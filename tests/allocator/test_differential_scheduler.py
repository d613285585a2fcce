"""Differential check: our allocator and the real kube-scheduler agree on feasible / infeasible.

Hypothesis draws small inventories (1-2 nodes, up to 3 devices each, optional shared counters and taints) and
a claim (1-2 requests, selectors, counts, constraints, firstAvailable). The same objects go to the API server:
Nodes (no kubelet: status is patched), ResourceSlices, DeviceClasses, the ResourceClaim and a Pod that uses
it. The pod must be bound by the scheduler exactly when our allocator finds an allocation.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, assume, event, example, given, settings
from hypothesis import strategies as st

from dra_gpu.allocator.pools import Node
from dra_gpu.cel.release import MODELED_RELEASE
from tests.allocator.builders import consumes, device, resource_slice, run

EXAMPLES = int(os.environ.get("DRA_GPU_DIFF_EXAMPLES", "15"))  # about 3 s each against the real scheduler
pytestmark = [pytest.mark.scheduler, pytest.mark.apiserver, pytest.mark.timeout(120 + 10 * EXAMPLES)]

DRIVER = f"diff-{uuid.uuid4().hex[:8]}.example.com"
PREFIX = DRIVER.split(".")[0]
CLASSES: list[dict[str, Any]] = [
    {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": f"{PREFIX}-{kind}"},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": f"device.driver == '{DRIVER}' && "
                        f"device.attributes['{DRIVER}'].type == '{kind}'"
                    }
                }
            ]
        },
    }
    for kind in ("gpu", "mig")
]
SELECTORS = [
    f"device.attributes['{DRIVER}'].model == 'a'",
    f"device.attributes['{DRIVER}'].numa == 1",
    f"device.capacity['{DRIVER}'].memory.compareTo(quantity('40Gi')) >= 0",
]
DISTINCT_BY_VALUE = (1, 36)  # first release we checked whose scheduler compares distinctAttribute values
TAINT = {"key": "example.com/broken", "value": "yes", "effect": "NoSchedule"}


def scenarios(messy: bool) -> st.SearchStrategy[dict[str, Any]]:
    """Inventories and a claim. `messy` adds what makes the scheduler give up on a node: missing attributes
    that selectors read (CEL runtime errors), incomplete pools, invalid pools.
    """
    device_spec = st.fixed_dictionaries(
        {
            "kind": st.sampled_from(["gpu", "mig"]),
            "model": st.sampled_from(["a", "b"]),
            # None: attribute missing, selectors on it fail at runtime
            "numa": st.sampled_from([0, 1, 1, None] if messy else [0, 1]),
            "memory": st.sampled_from(["10Gi", "40Gi"]),
            "tainted": st.sampled_from([False, False, True]),
            "counted": st.booleans(),
        }
    )
    node_spec = st.fixed_dictionaries(
        {
            "devices": st.lists(device_spec, min_size=0 if messy else 1, max_size=3),
            "counter": st.sampled_from(["40Gi", "50Gi"]),
            # one slice of the pool never arrives
            "incomplete": st.sampled_from([False, False, False, True] if messy else [False]),
            # a second, invalid pool on the node (one device name twice), sorted before or after the good one
            "invalid_pool": st.sampled_from([None, None, "a", "z"] if messy else [None]),
        }
    )
    request_spec = st.fixed_dictionaries(
        {
            "kind": st.sampled_from(["gpu", "mig"]),
            "count": st.integers(1, 2),
            "selector": st.none() | st.sampled_from(range(len(SELECTORS))),
            "tolerate": st.booleans(),
            "fallback": st.none() | st.sampled_from(["gpu", "mig"]),
        }
    )
    return st.fixed_dictionaries(
        {
            "nodes": st.lists(node_spec, min_size=1, max_size=2),
            "requests": st.lists(request_spec, min_size=1, max_size=2),
            "constraint": st.sampled_from([None, "match-numa", "distinct-model"]),
        }
    )


# Found by this test (2026-11-26): n1 fits, but the search on n0 reaches a CEL runtime error (r1's selector on
# a device without `numa`, after r0 backtracks to the tainted device), and kube-scheduler fails the pod on
# every node then. Kept as an explicit example, checked on every run.
def _device(kind: str, numa: int | None, tainted: bool = False, model: str = "b") -> dict[str, Any]:
    return {"kind": kind, "numa": numa, "tainted": tainted, "model": model, "memory": "10Gi"} | {
        "counted": False
    }


ERROR_ON_ANOTHER_NODE: dict[str, Any] = {
    "nodes": [
        {
            "devices": [_device("mig", None), _device("gpu", None), _device("mig", 1, tainted=True)],
            "incomplete": False, "counter": "40Gi", "invalid_pool": None,
        },
        {
            "devices": [_device("mig", 1, model="a"), _device("gpu", 1, model="a")],
            "incomplete": False, "counter": "40Gi", "invalid_pool": None,
        },
    ],
    "requests": [
        {"kind": "mig", "count": 1, "selector": None, "tolerate": True, "fallback": "mig"},
        {"kind": "mig", "count": 1, "selector": 1, "tolerate": False, "fallback": "gpu"},
    ],
    "constraint": "match-numa",
}  # fmt: skip


def build_objects(
    scenario: dict[str, Any], example: str, split: bool = True
) -> tuple[list[dict[str, Any]], list[Node], dict[str, Any]]:
    """`split`: the 1.35+ layout (counters in a slice of their own); False: 1.34's (counters beside devices,
    which is all a 1.34 API server accepts)."""
    slices: list[dict[str, Any]] = []
    nodes: list[Node] = []
    for index, node in enumerate(scenario["nodes"]):
        name = f"{example}-n{index}"
        nodes.append(Node(name, {"diff-example": example}))
        devices = []
        for position, spec in enumerate(node["devices"]):
            devices.append(
                device(
                    f"dev-{position}",
                    spec["kind"],
                    attributes={
                        "model": spec["model"],
                        **({} if spec["numa"] is None else {"numa": spec["numa"]}),
                    },
                    capacity={"memory": spec["memory"]},
                    consumes=[consumes("mem", memory=spec["memory"])] if spec["counted"] else (),
                    taints=[TAINT] if spec["tainted"] else (),
                )
            )
        counted = any(spec["counted"] for spec in node["devices"])
        # The slice count the pool announces; an "incomplete" pool announces one slice more than it publishes.
        count = (2 if counted and split else 1) + (1 if node["incomplete"] else 0)
        beside = {"counters": {"mem": {"memory": node["counter"]}}} if counted and not split else {}
        if counted and split:
            slices.append(
                resource_slice(
                    f"{name}-counters",
                    name,
                    counters={"mem": {"memory": node["counter"]}},
                    count=count,
                    driver=DRIVER,
                )
            )
        slices.append(resource_slice(f"{name}-devices", name, devices, count=count, driver=DRIVER, **beside))
        if node["invalid_pool"]:
            pool = f"{node['invalid_pool']}-{name}"
            twin = device("dup-0", "gpu", attributes={"model": "a", "numa": 1}, capacity={"memory": "40Gi"})
            for part in range(2):
                slices.append(
                    resource_slice(f"{pool}-{part}", name, [twin], pool=pool, count=2, driver=DRIVER)
                )
    requests: list[dict[str, Any]] = []
    for index, spec in enumerate(scenario["requests"]):
        body: dict[str, Any] = {"deviceClassName": f"{PREFIX}-{spec['kind']}", "count": spec["count"]}
        if spec["selector"] is not None:
            body["selectors"] = [{"cel": {"expression": SELECTORS[spec["selector"]]}}]
        if spec["tolerate"]:
            body["tolerations"] = [{"key": TAINT["key"], "operator": "Exists"}]
        if spec["fallback"]:
            fallback: dict[str, Any] = {
                "name": "fallback",
                "deviceClassName": f"{PREFIX}-{spec['fallback']}",
                "count": 1,
            }
            requests.append({"name": f"r{index}", "firstAvailable": [{"name": "main", **body}, fallback]})
        else:
            requests.append({"name": f"r{index}", "exactly": body})
    devices_spec: dict[str, Any] = {"requests": requests}
    if scenario["constraint"] == "match-numa":
        devices_spec["constraints"] = [{"matchAttribute": f"{DRIVER}/numa"}]
    elif scenario["constraint"] == "distinct-model":
        devices_spec["constraints"] = [{"distinctAttribute": f"{DRIVER}/model"}]
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"{example}-claim", "namespace": "default"},
        "spec": {"devices": devices_spec},
    }
    return slices, nodes, claim


class Cluster:
    def __init__(self, api_client: Any):
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        from dra_gpu.kube.client import server_version

        self.release = server_version(api_client)
        self.split = self.release >= (1, 35)  # which slice layout the server takes

    def create_node(self, node: Node) -> None:
        body: Any = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node.name, "labels": dict(node.labels)},
        }
        self.core.create_node(body)
        capacity = {"cpu": "8", "memory": "32Gi", "pods": "110"}
        self.core.patch_node_status(
            node.name,
            {
                "status": {
                    "capacity": capacity,
                    "allocatable": capacity,
                    "conditions": [
                        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake"}
                    ],
                }
            },
        )

    def create(self, plural: str, body: dict[str, Any], namespace: str | None = None) -> None:
        if namespace:
            self.custom.create_namespaced_custom_object("resource.k8s.io", "v1", namespace, plural, body)
        else:
            self.custom.create_cluster_custom_object("resource.k8s.io", "v1", plural, body)

    def scheduled(self, pod: str, timeout: float = 30.0) -> bool:
        """True when the scheduler binds the pod, False when it reports it cannot (and that stays so)."""
        deadline = time.monotonic() + timeout
        unschedulable_since: float | None = None
        while time.monotonic() < deadline:
            status: Any = self.core.read_namespaced_pod(pod, "default")
            if status.spec.node_name:
                return True
            conditions = status.status.conditions or []
            # Unschedulable, or SchedulerError when the allocator fails with an error (a CEL runtime error, an
            # invalid pool): both leave the pod unbound.
            if any(c.type == "PodScheduled" and c.status == "False" for c in conditions):
                unschedulable_since = unschedulable_since or time.monotonic()
                if time.monotonic() - unschedulable_since > 3.0:
                    return False
            time.sleep(0.2)
        raise AssertionError(f"pod {pod} neither scheduled nor unschedulable within {timeout}s")

    def cleanup(self, example: str, slices: list[dict[str, Any]], nodes: list[Node]) -> None:
        from kubernetes.client.exceptions import ApiException

        def quietly(call: Any, *args: Any, **kwargs: Any) -> None:
            with contextlib.suppress(ApiException):  # already gone
                call(*args, **kwargs)

        for suffix in ("", "-first"):
            quietly(
                self.core.delete_namespaced_pod, f"{example}{suffix}-pod", "default", grace_period_seconds=0
            )
            quietly(
                self.custom.delete_namespaced_custom_object,
                "resource.k8s.io",
                "v1",
                "default",
                "resourceclaims",
                f"{example}{suffix}-claim",
            )
        for slice_obj in slices:
            quietly(
                self.custom.delete_cluster_custom_object,
                "resource.k8s.io",
                "v1",
                "resourceslices",
                slice_obj["metadata"]["name"],
            )
        for node in nodes:
            quietly(self.core.delete_node, node.name)


def submit(cluster: Cluster, example: str, claim: dict[str, Any], suffix: str = "") -> bool:
    """Create the claim and a pod that uses it; True when kube-scheduler binds the pod."""
    cluster.create("resourceclaims", claim, "default")
    pod: Any = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{example}{suffix}-pod"},
        "spec": {
            "nodeSelector": {"diff-example": example},
            "resourceClaims": [{"name": "c", "resourceClaimName": claim["metadata"]["name"]}],
            "containers": [
                {"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "c"}]}}
            ],
            "terminationGracePeriodSeconds": 0,
            # New Nodes are tainted not-ready (no kubelet here); node taints are not what we test.
            "tolerations": [{"operator": "Exists"}],
        },
    }
    cluster.core.create_namespaced_pod("default", pod)
    return cluster.scheduled(f"{example}{suffix}-pod")


def publish(cluster: Cluster, slices: list[dict[str, Any]], nodes: list[Node]) -> None:
    for node in nodes:
        cluster.create_node(node)
    for slice_obj in slices:
        cluster.create("resourceslices", slice_obj)
    time.sleep(1.0)  # let the scheduler's informers see the slices before a pod arrives


def verdict(feasible: bool) -> str:
    return "feasible" if feasible else "infeasible"


@pytest.fixture(scope="module")
def cluster(kube_scheduler: Any) -> Iterator[Cluster]:
    api_client = kube_scheduler.api_client()
    live = Cluster(api_client)
    for device_class in CLASSES:
        live.create("deviceclasses", device_class)
    yield live
    for device_class in CLASSES:
        with contextlib.suppress(Exception):  # the control plane may be going away already
            live.custom.delete_cluster_custom_object(
                "resource.k8s.io", "v1", "deviceclasses", device_class["metadata"]["name"]
            )
    api_client.close()


@settings(
    max_examples=EXAMPLES,
    # Each example costs seconds against the real scheduler: report a failure as found, without shrinking.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
@given(scenario=scenarios(messy=True))
@example(scenario=ERROR_ON_ANOTHER_NODE)
def test_feasibility_agrees_with_kube_scheduler(cluster: Cluster, scenario: dict[str, Any]) -> None:
    if cluster.release < MODELED_RELEASE:
        # The allocator models the newest release. Older schedulers differ on broken inventories: 1.34 (alpha
        # partitionable devices) found a node infeasible that has an invalid second pool and counted devices,
        # where 1.37 and our allocator allocate. Clean inventories must still agree.
        assume(not _messy(scenario))
    if cluster.release < DISTINCT_BY_VALUE:
        # 1.34's alpha distinctAttribute compares the attribute values' pointers, not the values
        # (dynamic-resource-allocation v0.34.12, experimental/constraint.go matchesAttribute), so it never
        # rejects a duplicate; the value comparison arrived in 1.36. Our allocator follows the fixed rule.
        assume(scenario["constraint"] != "distinct-model")
    example = f"{PREFIX}-{uuid.uuid4().hex[:6]}"
    slices, nodes, claim = build_objects(scenario, example, cluster.split)
    ours = run([claim], slices, classes=CLASSES, nodes=nodes)[0]
    try:
        publish(cluster, slices, nodes)
        theirs = submit(cluster, example, claim)
    finally:
        cluster.cleanup(example, slices, nodes)
    event(f"kube-scheduler: {verdict(theirs)}")
    assert ours.allocatable == theirs, (
        f"allocator says {verdict(ours.allocatable)} ({ours.reason}), kube-scheduler says {verdict(theirs)}\n"
        f"scenario: {scenario}\nclaim: {claim}\nslices: {slices}"
    )


def _messy(scenario: dict[str, Any]) -> bool:
    return any(
        node["invalid_pool"] or node["incomplete"] or any(d["numa"] is None for d in node["devices"])
        for node in scenario["nodes"]
    )


first_claim_spec = st.fixed_dictionaries(
    {"kind": st.sampled_from(["gpu", "mig"]), "count": st.integers(1, 2), "selector": st.none() | st.just(0)}
)


@settings(
    max_examples=max(5, EXAMPLES // 2),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(scenario=scenarios(messy=False), first=first_claim_spec)
def test_feasibility_after_an_earlier_allocation_agrees(
    cluster: Cluster, scenario: dict[str, Any], first: dict[str, Any]
) -> None:
    """kube-scheduler allocates a first claim; the second one is judged with the first one's allocation (read
    back from the API server) holding its devices and counters.
    """
    example = f"{PREFIX}-{uuid.uuid4().hex[:6]}"
    slices, nodes, claim = build_objects(scenario, example, cluster.split)
    body: dict[str, Any] = {"deviceClassName": f"{PREFIX}-{first['kind']}", "count": first["count"]}
    if first["selector"] is not None:
        body["selectors"] = [{"cel": {"expression": SELECTORS[first["selector"]]}}]
    first_claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"{example}-first-claim", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "first", "exactly": body}]}},
    }
    ours_first = run([first_claim], slices, classes=CLASSES, nodes=nodes)[0]
    try:
        publish(cluster, slices, nodes)
        theirs_first = submit(cluster, example, first_claim, "-first")
        assert ours_first.allocatable == theirs_first, (
            f"first claim: allocator says {verdict(ours_first.allocatable)} ({ours_first.reason}), "
            f"kube-scheduler says {verdict(theirs_first)}\nfirst: {first_claim}\nslices: {slices}"
        )
        live_first: Any = cluster.custom.get_namespaced_custom_object(
            "resource.k8s.io", "v1", "default", "resourceclaims", first_claim["metadata"]["name"]
        )
        ours = run([claim], slices, classes=CLASSES, nodes=nodes, existing=[live_first])[0]
        theirs = submit(cluster, example, claim)
    finally:
        cluster.cleanup(example, slices, nodes)
    event(f"first claim {verdict(theirs_first)}, second claim {verdict(theirs)}")
    assert ours.allocatable == theirs, (
        f"allocator says {verdict(ours.allocatable)} ({ours.reason}), kube-scheduler says {verdict(theirs)}\n"
        f"first claim's allocation: {live_first.get('status')}\nscenario: {scenario}\nclaim: {claim}\n"
        f"slices: {slices}"
    )


# List-typed attributes (KEP-5491, DRAListTypeAttributes: alpha since 1.36, off by default; the fixtures
# turn it on where the binaries know it). Values come from small sets so common and disjoint values occur.
LIST_VALUES = st.sampled_from(
    [{"int": 0}, {"int": 1}, {"ints": [0, 1]}, {"ints": [1, 2]}, {"ints": [2]}, {"strings": ["1"]}, None]
)
LIST_SELECTORS = [
    f"device.attributes['{DRIVER}'].links.includes(1)",
    f"1 in device.attributes['{DRIVER}'].links",
]


def _scheduler_has_list_attributes() -> bool:
    from tests.support.control_plane import ControlPlaneError, find_binary, supported_feature_gates

    try:
        return "DRAListTypeAttributes" in supported_feature_gates(find_binary("kube-scheduler"))
    except ControlPlaneError:
        return False


@pytest.mark.skipif(
    not _scheduler_has_list_attributes(), reason="kube-scheduler without DRAListTypeAttributes"
)
@settings(
    max_examples=EXAMPLES,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    values=st.lists(LIST_VALUES, min_size=1, max_size=4),
    count=st.integers(1, 3),
    constraint=st.sampled_from(["matchAttribute", "distinctAttribute", None]),
    selector=st.none() | st.sampled_from(range(len(LIST_SELECTORS))),
)
def test_list_attribute_semantics_agree_with_kube_scheduler(
    cluster: Cluster,
    values: list[dict[str, Any] | None],
    count: int,
    constraint: str | None,
    selector: int | None,
) -> None:
    """matchAttribute (a value common to all devices), distinctAttribute (pairwise disjoint values),
    includes() and `in` on list and scalar attributes: our allocator and the real scheduler agree."""
    example = f"{PREFIX}-{uuid.uuid4().hex[:6]}"
    node = Node(f"{example}-n0", {"diff-example": example})
    devices = [
        device(f"dev-{i}", "gpu", attributes={} if value is None else {"links": value})
        for i, value in enumerate(values)
    ]
    slices = [resource_slice(f"{node.name}-devices", node.name, devices, count=1, driver=DRIVER)]
    body: dict[str, Any] = {"deviceClassName": f"{PREFIX}-gpu", "count": count}
    if selector is not None:
        body["selectors"] = [{"cel": {"expression": LIST_SELECTORS[selector]}}]
    devices_spec: dict[str, Any] = {"requests": [{"name": "r", "exactly": body}]}
    if constraint:
        devices_spec["constraints"] = [{constraint: f"{DRIVER}/links"}]
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"{example}-claim", "namespace": "default"},
        "spec": {"devices": devices_spec},
    }
    ours = run([claim], slices, classes=CLASSES, nodes=[node])[0]
    try:
        publish(cluster, slices, [node])
        theirs = submit(cluster, example, claim)
    finally:
        cluster.cleanup(example, slices, [node])
    event(f"list attributes: kube-scheduler {verdict(theirs)}")
    assert ours.allocatable == theirs, (
        f"allocator says {verdict(ours.allocatable)} ({ours.reason}), kube-scheduler says {verdict(theirs)}\n"
        f"claim: {claim}\nslices: {slices}"
    )
