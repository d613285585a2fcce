from __future__ import annotations

from typing import Any

from e2e.lib.images import images_in, mapping_from_dict, substitute_images


def _deployment(image: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "spec": {
            "template": {
                "spec": {
                    "initContainers": [{"name": "i", "image": image}],
                    "containers": [{"name": "c", "image": image}],
                }
            }
        },
    }


def test_every_container_of_nested_pod_specs_is_rewritten() -> None:
    docs = [
        _deployment("ubuntu:24.04"),
        {"kind": "Pod", "spec": {"containers": [{"image": "nvidia/cuda:12"}]}},
    ]
    convert = mapping_from_dict({}, default="registry.local/busybox:1")
    out, changed = substitute_images(docs, convert)
    assert images_in(out) == {"registry.local/busybox:1"}
    assert len(changed) == 3
    assert out[1]["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"
    # the input is left alone
    assert images_in(docs) == {"ubuntu:24.04", "nvidia/cuda:12"}


def test_exact_name_then_repository_then_default() -> None:
    convert = mapping_from_dict({"ubuntu:24.04": "a", "nvidia/cuda": "b"}, default=None)
    assert convert("ubuntu:24.04") == "a"
    assert convert("nvidia/cuda:12.4.1-base") == "b"
    assert convert("localhost:5000/x") == "localhost:5000/x"  # a registry port is not a tag


def test_unchanged_images_are_not_reported() -> None:
    docs = [{"kind": "Pod", "spec": {"containers": [{"image": "keep"}]}}]
    out, changed = substitute_images(docs, lambda image: image)
    assert changed == [] and "imagePullPolicy" not in out[0]["spec"]["containers"][0]
