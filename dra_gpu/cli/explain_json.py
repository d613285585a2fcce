"""Write `explain -o json` without building the per-device rejections as objects.

Over a fleet, the JSON is mostly `rejected` entries: an unsatisfiable 4-request MIG claim over 1,000 DGX H100
nodes rejects ~800,000 devices (138 MB of JSON). Nearly all of them belong to nodes carried over from an
identical node (`allocator.node_equivalence`): the same entries with the node's name swapped. Such a run is
encoded once per searched node, with a marker where a pool name goes, and written for every other node by
putting its names in. The rest of the document is encoded as usual; the rejection lists are streamed into it.

The output is the same text `json.dumps` writes for the materialized document (a test compares them).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TextIO

from dra_gpu.allocator.explain import RejectionRuns
from dra_gpu.allocator.model import Rejection
from dra_gpu.allocator.node_equivalence import PoolRenaming, RenamedRejections, names_pattern

# JSON escapes every control character, so these never appear in encoded text: each marks where the pool
# name of that index goes. A node with more distinct pool names than this is written entry by entry.
_MARKERS = [chr(i) for i in range(32)]


def rejection_json(rejection: Rejection) -> dict[str, str]:
    return {"device": rejection.device, "reason": rejection.reason, "kind": rejection.kind}


def write_json(document: Mapping[str, Any], out: TextIO, *, indent: int | None) -> None:
    """`document` as JSON and a newline; RejectionRuns values become lists of {device, reason, kind}."""
    if indent is not None:
        out.write(json.dumps(document, indent=indent, default=_materialized) + "\n")
        return
    nonce = secrets.token_hex(12)
    streamed: list[RejectionRuns] = []

    def placeholder(value: object) -> str:
        if isinstance(value, RejectionRuns):
            streamed.append(value)
            return f"{nonce}:{len(streamed) - 1}"
        raise TypeError(f"{type(value).__name__} is not JSON serializable")

    text = json.dumps(document, default=placeholder)
    templates: dict[tuple[int, tuple[str, ...]], _RunTemplate] = {}
    position = 0
    for match in re.finditer(f'"{nonce}:([0-9]+)"', text):
        out.write(text[position : match.start()])
        out.write("[")
        for chunk in _runs_json(streamed[int(match.group(1))], templates):
            out.write(chunk)
        out.write("]")
        position = match.end()
    out.write(text[position:])
    out.write("\n")


def _materialized(value: object) -> list[dict[str, str]]:
    if isinstance(value, RejectionRuns):
        return [rejection_json(r) for r in value]
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _runs_json(
    runs: RejectionRuns, templates: dict[tuple[int, tuple[str, ...]], _RunTemplate]
) -> Iterator[str]:
    """The entries of every run, comma-separated, without the brackets."""
    first = True
    for run in runs.runs:
        if not run:
            continue
        if not first:
            yield ", "
        first = False
        if isinstance(run, RenamedRejections):
            renaming = run.renaming
            key = (id(run.source), tuple(pool.name for pool in renaming.searched))
            template = templates.get(key)
            if template is None:
                template = templates[key] = _RunTemplate(run.source, renaming)
            yield template.render(renaming)
        else:
            yield json.dumps([rejection_json(r) for r in run])[1:-1]


class _RunTemplate:
    """A searched node's rejection list encoded once, a marker where each of its pool names goes."""

    def __init__(self, source: Sequence[Rejection], renaming: PoolRenaming) -> None:
        self.source = source  # kept alive: its id() is the cache key
        self.names = list(dict.fromkeys(pool.name for pool in renaming.searched))
        self.text: str | None = None
        if len(self.names) > len(_MARKERS):
            return
        marker_of = {name: _MARKERS[i] for i, name in enumerate(self.names)}
        pattern = names_pattern(self.names)

        def encoded(value: str) -> str:
            if pattern is None:
                return _escaped(value)
            pieces, position = [], 0
            for match in pattern.finditer(value):
                pieces.append(_escaped(value[position : match.start()]))
                pieces.append(marker_of[match.group(0)])
                position = match.end()
            pieces.append(_escaped(value[position:]))
            return "".join(pieces)

        # A device label of the searched node becomes the label of the device at the same position of the
        # other node (PoolRenaming.rejection): its pool's name, then the same device name.
        label_of = {
            candidate.label: f"{marker_of[pool.name]}/{_escaped(candidate.name)}"
            for pool in renaming.searched
            for candidate in pool.candidates
            if candidate.pool == pool.name
        }
        memo: dict[str, str] = {}

        def memoized(value: str) -> str:
            done = memo.get(value)
            if done is None:
                done = memo[value] = encoded(value)
            return done

        self.text = ", ".join(
            f'{{"device": "{label_of.get(r.device) or memoized(r.device)}", '
            f'"reason": "{memoized(r.reason)}", "kind": "{_escaped(r.kind)}"}}'
            for r in source
        )

    def render(self, renaming: PoolRenaming) -> str:
        if self.text is None:
            return json.dumps([rejection_json(r) for r in RenamedRejections(self.source, renaming)])[1:-1]
        text = self.text
        for marker, name in zip(_MARKERS, self.names, strict=False):
            text = text.replace(marker, _escaped(renaming.renames.get(name, name)))
        return text


def _escaped(value: str) -> str:
    """`value` as json.dumps writes it inside the quotes."""
    return json.dumps(value)[1:-1]
