"""The project's bash scripts run under `set -o pipefail`: a pipeline whose reader stops early fails them.

`cmd | head -n1` (or `| grep -q`) lets the reader exit before the writer is done; the writer then dies of
SIGPIPE and pipefail turns that into exit 141, at random (CI, stop 33: `buildah images | head -n1` ended
`make e2e-kind` after a 40-minute run). Readers that consume all input (awk, sed, `grep >/dev/null`) cannot.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# A pipe into a reader that may stop before its input ends.
EARLY_READER = re.compile(r"\|\s*(head\b|grep\s+(-\w*q\w*|--quiet)\b)")


def _pipefail_scripts() -> list[Path]:
    found = []
    for path in sorted(REPO.rglob("*")):
        if any(part in {".venv", ".git", "node_modules", "build"} for part in path.relative_to(REPO).parts):
            continue
        if path.suffix != ".sh" and path.parent.name != ".ci":
            continue
        if path.is_file() and "pipefail" in path.read_text(errors="replace"):
            found.append(path)
    return found


def test_the_scan_finds_the_scripts_ci_runs() -> None:
    names = {p.relative_to(REPO).as_posix() for p in _pipefail_scripts()}
    assert {"manifests/image/build.sh", "e2e/kind/run.sh", ".ci/run"} <= names


def test_no_pipefail_script_pipes_into_a_reader_that_stops_early() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in _pipefail_scripts()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if not line.lstrip().startswith("#") and EARLY_READER.search(line)
    ]
    assert not offenders, "use awk 'NR == 1' / sed -n 1p / grep >/dev/null instead:\n" + "\n".join(offenders)


def test_the_failure_it_guards_against_is_real() -> None:
    # The writer outlives its reader: under pipefail the pipeline fails with SIGPIPE's 141.
    early = subprocess.run(["bash", "-c", "set -o pipefail; seq 1000000 | head -n1 >/dev/null"], check=False)
    whole = subprocess.run(
        ["bash", "-c", "set -o pipefail; seq 1000000 | awk 'NR == 1' >/dev/null"], check=False
    )
    assert early.returncode == 141
    assert whole.returncode == 0
