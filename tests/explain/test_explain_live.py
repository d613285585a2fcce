"""`dra-gpu explain --kubeconfig` against a real kube-apiserver: slices and allocated claims read live."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.allocator.builders import device, resource_slice

pytestmark = pytest.mark.apiserver


def test_explain_reads_slices_and_allocations_from_the_cluster(kube_apiserver: Any, tmp_path: Path) -> None:
    from kubernetes import client

    suffix = uuid.uuid4().hex[:8]
    driver = f"explain-{suffix}.example.com"
    node = f"explain-{suffix}-node"
    api_client = kube_apiserver.api_client()
    custom = client.CustomObjectsApi(api_client)
    group = ("resource.k8s.io", "v1")
    device_class: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": f"explain-{suffix}"},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{driver}'"}}]},
    }
    slice_obj = resource_slice(f"{node}-0", node, [device("dev-0"), device("dev-1")], driver=driver)
    held: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"held-{suffix}", "namespace": "default"},
        "spec": {
            "devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": f"explain-{suffix}"}}]}
        },
    }
    try:
        custom.create_cluster_custom_object(*group, "resourceslices", slice_obj)
        created: Any = custom.create_namespaced_custom_object(*group, "default", "resourceclaims", held)
        created["status"] = {
            "allocation": {
                "devices": {"results": [{"request": "r", "driver": driver, "pool": node, "device": "dev-0"}]}
            }
        }
        custom.replace_namespaced_custom_object_status(
            *group, "default", "resourceclaims", held["metadata"]["name"], created
        )
        wanted = dict(held, metadata={"name": f"wanted-{suffix}", "namespace": "default"})
        (tmp_path / "in.yaml").write_text(yaml.safe_dump_all([device_class, wanted]))
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "dra_gpu.cli.main",
                "explain",
                "-f",
                str(tmp_path / "in.yaml"),
                "--kubeconfig",
                str(kube_apiserver.kubeconfig),
                "-o",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        [entry] = json.loads(done.stdout)["claims"]
        request = entry["requests"][0]
        assert request["allocated"] == [f"{node}/dev-1"]
        assert request["rejected"] == [
            {
                "device": f"{node}/dev-0",
                "reason": f"already allocated to claim default/held-{suffix}",
                "kind": "allocated",
            }
        ]
    finally:
        for call, args in (
            (custom.delete_namespaced_custom_object, (*group, "default", "resourceclaims", f"held-{suffix}")),
            (custom.delete_cluster_custom_object, (*group, "resourceslices", slice_obj["metadata"]["name"])),
        ):
            with contextlib.suppress(client.exceptions.ApiException):
                call(*args)
        api_client.close()
