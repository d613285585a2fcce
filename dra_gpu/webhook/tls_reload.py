"""The webhook TLS context, rebuilt when the mounted certificate or key changes (rotation, no restart).

The kubelet updates a mounted Secret atomically: it writes a new directory and swaps the `..data` symlink, so
`tls.crt` and `tls.key` (links through `..data`) change together and their inode changes. A writer that is not
atomic (files copied one after the other) can leave a certificate and a key that do not match for a moment:
such a pair is refused and the previous context keeps serving until the files agree again.
"""

from __future__ import annotations

import os
import ssl
import threading
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)

_Stamp = tuple[int, int, int, int, int, int]


@dataclass(frozen=True)
class TlsFiles:
    cert_file: str
    key_file: str


def _stamp(files: TlsFiles) -> _Stamp:
    cert, key = os.stat(files.cert_file), os.stat(files.key_file)  # follows the kubelet's symlinks
    return (cert.st_ino, cert.st_mtime_ns, cert.st_size, key.st_ino, key.st_mtime_ns, key.st_size)


def _context(files: TlsFiles) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(files.cert_file, files.key_file)
    return context


class ReloadingContext:
    """The SSLContext for new connections; `current()` swaps in a fresh one when the files changed.

    A fresh context rather than `load_cert_chain` on the live one: handshakes running in other threads keep
    the context they started with, and no handshake ever sees a certificate without its key.
    """

    def __init__(self, files: TlsFiles) -> None:
        self._files = files
        self._lock = threading.Lock()
        self._stamp = _stamp(files)
        self._context = _context(files)  # a missing or broken pair at start-up is an error for the caller

    def current(self) -> ssl.SSLContext:
        try:
            stamp = _stamp(self._files)
        except OSError as err:  # the files are being replaced: serve what we have
            log.warning("webhook certificate unreadable, serving the previous one", error=str(err))
            return self._context
        with self._lock:
            if stamp != self._stamp:
                try:
                    self._context = _context(self._files)
                except (OSError, ssl.SSLError) as err:
                    log.warning(
                        "webhook certificate not reloaded, serving the previous one",
                        cert_file=self._files.cert_file,
                        error=str(err),
                    )
                    return self._context  # stamp not recorded: the next connection tries again
                self._stamp = stamp
                log.info("webhook certificate reloaded", cert_file=self._files.cert_file)
            return self._context
