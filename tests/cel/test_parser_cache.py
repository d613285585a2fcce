"""The CEL parser's tables are cached in the user's cache directory, and a cache that cannot be used changes
nothing but the start-up time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# `true` is an identifier to the lexer and a literal after cel-python's lexer callback: a parser loaded from
# the cache must still have the callback, or the comparison would be with an unknown variable.
SCRIPT = """
from dra_gpu.cel.environment import compile_selector
from dra_gpu.cel.syntax import parse
print(type(parse("true == (1 < 2)")).__name__, compile_selector("device.driver == 'a' || true").expression)
"""


def _run(cache_home: Path) -> str:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stderr == ""
    return done.stdout


def test_tables_are_written_once_and_loaded_after(tmp_path: Path) -> None:
    first = _run(tmp_path)
    (cache,) = (tmp_path / "dra-gpu").iterdir()
    assert cache.name.startswith("cel-lalr-lark-") and cache.stat().st_size > 0
    written = cache.stat().st_mtime_ns
    assert _run(tmp_path) == first
    assert cache.stat().st_mtime_ns == written  # loaded, not made again


def test_a_broken_or_unwritable_cache_is_passed_over(tmp_path: Path) -> None:
    expected = _run(tmp_path / "fresh")
    broken = tmp_path / "broken"
    (broken / "dra-gpu").mkdir(parents=True)
    cache_name = next((tmp_path / "fresh" / "dra-gpu").iterdir()).name
    (broken / "dra-gpu" / cache_name).write_bytes(b"not a pickle")
    assert _run(broken) == expected
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache directory would be")
    assert _run(blocked) == expected


def test_no_home_means_no_cache_and_no_stray_folder(tmp_path: Path) -> None:
    """An arbitrary UID in a container may have no HOME and no passwd entry: nothing is written anywhere."""
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "XDG_CACHE_HOME")}
    env["HOME"] = "relative-home"  # what is left of "~" when it cannot be expanded: not absolute
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.stdout == _run(tmp_path / "cache") and list(tmp_path.iterdir()) == [tmp_path / "cache"]
