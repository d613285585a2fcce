"""Read Kubernetes manifests (multi-document YAML or JSON, files or directories) keeping line numbers.

Every mapping becomes a `Located` dict that remembers the line of the mapping and of each key, so that `lint`
and `explain` can point at `file:line`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


class ManifestError(ValueError):
    """A file that cannot be read or parsed; the message names the file and line."""


class Located(dict[str, Any]):
    """A mapping with the 1-based line of itself (`line`) and of each key (`key_lines`)."""

    line: int | None = None
    key_lines: dict[str, int]

    def line_of(self, key: str) -> int | None:
        lines = getattr(self, "key_lines", {})
        return lines.get(key, self.line)


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> Located:
    loader.flatten_mapping(node)
    mapping = Located()
    mapping.line = node.start_mark.line + 1
    mapping.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        value = loader.construct_object(value_node, deep=True)
        if not isinstance(key, str | int | float | bool) and key is not None:
            raise ManifestError(f"line {key_node.start_mark.line + 1}: unsupported mapping key {key!r}")
        mapping[str(key) if not isinstance(key, str) else key] = value
        mapping.key_lines[str(key)] = key_node.start_mark.line + 1
    return mapping


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


@dataclass
class Document:
    path: str
    index: int  # position of the document in its file
    line: int | None
    obj: Any  # usually a Located mapping

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}" if self.line else self.path


def expand_paths(paths: Iterable[str]) -> list[tuple[Path, bool]]:
    """(file, found in a directory): files as given; directories recursively (sorted), keeping only
    .yaml/.yml/.json."""
    out: list[tuple[Path, bool]] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in MANIFEST_SUFFIXES)
            out.extend((p, True) for p in found)
        elif path.exists() or raw == "-":
            out.append((path, False))
        else:
            raise ManifestError(f"{raw}: no such file or directory")
    return out


def load_documents(paths: Iterable[str]) -> list[Document]:
    """The documents of every file. A file found in a directory in which no document has `apiVersion` or
    `kind` is not a manifest (a Helm values file, a JSON schema, the examples' expect.yaml) and is passed
    over; a file named on its own is always read as one, so a manifest that lacks both is still reported."""
    documents: list[Document] = []
    for path, in_directory in expand_paths(paths):
        loaded = load_file(path)
        if in_directory and not any(_looks_like_an_object(d.obj) for d in loaded):
            continue
        documents.extend(loaded)
    return documents


def _looks_like_an_object(obj: Any) -> bool:
    return isinstance(obj, dict) and ("apiVersion" in obj or "kind" in obj)


def load_text(text: str, name: str) -> list[Document]:
    documents = []
    try:
        for index, obj in enumerate(_iter_documents(text)):
            if obj is None:
                continue
            line = obj.line if isinstance(obj, Located) else None
            if (
                isinstance(obj, Located)
                and obj.get("kind", "").endswith("List")
                and isinstance(obj.get("items"), list)
            ):
                for item_index, item in enumerate(obj["items"]):
                    item_line = item.line if isinstance(item, Located) else line
                    documents.append(Document(name, index * 1000 + item_index, item_line, item))
                continue
            documents.append(Document(name, index, line, obj))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{name}:{mark.line + 1}" if mark is not None else name
        problem = getattr(error, "problem", None) or str(error)
        raise ManifestError(f"{where}: invalid YAML: {problem}") from None
    return documents


def load_file(path: Path) -> list[Document]:
    try:
        text = path.read_text(encoding="utf-8") if str(path) != "-" else __import__("sys").stdin.read()
    except (OSError, UnicodeDecodeError) as error:
        raise ManifestError(f"{path}: cannot read: {error}") from None
    return load_text(text, str(path))


def _iter_documents(text: str) -> Iterator[Any]:
    loader = _Loader(text)
    try:
        while loader.check_data():  # type: ignore[no-untyped-call]
            yield loader.get_data()
    finally:
        loader.dispose()
