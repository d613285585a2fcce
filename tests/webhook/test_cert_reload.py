"""Certificate rotation without a restart, as the kubelet delivers it: the mounted Secret's `..data` symlink
is swapped to a new directory; a writer that is not atomic never costs a refused handshake."""

from __future__ import annotations

import os
import shutil
import time
from contextlib import AbstractContextManager
from pathlib import Path

from webhook_helpers import Cert, make_cert, served_common_name, serving

from dra_gpu.webhook.server import TlsFiles, WebhookServer


def running(cert_file: Path, key_file: Path) -> AbstractContextManager[WebhookServer]:
    return serving(WebhookServer("127.0.0.1", 0, TlsFiles(str(cert_file), str(key_file))))


def _secret_volume(root: Path, cert: Cert, version: str) -> None:
    """The kubelet's AtomicWriter layout: ..<version>/ holds the files, ..data links to it, tls.crt and
    tls.key link through ..data; a new version is written beside it and ..data swapped by rename."""
    data = root / f"..{version}"
    data.mkdir()
    shutil.copy(cert.cert_file, data / "tls.crt")
    shutil.copy(cert.key_file, data / "tls.key")
    tmp = root / "..data_tmp"
    tmp.symlink_to(data.name)
    os.rename(tmp, root / "..data")
    for name in ("tls.crt", "tls.key"):
        if not (root / name).is_symlink():
            (root / name).symlink_to(f"..data/{name}")


def _cert(tmp_path: Path, name: str) -> Cert:
    directory = tmp_path / name
    directory.mkdir()
    return make_cert(directory, name)


def test_a_swapped_secret_volume_is_served_on_the_next_connection(tmp_path: Path) -> None:
    volume = tmp_path / "volume"
    volume.mkdir()
    _secret_volume(volume, _cert(tmp_path, "first"), "2026_01_01")
    with running(volume / "tls.crt", volume / "tls.key") as server:
        assert served_common_name(server.port) == "first"
        _secret_volume(volume, _cert(tmp_path, "second"), "2026_02_01")
        assert served_common_name(server.port) == "second"
        _secret_volume(volume, _cert(tmp_path, "third"), "2026_03_01")
        assert served_common_name(server.port) == "third"


def test_a_half_written_pair_keeps_the_previous_certificate(tmp_path: Path) -> None:
    """The certificate replaced before its key: handshakes keep succeeding with the old pair, and the new
    one is served as soon as the key matches."""
    first, second = _cert(tmp_path, "first"), _cert(tmp_path, "second")
    live = tmp_path / "live"
    live.mkdir()
    cert_file, key_file = live / "tls.crt", live / "tls.key"
    shutil.copy(first.cert_file, cert_file)
    shutil.copy(first.key_file, key_file)
    with running(cert_file, key_file) as server:
        shutil.copy(second.cert_file, cert_file)  # the key is still first's
        assert served_common_name(server.port) == "first"
        assert served_common_name(server.port) == "first"
        time.sleep(0.01)
        shutil.copy(second.key_file, key_file)
        assert served_common_name(server.port) == "second"


def test_files_missing_for_a_moment_keep_the_previous_certificate(tmp_path: Path) -> None:
    first = _cert(tmp_path, "first")
    live = tmp_path / "live"
    live.mkdir()
    cert_file, key_file = live / "tls.crt", live / "tls.key"
    shutil.copy(first.cert_file, cert_file)
    shutil.copy(first.key_file, key_file)
    with running(cert_file, key_file) as server:
        cert_file.unlink()
        assert served_common_name(server.port) == "first"
