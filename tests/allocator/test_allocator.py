"""The scheduler's allocation semantics on hand-written ResourceSlices."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from dra_gpu.allocator.pools import Node
from tests.allocator.builders import (
    allocated,
    allocated_labels,
    claim,
    consumes,
    device,
    exactly,
    first_available,
    resource_slice,
    result,
    run,
)

A100_COUNTERS = {
    "gpu-0-counter-set": {
        "memory": "40Gi",
        "multiprocessors": "98",
        "memory-slice-0": "1",
        "memory-slice-1": "1",
    }
}


def partitionable_node(node: str = "n1") -> list[dict[str, Any]]:
    """1.35+ shape: a counters-only slice, then the devices: the whole GPU and two half-GPU MIG devices."""
    whole = device(
        "gpu-0",
        consumes=[
            consumes(
                "gpu-0-counter-set",
                memory="40Gi",
                multiprocessors="98",
                memory_slice_0="1",
                memory_slice_1="1",
            )
        ],
    )
    half_a = device(
        "gpu-0-mig-3g20gb-0",
        "mig",
        attributes={"profile": "3g.20gb"},
        consumes=[consumes("gpu-0-counter-set", memory="20Gi", multiprocessors="42", memory_slice_0="1")],
    )
    half_b = device(
        "gpu-0-mig-3g20gb-4",
        "mig",
        attributes={"profile": "3g.20gb"},
        consumes=[consumes("gpu-0-counter-set", memory="20Gi", multiprocessors="42", memory_slice_1="1")],
    )
    return [
        resource_slice(f"{node}-a", node, counters=A100_COUNTERS, count=2),
        resource_slice(f"{node}-b", node, [whole, half_a, half_b], count=2),
    ]


def test_first_fit_in_slice_name_order() -> None:
    slices = [
        resource_slice("n1-b", "n1", [device("gpu-1")]),
        resource_slice("n1-a", "n1", [device("gpu-0")]),
    ]
    [explanation] = run([claim("c", exactly("g"))], slices)
    assert explanation.allocatable and allocated_labels(explanation) == ["n1/gpu-0"]


def test_nodes_are_tried_in_name_order() -> None:
    slices = [
        resource_slice("s2", "node-b", [device("gpu-0")]),
        resource_slice("s1", "node-a", [device("gpu-0")]),
    ]
    [explanation] = run([claim("c", exactly("g"))], slices)
    assert explanation.node == "node-a"


def test_counters_make_whole_gpu_and_mig_exclusive() -> None:
    slices = partitionable_node()
    both_halves = claim("halves", exactly("m", "mig.nvidia.com", count=2))
    [explanation] = run([both_halves], slices)
    assert allocated_labels(explanation) == ["n1/gpu-0-mig-3g20gb-0", "n1/gpu-0-mig-3g20gb-4"]
    # The whole GPU is held by another claim: no MIG device fits, and the reason names the counter.
    [blocked] = run(
        [claim("m", exactly("m", "mig.nvidia.com"))],
        slices,
        existing=[allocated("other", result("gpu-0", "n1"))],
    )
    assert not blocked.allocatable
    reasons = {r.reason for r in blocked.requests[0].rejected}
    assert any("counter gpu-0-counter-set/" in reason and "exhausted" in reason for reason in reasons)


def test_whole_gpu_and_mig_in_one_claim_do_not_fit() -> None:
    [explanation] = run([claim("c", exactly("g"), exactly("m", "mig.nvidia.com"))], partitionable_node())
    assert not explanation.allocatable
    assert "counter" in (explanation.reason or "")


def test_incomplete_pool_is_skipped() -> None:
    # A pool that announces two slices but has one is not used (as kube-scheduler 1.36 does; the differential
    # test found it); allocationMode All reports it as the reason.
    slices = [resource_slice("n1-0", "n1", [device("gpu-0")], count=2)]
    [explanation] = run([claim("c", exactly("g"))], slices)
    assert not explanation.allocatable
    assert "incomplete" in explanation.requests[0].rejected[0].reason
    [every] = run([claim("c", exactly("g", count=None, allocationMode="All"))], slices)
    assert not every.allocatable and "incomplete" in (every.reason or "")


def test_only_the_newest_generation_counts() -> None:
    slices = [
        resource_slice("old", "n1", [device("gpu-0")], generation=1),
        resource_slice("new", "n1", [device("gpu-9")], generation=2),
    ]
    [explanation] = run([claim("c", exactly("g"))], slices)
    assert allocated_labels(explanation) == ["n1/gpu-9"]


def test_invalid_pool_with_dangling_counter_reference() -> None:
    bad = device("gpu-0", consumes=[consumes("no-such-set", memory="1Gi")])
    [explanation] = run([claim("c", exactly("g"))], [resource_slice("s", "n1", [bad])])
    assert not explanation.allocatable
    assert "invalid" in explanation.requests[0].rejected[0].reason


def test_duplicate_device_names_make_a_pool_invalid() -> None:
    slices = [
        resource_slice("s1", "n1", [device("gpu-0")], count=2),
        resource_slice("s2", "n1", [device("gpu-0")], count=2),
    ]
    [explanation] = run([claim("c", exactly("g"))], slices)
    assert not explanation.allocatable


def test_selectors_report_which_one_failed() -> None:
    slices = [
        resource_slice(
            "s",
            "n1",
            [
                device("gpu-0", attributes={"productName": "A100"}),
                device("gpu-1", attributes={"productName": "H100"}),
            ],
        )
    ]
    request = exactly("g", selectors=["device.attributes['gpu.nvidia.com'].productName == 'H100'"])
    [explanation] = run([claim("c", request)], slices)
    assert allocated_labels(explanation) == ["n1/gpu-1"]
    [rejection] = explanation.requests[0].rejected
    assert rejection.device == "n1/gpu-0" and rejection.kind == "selector"
    assert "request selector #0 is false" in rejection.reason


def test_cel_runtime_error_aborts_the_node_when_the_search_reaches_it() -> None:
    request = exactly("g", selectors=["device.attributes['gpu.nvidia.com'].x == 1"])
    slices = [resource_slice("s", "n1", [device("gpu-0"), device("gpu-1", attributes={"x": 1})])]
    [explanation] = run([claim("c", request)], slices)
    # gpu-1 would match, but the error on gpu-0 comes first and makes the scheduler give up on the node.
    assert not explanation.allocatable
    assert "CEL runtime error" in (explanation.reason or "")
    # In the other order the search stops at gpu-1 before it evaluates the failing device.
    reordered = [resource_slice("s", "n1", [device("gpu-1", attributes={"x": 1}), device("gpu-0")])]
    [found] = run([claim("c", request)], reordered)
    assert allocated_labels(found) == ["n1/gpu-1"]
    # A device held by another claim is skipped before its selectors are evaluated.
    [held] = run([claim("c", request)], slices, existing=[allocated("o", result("gpu-0", "n1"))])
    assert allocated_labels(held) == ["n1/gpu-1"]


def test_a_cel_runtime_error_on_one_node_fails_the_pod_on_every_node() -> None:
    """kube-scheduler's DRA plugin returns an allocator error (not "does not fit") for a CEL runtime error,
    and an error from any node's filter ends the pod's scheduling attempt: a feasible node elsewhere does not
    help. Found by the differential test against kube-scheduler 1.37.2 (and 1.34.12 does the same)."""
    request = exactly("g", selectors=["device.attributes['gpu.nvidia.com'].x == 1"])
    fits = resource_slice("a", "n-a", [device("gpu-0", attributes={"x": 1})])
    errs = resource_slice("b", "n-b", [device("gpu-0"), device("gpu-1", attributes={"x": 1})])
    nodes = [Node("n-a", {}), Node("n-b", {})]
    [explanation] = run([claim("c", request)], [fits, errs], nodes=nodes)
    assert not explanation.allocatable and explanation.results == []
    assert "error on node n-b" in (explanation.reason or "")
    assert "CEL runtime error" in (explanation.reason or "")
    # The error only counts where the search reaches it: on a node where a match comes first, it does not.
    reordered = resource_slice("b", "n-b", [device("gpu-1", attributes={"x": 1}), device("gpu-0")])
    [found] = run([claim("c", request)], [fits, reordered], nodes=nodes)
    assert allocated_labels(found) == ["n-a/gpu-0"]


def test_invalid_pool_is_skipped() -> None:
    bad = resource_slice(
        "t", "a-node", [device("gpu-1", consumes=[consumes("nope", memory="1Gi")])], pool="a-pool"
    )
    good = resource_slice("s", "a-node", [device("gpu-0")], pool="b-pool")
    [explanation] = run([claim("c", exactly("g"))], [good, bad])
    assert allocated_labels(explanation) == ["b-pool/gpu-0"]
    [needs_more] = run([claim("c", exactly("g", count=2))], [good, bad])
    assert not needs_more.allocatable
    assert any("invalid" in r.reason for r in needs_more.requests[0].rejected)


def test_taints_and_tolerations() -> None:
    taint = {"key": "example.com/unhealthy", "value": "true", "effect": "NoSchedule"}
    slices = [
        resource_slice(
            "s",
            "n1",
            [device("gpu-0", taints=[taint]), device("gpu-1", taints=[{"key": "info", "effect": "None"}])],
        )
    ]
    [plain] = run([claim("c", exactly("g", count=2))], slices)
    assert not plain.allocatable
    assert any("not tolerated" in r.reason for r in plain.requests[0].rejected)
    tolerating = exactly("g", count=2, tolerations=[{"key": "example.com/unhealthy", "operator": "Exists"}])
    [tolerated] = run([claim("c", tolerating)], slices)
    assert allocated_labels(tolerated) == ["n1/gpu-0", "n1/gpu-1"]
    assert tolerated.results[0].tolerations == [{"key": "example.com/unhealthy", "operator": "Exists"}]


def test_devices_of_other_claims_and_admin_access() -> None:
    slices = [resource_slice("s", "n1", [device("gpu-0"), device("gpu-1")])]
    existing = [allocated("other", result("gpu-0", "n1"))]
    [explanation] = run([claim("c", exactly("g"))], slices, existing=existing)
    assert allocated_labels(explanation) == ["n1/gpu-1"]
    assert "already allocated to claim default/other" in explanation.requests[0].rejected[0].reason
    [admin] = run([claim("c", exactly("g", count=2, adminAccess=True))], slices, existing=existing)
    assert allocated_labels(admin) == ["n1/gpu-0", "n1/gpu-1"]
    assert all(r.admin_access for r in admin.results)


def test_allocation_mode_all_fails_on_a_tainted_matching_device() -> None:
    taint = {"key": "k", "effect": "NoSchedule"}
    slices = [resource_slice("s", "n1", [device("gpu-0"), device("gpu-1", taints=[taint])])]
    [explanation] = run([claim("c", exactly("g", count=None, allocationMode="All"))], slices)
    assert not explanation.allocatable and "not tolerated" in (explanation.reason or "")


def test_allocation_mode_all() -> None:
    slices = [resource_slice("s", "n1", [device("gpu-0"), device("gpu-1"), device("m", "mig")])]
    [explanation] = run([claim("c", exactly("g", count=None, allocationMode="All"))], slices)
    assert allocated_labels(explanation) == ["n1/gpu-0", "n1/gpu-1"]
    [busy] = run(
        [claim("c", exactly("g", count=None, allocationMode="All"))],
        slices,
        existing=[allocated("o", result("gpu-1", "n1"))],
    )
    assert not busy.allocatable
    [none] = run([claim("c", exactly("g", "gpu-share.nvidia.com", count=None, allocationMode="All"))], slices)
    assert not none.allocatable


def test_match_attribute_backtracks() -> None:
    # First fit would take gpu-0 (interconnect a) but a second device on `a` does not exist: backtrack to b.
    devices = [
        device("gpu-0", attributes={"interconnect": "a"}),
        device("gpu-1", attributes={"interconnect": "b"}),
        device("gpu-2", attributes={"interconnect": "b"}),
    ]
    constraint = {"matchAttribute": "gpu.nvidia.com/interconnect"}
    [explanation] = run(
        [claim("c", exactly("g", count=2), constraints=[constraint])], [resource_slice("s", "n1", devices)]
    )
    assert allocated_labels(explanation) == ["n1/gpu-1", "n1/gpu-2"]


def test_match_attribute_across_requests_and_versions_compare_as_strings() -> None:
    # The scheduler compares version attributes as strings (semver strings are minimal), so build metadata
    # counts: 1.0.0+b does not match 1.0.0+a although semver precedence calls them equal.
    devices = [
        device("gpu-0", attributes={"driverVersion": "v:1.0.0+a"}),
        device("m-0", "mig", attributes={"driverVersion": "v:2.0.0"}),
        device("m-1", "mig", attributes={"driverVersion": "v:1.0.0+b"}),
        device("m-2", "mig", attributes={"driverVersion": "v:1.0.0+a"}),
    ]
    constraint = {"matchAttribute": "gpu.nvidia.com/driverVersion", "requests": ["g", "m"]}
    [explanation] = run(
        [claim("c", exactly("g"), exactly("m", "mig.nvidia.com"), constraints=[constraint])],
        [resource_slice("s", "n1", devices)],
    )
    assert allocated_labels(explanation) == ["n1/gpu-0", "n1/m-2"]


def test_devices_without_the_constrained_attribute_are_not_chosen() -> None:
    devices = [device("gpu-0"), device("gpu-1", attributes={"numa": 0})]
    [explanation] = run(
        [claim("c", exactly("g"), constraints=[{"matchAttribute": "gpu.nvidia.com/numa"}])],
        [resource_slice("s", "n1", devices)],
    )
    assert allocated_labels(explanation) == ["n1/gpu-1"]


def test_distinct_attribute() -> None:
    devices = [
        device("gpu-0", attributes={"numa": 0}),
        device("gpu-1", attributes={"numa": 0}),
        device("gpu-2", attributes={"numa": 1}),
    ]
    [explanation] = run(
        [claim("c", exactly("g", count=2), constraints=[{"distinctAttribute": "gpu.nvidia.com/numa"}])],
        [resource_slice("s", "n1", devices)],
    )
    assert allocated_labels(explanation) == ["n1/gpu-0", "n1/gpu-2"]


def test_match_attribute_on_list_attributes_needs_one_value_common_to_all_devices() -> None:
    # 1.37 with DRAListTypeAttributes: the running intersection must stay non-empty. gpu-0 {0,1} and gpu-1
    # {1,2} share 1, gpu-2 {2} shares nothing with {1}: a 3-device claim needs gpu-3 (scalar 1) instead.
    devices = [
        device("gpu-0", attributes={"numa": {"ints": [0, 1]}}),
        device("gpu-1", attributes={"numa": {"ints": [1, 2]}}),
        device("gpu-2", attributes={"numa": {"ints": [2]}}),
        device("gpu-3", attributes={"numa": 1}),
    ]
    constraint = {"matchAttribute": "gpu.nvidia.com/numa"}
    [explanation] = run(
        [claim("c", exactly("g", count=3), constraints=[constraint])], [resource_slice("s", "n1", devices)]
    )
    assert allocated_labels(explanation) == ["n1/gpu-0", "n1/gpu-1", "n1/gpu-3"]


def test_match_attribute_list_values_of_another_type_share_nothing() -> None:
    devices = [
        device("gpu-0", attributes={"numa": {"ints": [0, 1]}}),
        device("gpu-1", attributes={"numa": {"strings": ["0", "1"]}}),
    ]
    constraint = {"matchAttribute": "gpu.nvidia.com/numa"}
    [explanation] = run(
        [claim("c", exactly("g", count=2), constraints=[constraint])], [resource_slice("s", "n1", devices)]
    )
    assert not explanation.allocatable
    reasons = [r.reason for r in explanation.requests[0].rejected] + [explanation.reason or ""]
    reasons += list(explanation.node_failures.values())
    assert any("has nothing in common with" in reason for reason in reasons), reasons


def test_distinct_attribute_on_list_attributes_needs_disjoint_sets() -> None:
    devices = [
        device("gpu-0", attributes={"links": {"strings": ["a", "b"]}}),
        device("gpu-1", attributes={"links": {"strings": ["b", "c"]}}),
        device("gpu-2", attributes={"links": {"strings": ["c", "d"]}}),
    ]
    constraint = {"distinctAttribute": "gpu.nvidia.com/links"}
    [explanation] = run(
        [claim("c", exactly("g", count=2), constraints=[constraint])], [resource_slice("s", "n1", devices)]
    )
    assert allocated_labels(explanation) == ["n1/gpu-0", "n1/gpu-2"]
    [none] = run(
        [claim("c", exactly("g", count=3), constraints=[constraint])], [resource_slice("s", "n1", devices)]
    )
    assert not none.allocatable


def test_first_available_falls_back_and_names_the_subrequest() -> None:
    slices = [resource_slice("s", "n1", [device("gpu-0"), device("m-0", "mig")])]
    request = first_available(
        "g",
        {"name": "two", "deviceClassName": "gpu.nvidia.com", "count": 2},
        {"name": "mig", "deviceClassName": "mig.nvidia.com"},
    )
    [explanation] = run([claim("c", request)], slices)
    assert [(r.request, r.label) for r in explanation.results] == [("g/mig", "n1/m-0")]
    assert explanation.requests[0].allocated == ["n1/m-0"]


def test_consumable_capacity_rounding_default_and_sum() -> None:
    policy = {
        "value": "40Gi",
        "requestPolicy": {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}},
    }
    compute = {"value": "100", "requestPolicy": {"validValues": ["10", "50", "100"]}}
    share = device("gpu-0-shared", "gpu-share", capacity={"memory": policy, "compute": compute}, multi=True)
    slices = [resource_slice("s", "n1", [share])]
    request = exactly(
        "s", "gpu-share.nvidia.com", capacity={"requests": {"memory": "1500Mi", "compute": "20"}}
    )
    [explanation] = run([claim("c", request)], slices)
    [allocation] = explanation.results
    assert allocation.consumed_capacity == {"memory": Decimal(2 * 2**30), "compute": Decimal(50)}
    assert allocation.share_id is not None
    # Two shares of 30Gi do not fit in 40Gi; the second claim sees the first one's share.
    big = exactly("s", "gpu-share.nvidia.com", capacity={"requests": {"memory": "30Gi"}})
    existing = [
        allocated(
            "o",
            result(
                "gpu-0-shared",
                "n1",
                shareID="0f0e0d0c-0000-4000-8000-000000000000",
                consumedCapacity={"memory": "30Gi", "compute": "10"},
            ),
        )
    ]
    [second] = run([claim("c", big)], slices, existing=existing)
    assert not second.allocatable
    # Not requested and no default: the whole capacity.
    [whole] = run([claim("c", exactly("s", "gpu-share.nvidia.com"))], slices)
    assert whole.results[0].consumed_capacity == {"memory": Decimal(2**30), "compute": Decimal(100)}


def test_capacity_request_above_max_or_valid_values_fails() -> None:
    compute = {"value": "100", "requestPolicy": {"validValues": ["10", "50"]}}
    share = device("gpu-0-shared", "gpu-share", capacity={"compute": compute}, multi=True)
    request = exactly("s", "gpu-share.nvidia.com", capacity={"requests": {"compute": "60"}})
    [explanation] = run([claim("c", request)], [resource_slice("s", "n1", [share])])
    assert not explanation.allocatable
    assert "above every valid value" in explanation.requests[0].rejected[0].reason


def test_capacity_request_is_a_minimum_on_exclusive_devices() -> None:
    devices = [device("gpu-0", capacity={"memory": "20Gi"}), device("gpu-1", capacity={"memory": "80Gi"})]
    request = exactly("g", capacity={"requests": {"memory": "40Gi"}})
    [explanation] = run([claim("c", request)], [resource_slice("s", "n1", devices)])
    assert allocated_labels(explanation) == ["n1/gpu-1"]


def test_two_requests_share_one_multi_allocatable_device() -> None:
    share = device("gpu-0-shared", "gpu-share", capacity={"memory": "40Gi"}, multi=True)
    requests = [
        exactly("a", "gpu-share.nvidia.com", capacity={"requests": {"memory": "10Gi"}}),
        exactly("b", "gpu-share.nvidia.com", capacity={"requests": {"memory": "10Gi"}}),
    ]
    [explanation] = run([claim("c", *requests)], [resource_slice("s", "n1", [share])])
    assert allocated_labels(explanation) == ["n1/gpu-0-shared", "n1/gpu-0-shared"]
    assert explanation.results[0].share_id != explanation.results[1].share_id


def test_claims_of_one_pod_land_on_one_node() -> None:
    slices = [
        resource_slice("a", "node-a", [device("gpu-0")]),
        resource_slice("b", "node-b", [device("gpu-0"), device("m-0", "mig")]),
    ]
    first, second = run(
        [claim("g", exactly("g")), claim("m", exactly("m", "mig.nvidia.com"))], slices, together=True
    )
    assert first.node == second.node == "node-b"


def test_node_selector_slices() -> None:
    shared = resource_slice("net", "ignored", [device("nic-0", "gpu")])
    del shared["spec"]["nodeName"]
    shared["spec"]["nodeSelector"] = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}]
    }
    nodes = [Node("n0", {"zone": "z0"}), Node("n1", {"zone": "z1"})]
    [explanation] = run([claim("c", exactly("g"))], [shared], nodes=nodes)
    assert explanation.node == "n1"


def test_missing_device_class() -> None:
    [explanation] = run(
        [claim("c", exactly("g", "no-such-class"))], [resource_slice("s", "n1", [device("gpu-0")])]
    )
    assert not explanation.allocatable
    assert "DeviceClass 'no-such-class' not found" in (explanation.reason or "")
