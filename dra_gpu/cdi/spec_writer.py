"""Write and remove the per-claim CDI spec files in the CDI root (`/var/run/cdi`)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dra_gpu.cdi.spec_builder import claim_uid_from_file_name, spec_file_name
from dra_gpu.cdi.spec_validation import validate_spec
from dra_gpu.checkpoint.atomic_file import atomic_write


class CdiWriteError(Exception):
    """The spec could not be written; the message names the file and the cause."""


class CdiSpecWriter:
    def __init__(self, cdi_root: Path | str) -> None:
        self.cdi_root = Path(cdi_root)

    def path_for(self, claim_uid: str) -> Path:
        return self.cdi_root / spec_file_name(claim_uid)

    def write(self, claim_uid: str, spec: Mapping[str, Any]) -> Path:
        """Validate and atomically write the claim's spec (readable by the container runtime)."""
        validate_spec(spec)
        path = self.path_for(claim_uid)
        # Not fsynced: the spec is transient (the CDI root is normally the tmpfs /var/run/cdi, and leftovers
        # are removed at start-up), so only atomicity matters, and that holds across a process crash.
        # One line: without `indent` the json module encodes in C; the indenting encoder, pure Python, was a
        # seventh of a prepare's time holding the GIL (`jq . <spec>` to read it).
        data = (json.dumps(spec) + "\n").encode()
        try:
            atomic_write(path, data, error=CdiWriteError, mode=0o644, durable=False)
        except CdiWriteError as exc:
            if not isinstance(exc.__cause__, FileNotFoundError):
                raise
            # The CDI root is made when a write finds it missing (first use, a cleared tmpfs) rather than
            # checked before every write: a prepare's system calls are where its thread gives up the GIL.
            # Whether it is there now does not matter: a concurrent prepare that failed the same way may have
            # just made it, and this write still has to be tried again.
            try:
                self.cdi_root.mkdir(parents=True, exist_ok=True, mode=0o755)
            except OSError as error:
                message = f"creating CDI directory {self.cdi_root}: {error.strerror or error}"
                raise CdiWriteError(message) from error
            atomic_write(path, data, error=CdiWriteError, mode=0o644, durable=False)
        return path

    def has_spec(self, claim_uid: str) -> bool:
        """The claim's spec file exists (either extension)."""
        return any((self.cdi_root / spec_file_name(claim_uid, ext)).is_file() for ext in ("json", "yaml"))

    def remove(self, claim_uid: str) -> bool:
        """Remove the claim's spec (either extension); True when a file was removed. Missing is fine."""
        removed = False
        for extension in ("json", "yaml"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.cdi_root / spec_file_name(claim_uid, extension))
                removed = True
        return removed

    def claim_uids(self) -> set[str]:
        """Claims that have a spec file here (to find leftovers at start-up)."""
        try:
            names = os.listdir(self.cdi_root)
        except FileNotFoundError:
            return set()
        return {uid for name in names if (uid := claim_uid_from_file_name(name)) is not None}
