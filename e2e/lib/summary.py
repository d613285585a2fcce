"""The end-of-run report: a plain-text table (pure) and its JSON form, written to `e2e/_artifacts/`."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ExampleRow:
    example: str
    pods: str  # "2/2 Running"
    devices: str  # "gpu-0, gpu-1"
    sharing: str  # "time-slice=Long on gpu-0"
    result: str  # "pass" | "fail" | "skip"
    detail: str = ""  # the first line of the failure, if any


def render_table(headers: Sequence[str], rows: Iterable[Sequence[str]], max_width: int = 60) -> str:
    """Columns padded to the widest cell (cut at `max_width` with an ellipsis), a rule under the header."""

    def cut(cell: str) -> str:
        cell = " ".join(cell.split())
        return cell if len(cell) <= max_width else cell[: max_width - 1] + "…"

    body = [[cut(str(c)) for c in row] for row in rows]
    for row in body:
        if len(row) != len(headers):
            raise ValueError(f"row {row!r} has {len(row)} cells, the table has {len(headers)} columns")
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in body]
    return "\n".join(lines)


def examples_table(rows: Sequence[ExampleRow]) -> str:
    headers = ("example", "pods", "devices", "sharing effect", "result")
    return render_table(headers, [(r.example, r.pods, r.devices, r.sharing, r.result) for r in rows])


@dataclass
class RunReport:
    """What run-e2e.sh prints at the end; pytest writes rows, the script adds timings it measured itself."""

    rows: list[ExampleRow] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"rows": [asdict(r) for r in self.rows], "timings_s": self.timings_s, "notes": self.notes}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunReport:
        return cls(
            rows=[ExampleRow(**r) for r in data.get("rows", [])],
            timings_s={str(k): float(v) for k, v in (data.get("timings_s") or {}).items()},
            notes=[str(n) for n in data.get("notes", [])],
        )


def load_report(path: Path) -> RunReport:
    if not path.exists():
        return RunReport()
    return RunReport.from_json(json.loads(path.read_text()))


def save_report(path: Path, report: RunReport) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def record_row(path: Path, row: ExampleRow) -> None:
    """Add or replace (by example name) one row of the report file."""
    report = load_report(path)
    report.rows = [r for r in report.rows if r.example != row.example] + [row]
    save_report(path, report)


def record_timing(path: Path, name: str, seconds: float) -> None:
    report = load_report(path)
    report.timings_s[name] = round(seconds, 3)
    save_report(path, report)


def timings_table(timings: Mapping[str, float], labels: Mapping[str, str]) -> str:
    """Timings in a fixed order (that of `labels`), then any others; missing ones shown as 'n/a'."""
    rows = [(label, _fmt(key, timings.get(key))) for key, label in labels.items()]
    rows += [(key, _fmt(key, v)) for key, v in sorted(timings.items()) if key not in labels]
    return render_table(("timing", "value"), rows)


def _fmt(key: str, value: float | None) -> str:
    """Keys ending in `_pct` are percentages; every other timing is in seconds."""
    if value is None:
        return "n/a"
    if key.endswith("_pct"):
        return f"{value:.1f} %"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.2f} s"
    return f"{value / 60:.1f} min"
