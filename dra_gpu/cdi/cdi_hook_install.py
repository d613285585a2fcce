"""Where the node's container runtime finds nvidia-cdi-hook, the binary NVIDIA's CDI hooks name.

The runtime runs CDI hooks on the host, so the spec must name a path that exists there, not in our image.
Like NVIDIA's kubelet plugin: an explicit host path (`--nvidia-cdi-hook-path`, chart value
`nvidiaCDIHookPath`, e.g. where the NVIDIA Container Toolkit is installed on the node) is used as given;
otherwise the copy in our image (/usr/bin/nvidia-cdi-hook) is copied into the plugin's directory under the
kubelet's plugins directory, which the chart mounts at the same path as on the host. Without either, the
specs carry no hooks (own discovery, soname mounts) and the start-up log says so once.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

HOOK_BINARY = "nvidia-cdi-hook"


def install_cdi_hook(explicit: str | None, plugin_dir: Path, source: str | None = None) -> str | None:
    """The host path of nvidia-cdi-hook for the specs, or None (no hooks). `source`: the binary to copy
    (default: nvidia-cdi-hook on PATH)."""
    if explicit:
        if not explicit.startswith("/"):
            raise ValueError(
                f"--nvidia-cdi-hook-path must be an absolute path on the node, got {explicit!r} "
                "(chart value nvidiaCDIHookPath)"
            )
        log.info("CDI hooks use the configured nvidia-cdi-hook", path=explicit)
        return explicit
    binary = source or shutil.which(HOOK_BINARY)
    if not binary:
        log.warning(
            "no nvidia-cdi-hook in this image and no --nvidia-cdi-hook-path: CDI specs carry no NVIDIA hooks "
            "(update-ldcache, create-symlinks, enable-cuda-compat); images whose loader does not search the "
            "driver's library directory will not find libcuda",
        )
        return None
    dest = plugin_dir / HOOK_BINARY
    plugin_dir.mkdir(parents=True, exist_ok=True)
    # Copy beside the destination and rename: a runtime running the old copy never sees a half-written file.
    fd, tmp = tempfile.mkstemp(prefix=f".{HOOK_BINARY}-", dir=plugin_dir)
    try:
        with os.fdopen(fd, "wb") as out, open(binary, "rb") as src:
            shutil.copyfileobj(src, out)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    log.info("nvidia-cdi-hook copied for the container runtime", source=binary, path=str(dest))
    return str(dest)
