"""Image substitution: examples name public images; the local cluster has only `registry.local/busybox:1`.

Walks every pod spec in a list of manifests (pods, templates of Deployments/Jobs/..., nested at any depth) and
rewrites `image` of containers and init containers through a mapping function. Pure.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any

ImageMap = Callable[[str], str]


def mapping_from_dict(table: Mapping[str, str], default: str | None) -> ImageMap:
    """Exact image names first, then `repo` without tag, then `default` (None keeps the image)."""

    def convert(image: str) -> str:
        if image in table:
            return table[image]
        repo = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
        if repo in table:
            return table[repo]
        return default if default is not None else image

    return convert


def _rewrite(node: Any, convert: ImageMap, seen: list[tuple[str, str]]) -> None:
    if isinstance(node, dict):
        for key in ("containers", "initContainers", "ephemeralContainers"):
            containers = node.get(key)
            if isinstance(containers, list):
                for c in containers:
                    if isinstance(c, dict) and isinstance(c.get("image"), str):
                        new = convert(c["image"])
                        if new != c["image"]:
                            seen.append((c["image"], new))
                            c["image"] = new
                            # A local image must not be pulled: the node has it, the registry does not exist.
                            c["imagePullPolicy"] = "IfNotPresent"
        for value in node.values():
            _rewrite(value, convert, seen)
    elif isinstance(node, list):
        for item in node:
            _rewrite(item, convert, seen)


def substitute_images(
    docs: Iterable[Mapping[str, Any]], convert: ImageMap
) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """Copies of `docs` with images rewritten, and the (old, new) pairs that changed."""
    out = [copy.deepcopy(dict(d)) for d in docs]
    seen: list[tuple[str, str]] = []
    for doc in out:
        _rewrite(doc, convert, seen)
    return out, seen


def images_in(docs: Iterable[Mapping[str, Any]]) -> set[str]:
    found: list[tuple[str, str]] = []
    for doc in docs:
        _rewrite(copy.deepcopy(dict(doc)), lambda img: img + "\0", found)
    return {old for old, _ in found}
