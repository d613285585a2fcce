"""Unit tests of the e2e helpers (`e2e/lib`) and of the kind files; `e2e` is imported from the repo root."""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
