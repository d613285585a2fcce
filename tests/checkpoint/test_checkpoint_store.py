"""The checkpoint file: round trip, forward compatibility, reboots, atomic writes, the node-wide lock."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dra_gpu.checkpoint.checkpoint_store import (
    API_VERSION,
    Checkpoint,
    CheckpointCorruptError,
    CheckpointLockError,
    CheckpointStore,
    CheckpointWriteError,
    ClaimEntry,
    ClaimPhase,
    PreparedDevice,
    PreparedGroup,
)


def entry(uid: str, phase: ClaimPhase = ClaimPhase.PREPARE_COMPLETED) -> ClaimEntry:
    return ClaimEntry(
        uid=uid,
        namespace="ns",
        name=f"claim-{uid}",
        phase=phase,
        devices=(
            PreparedDevice(
                request="gpu/a100",
                pool="node-a",
                device="gpu-0",
                share_id=None,
                cdi_device_ids=(f"k8s.gpu.nvidia.com/claim={uid}-gpu-0",),
            ),
            PreparedDevice(
                request="shared",
                pool="node-a",
                device="gpu-1",
                share_id="11111111-0000-0000-0000-000000000001",
                config={"sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}},
            ),
        ),
        groups=(
            PreparedGroup(
                devices=("gpu-0",),
                state={"timeSlice": {"GPU-1": 2}},
                mig_instances={"gpu-0-mig-1g10gb-19-0": {"parentUUID": "GPU-1", "giID": 3, "ciID": 0}},
                cdi_edits={"env": ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"], "mounts": []},
            ),
        ),
    )


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, boot_id="boot-1")
    with store.locked():
        cp = store.read()
        assert cp.claims == {}
        cp.claims["u1"] = entry("u1")
        cp.claims["u2"] = entry("u2", ClaimPhase.PREPARE_STARTED)
        store.write(cp)
    again = CheckpointStore(tmp_path, boot_id="boot-1").read()
    assert again.claims == cp.claims
    raw = json.loads((tmp_path / "checkpoint.json").read_text())
    assert raw["apiVersion"] == API_VERSION and raw["bootID"] == "boot-1"
    assert raw["claims"]["u2"]["checkpointState"] == "PrepareStarted"
    assert raw["claims"]["u1"]["devices"][1]["config"]["sharing"]["strategy"] == "TimeSlicing"
    assert "config" not in raw["claims"]["u1"]["devices"][0]  # not a shared device
    assert oct((tmp_path / "checkpoint.json").stat().st_mode & 0o777) == "0o600"


def test_unknown_fields_survive_a_rewrite(tmp_path: Path) -> None:
    """A newer plugin version added fields; an older one must keep them when it rewrites the file."""
    store = CheckpointStore(tmp_path, boot_id="b")
    doc = Checkpoint(boot_id="b", claims={"u1": entry("u1")}).to_json()
    doc["futureTopLevel"] = {"x": 1}
    doc["claims"]["u1"]["futureClaimField"] = "keep"
    doc["claims"]["u1"]["devices"][0]["futureDeviceField"] = [1, 2]
    doc["claims"]["u1"]["groups"][0]["futureGroupField"] = True
    (tmp_path / "checkpoint.json").write_text(json.dumps(doc))
    with store.locked():
        cp = store.read()
        cp.claims["u2"] = entry("u2")
        store.write(cp)
    raw = json.loads((tmp_path / "checkpoint.json").read_text())
    assert raw["futureTopLevel"] == {"x": 1}
    assert raw["claims"]["u1"]["futureClaimField"] == "keep"
    assert raw["claims"]["u1"]["devices"][0]["futureDeviceField"] == [1, 2]
    assert raw["claims"]["u1"]["groups"][0]["futureGroupField"] is True
    assert set(raw["claims"]) == {"u1", "u2"}


def test_checkpoint_from_another_boot_reads_empty_but_keeps_claims_for_cleanup(tmp_path: Path) -> None:
    before = CheckpointStore(tmp_path, boot_id="boot-1")
    with before.locked():
        before.write(Checkpoint(boot_id="boot-1", claims={"u1": entry("u1")}))
    after = CheckpointStore(tmp_path, boot_id="boot-2").read()
    assert after.claims == {}
    assert set(after.previous_boot_claims) == {"u1"}
    assert after.boot_id == "boot-2"


def test_real_boot_id_is_recorded(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    assert store.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "expected an object"),
        (json.dumps({"apiVersion": "checkpoint.gpu.nvidia.com/v9", "claims": {}}), "v9"),
        (json.dumps({"apiVersion": API_VERSION, "claims": {"u": {"name": "x"}}}), "malformed claim"),
    ],
)
def test_unreadable_checkpoint_is_refused_with_the_file_named(
    tmp_path: Path, content: str, fragment: str
) -> None:
    (tmp_path / "checkpoint.json").write_text(content)
    with pytest.raises(CheckpointCorruptError) as err:
        CheckpointStore(tmp_path, boot_id="b").read()
    assert str(tmp_path / "checkpoint.json") in str(err.value) and fragment in str(err.value)


@pytest.fixture
def tiny_tmpfs() -> Iterator[Path]:
    """A 64 KiB tmpfs: a real ENOSPC when a write does not fit."""
    mount_point = Path(tempfile.mkdtemp(dir="/tmp", prefix="cp-full-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        _unmount(mount_point)


def _unmount(mount_point: Path) -> None:
    """Unmount and remove the test's tmpfs, even when a failed test left a descriptor open in it (then the
    plain unmount says "target is busy"; a lazy one detaches it now and frees it when that is closed)."""
    if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)
    mount_point.rmdir()


def test_disk_full_leaves_the_old_checkpoint_intact(tiny_tmpfs: Path) -> None:
    store = CheckpointStore(tiny_tmpfs, boot_id="b")
    with store.locked():
        store.write(Checkpoint(boot_id="b", claims={"u1": entry("u1")}))
    before = (tiny_tmpfs / "checkpoint.json").read_bytes()
    huge = Checkpoint(boot_id="b", claims={f"u{i}": entry(f"u{i}") for i in range(400)})
    with store.locked(), pytest.raises(CheckpointWriteError) as err:
        store.write(huge)
    assert "disk full" in str(err.value) and str(tiny_tmpfs / "checkpoint.json") in str(err.value)
    assert (tiny_tmpfs / "checkpoint.json").read_bytes() == before
    assert sorted(os.listdir(tiny_tmpfs)) == ["checkpoint.json", "checkpoint.lock"]  # no temp file left
    store.close()  # its kept lock descriptor would keep the tmpfs busy


def test_read_only_directory_is_a_write_error(tmp_path: Path) -> None:
    mount_point = Path(tempfile.mkdtemp(dir="/tmp", prefix="cp-ro-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)], check=True)
    try:
        store = CheckpointStore(mount_point, boot_id="b")
        with store.locked():
            store.write(Checkpoint(boot_id="b", claims={"u1": entry("u1")}))
        subprocess.run(["mount", "-o", "remount,ro", str(mount_point)], check=True)
        with store.locked(), pytest.raises(CheckpointWriteError) as err:
            store.write(Checkpoint(boot_id="b"))
        assert "Read-only" in str(err.value)
        assert set(store.read().claims) == {"u1"}
        store.close()
    finally:
        _unmount(mount_point)


def _hold_lock(directory: str, held: multiprocessing.synchronize.Event, release: float) -> None:
    store = CheckpointStore(directory, boot_id="b")
    with store.locked():
        held.set()
        time.sleep(release)


def test_lock_excludes_another_process(tmp_path: Path) -> None:
    held = multiprocessing.get_context("fork").Event()
    proc = multiprocessing.get_context("fork").Process(target=_hold_lock, args=(str(tmp_path), held, 1.0))
    proc.start()
    try:
        assert held.wait(10)
        impatient = CheckpointStore(tmp_path, boot_id="b", lock_timeout_s=0.2)
        with pytest.raises(CheckpointLockError, match="another plugin instance"), impatient.locked():
            pass
        patient = CheckpointStore(tmp_path, boot_id="b", lock_timeout_s=10)
        started = time.monotonic()
        with patient.locked():
            waited = time.monotonic() - started
        assert waited > 0.3  # it had to wait for the other process to let go
    finally:
        proc.join(10)


def test_threads_never_interleave_read_modify_write(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, boot_id="b")

    def add(i: int) -> None:
        with store.locked():
            cp = store.read()
            cp.claims[f"u{i}"] = entry(f"u{i}")
            store.write(cp)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(store.read().claims) == 40


def test_lock_is_reentrant_in_one_thread(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, boot_id="b")
    with store.locked(), store.locked():
        store.write(Checkpoint(boot_id="b", claims={"u": entry("u")}))
    assert set(store.read().claims) == {"u"}


def test_unreadable_checkpoint_from_before_the_boot_is_discarded(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.json").write_text("")  # what a power loss can leave behind
    written = (tmp_path / "checkpoint.json").stat().st_mtime
    assert CheckpointStore(tmp_path, boot_id="b", boot_time=written + 60).read().claims == {}
    with pytest.raises(CheckpointCorruptError):
        CheckpointStore(tmp_path, boot_id="b", boot_time=written - 60).read()


def test_boot_time_comes_from_proc_stat() -> None:
    from dra_gpu.checkpoint.checkpoint_store import read_boot_time

    boot = read_boot_time()
    assert boot is not None and 0 < boot < time.time()


def test_group_cdi_edits_are_optional_for_entries_written_before_them() -> None:
    raw = entry("u1").to_json()
    assert raw["groups"][0]["cdiEdits"]["env"] == ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]
    del raw["groups"][0]["cdiEdits"]
    old = ClaimEntry.from_json("u1", raw)
    assert old.groups[0].cdi_edits is None
    assert "cdiEdits" not in old.to_json()["groups"][0]


def test_the_written_file_is_the_detached_json_and_to_json_copies_by_default(tmp_path: Path) -> None:
    """The write encodes the entries' state without copying it first; what lands in the file is what the
    detached form says, and a caller of to_json() still gets state it may change freely."""
    store = CheckpointStore(tmp_path, boot_id="b")
    checkpoint = Checkpoint(boot_id="b", claims={"u1": entry("u1"), "u2": entry("u2")})
    with store.locked():
        store.write(checkpoint)
    assert json.loads(store.path.read_text()) == checkpoint.to_json()
    doc = checkpoint.to_json()
    doc["claims"]["u1"]["groups"][0]["state"]["changed"] = True
    assert "changed" not in checkpoint.claims["u1"].groups[0].state
    shared = checkpoint.to_json(detached=False)
    assert shared["claims"]["u1"]["groups"][0]["state"] == checkpoint.claims["u1"].groups[0].state


def _wait_until(condition: Callable[[], bool], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert condition(), "timed out"


def _queued_behind_the_lock(
    store: CheckpointStore, threads: list[threading.Thread], while_held: Callable[[], None] = lambda: None
) -> None:
    """Start `threads` (one update_claim each) while this thread holds the lock, wait until every update is
    queued, call `while_held`, then release the lock and wait for the threads."""
    with store.locked():
        for thread in threads:
            thread.start()
        _wait_until(lambda: len(store._pending) == len(threads))
        while_held()
    for thread in threads:
        thread.join(10)


def test_updates_queued_behind_the_lock_are_written_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit: eight claims' updates that wait for the lock cost one write, durable because one of
    them asked for it, and every call returns only once its change is in the file."""
    store = CheckpointStore(tmp_path, boot_id="b")
    with store.locked():
        store.write(Checkpoint(boot_id="b", claims={"gone": entry("gone")}))
    writes: list[bool] = []
    real_write = store.write

    def counted_write(checkpoint: Checkpoint, durable: bool = True) -> None:
        writes.append(durable)
        real_write(checkpoint, durable=durable)

    monkeypatch.setattr(store, "write", counted_write)
    returned: dict[str, Checkpoint] = {}
    updates = [(f"uid-{n}", entry(f"uid-{n}")) for n in range(7)] + [("gone", None)]

    def update(uid: str, new: ClaimEntry | None) -> None:
        returned[uid] = store.update_claim(uid, new, durable=uid == "uid-3")

    def nothing_returned_yet() -> None:
        assert returned == {}

    # another call holds the lock while all eight queue up
    _queued_behind_the_lock(
        store, [threading.Thread(target=update, args=pair) for pair in updates], nothing_returned_yet
    )
    assert writes == [True]
    on_disk = json.loads(store.path.read_text())["claims"]
    assert sorted(on_disk) == [f"uid-{n}" for n in range(7)]
    assert all(sorted(cp.claims) == sorted(on_disk) for cp in returned.values())


def test_a_failed_group_write_fails_every_update_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(tmp_path, boot_id="b")
    with store.locked():
        store.write(Checkpoint(boot_id="b", claims={"kept": entry("kept")}))
    before = store.path.read_bytes()

    def full(_checkpoint: Checkpoint, durable: bool = True) -> None:
        raise CheckpointWriteError(f"writing {store.path}: disk full")

    monkeypatch.setattr(store, "write", full)
    errors: list[str] = []

    def update(uid: str) -> None:
        try:
            store.update_claim(uid, entry(uid))
        except CheckpointWriteError as exc:
            errors.append(str(exc))

    _queued_behind_the_lock(store, [threading.Thread(target=update, args=(f"uid-{n}",)) for n in range(3)])
    assert errors == [f"writing {store.path}: disk full"] * 3
    assert store.path.read_bytes() == before


def test_an_update_that_timed_out_on_the_lock_is_never_written(tmp_path: Path) -> None:
    """Its caller was told it failed (and rolls back): a later group write must not carry it in."""
    store = CheckpointStore(tmp_path, boot_id="b", queue_timeout_s=0.2)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store.locked():
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    with pytest.raises(CheckpointLockError):
        store.update_claim("late", entry("late"))
    release.set()
    holder.join(10)
    store.update_claim("next", entry("next"))
    assert sorted(json.loads(store.path.read_text())["claims"]) == ["next"]


def test_a_check_sees_the_updates_before_it_and_refuses_only_its_own(tmp_path: Path) -> None:
    """Two claims reserve the same device in one group write: the second one's check sees the first
    reservation and refuses; the first is written, the second raises its own error and is left out."""
    store = CheckpointStore(tmp_path, boot_id="b")

    class TakenError(Exception):
        pass

    def refuse_if_held(uid: str) -> Callable[[Checkpoint], None]:
        def check(checkpoint: Checkpoint) -> None:
            holders = [other for other in checkpoint.claims if other != uid]
            if holders:
                raise TakenError(f"gpu-0 is held by {holders}")

        return check

    outcomes: dict[str, str] = {}

    def reserve(uid: str) -> None:
        try:
            store.update_claim(uid, entry(uid, ClaimPhase.PREPARE_STARTED), check=refuse_if_held(uid))
            outcomes[uid] = "written"
        except TakenError as exc:
            outcomes[uid] = str(exc)

    first = threading.Thread(target=reserve, args=("first",))
    second = threading.Thread(target=reserve, args=("second",))
    with store.locked():
        first.start()
        _wait_until(lambda: len(store._pending) == 1)
        second.start()
        _wait_until(lambda: len(store._pending) == 2)
    first.join(10)
    second.join(10)
    assert outcomes == {"first": "written", "second": "gpu-0 is held by ['first']"}
    assert sorted(json.loads(store.path.read_text())["claims"]) == ["first"]


def test_queued_updates_wait_for_the_write_not_for_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight prepares' updates queue while the lock is held: when it is free one of them (the leader) takes
    it and writes all eight; the other seven return without taking the lock in turn."""
    store = CheckpointStore(tmp_path, boot_id="b")
    taken: list[int] = []
    real_take = store._take_file_lock

    def counted_take() -> int:
        taken.append(threading.get_ident())
        return real_take()

    monkeypatch.setattr(store, "_take_file_lock", counted_take)
    _queued_behind_the_lock(
        store,
        [threading.Thread(target=store.update_claim, args=(f"uid-{n}", entry(f"uid-{n}"))) for n in range(8)],
    )
    assert len(taken) == 2  # the holder, then one leader for all eight
    assert sorted(json.loads(store.path.read_text())["claims"]) == [f"uid-{n}" for n in range(8)]


def test_an_update_inside_the_callers_own_locked_section_is_written_at_once(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, boot_id="b")
    with store.locked():
        written = store.update_claim("uid-1", entry("uid-1"))
        assert sorted(written.claims) == ["uid-1"]
        assert sorted(store.read().claims) == ["uid-1"]


def test_followers_that_time_out_behind_a_stuck_leader_are_never_written(tmp_path: Path) -> None:
    """The lock is held past the queue timeout: the leader and the callers queued behind it all fail, and a
    later write carries none of their changes in."""
    store = CheckpointStore(tmp_path, boot_id="b", queue_timeout_s=0.3)
    errors: list[str] = []

    def update(uid: str) -> None:
        try:
            store.update_claim(uid, entry(uid))
        except CheckpointLockError as exc:
            errors.append(uid)
            assert "waited 0.3s" in str(exc)

    threads = [threading.Thread(target=update, args=(f"late-{n}",)) for n in range(3)]
    with store.locked():
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
    assert sorted(errors) == ["late-0", "late-1", "late-2"] and store._pending == []
    store.update_claim("next", entry("next"))
    assert sorted(json.loads(store.path.read_text())["claims"]) == ["next"]


def test_a_detached_entry_is_equal_and_its_json_parts_are_its_own() -> None:
    original = entry("a")
    copy_ = original.detached()
    assert copy_ == original
    copy_.groups[0].state["timeSlice"]["GPU-1"] = 0  # type: ignore[index]  # the sharing manager does this
    copy_.groups[0].mig_instances["gpu-0-mig-1g10gb-19-0"]["giID"] = 9  # type: ignore[index]
    copy_.devices[1].config["sharing"]["strategy"] = "MPS"  # type: ignore[index]
    assert original == entry("a")


def test_a_rewrite_leaves_one_file_and_readers_see_old_or_new(tmp_path: Path) -> None:
    """Writes without fsync swap the new file into place (RENAME_EXCHANGE) and remove the old one: the
    directory holds only the checkpoint afterwards, and a reader that opened the old file keeps reading it."""
    store = CheckpointStore(tmp_path, boot_id="boot-1")
    store.update_claim("a", entry("a"), durable=False)
    with store.path.open("rb") as old_reader:
        store.update_claim("b", entry("b"), durable=False)
        store.update_claim("a", None, durable=False)
        assert set(json.loads(old_reader.read())["claims"]) == {"a"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.json", "checkpoint.lock"]
    assert set(CheckpointStore(tmp_path, boot_id="boot-1").read().claims) == {"b"}


def test_a_cached_read_notices_a_file_replaced_by_another_process(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, boot_id="boot-1")
    store.update_claim("a", entry("a"), durable=False)
    assert set(store.read(shared=True).claims) == {"a"}  # from the copy of what it wrote
    CheckpointStore(tmp_path, boot_id="boot-1").update_claim("b", entry("b"))  # another plugin instance
    assert set(store.read(shared=True).claims) == {"a", "b"}
