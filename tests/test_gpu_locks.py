"""GPU locks: different GPUs at once, one GPU one at a time (or shared by work that changes nothing GPU-wide),
the node-wide section above both, re-entrancy, and the same exclusion against a second plugin process through
the lock files."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dra_gpu.gpu_locks import GpuLocks, GpuLockTimeoutError


def _in_thread(action: object) -> threading.Thread:
    thread = threading.Thread(target=action)  # type: ignore[arg-type]
    thread.start()
    return thread


def test_sections_of_different_gpus_run_at_the_same_time(tmp_path: Path) -> None:
    locks = GpuLocks(tmp_path)
    inside = threading.Barrier(3, timeout=5)  # breaks unless all three are inside together

    def hold(gpu: str) -> None:
        with locks.gpus([gpu]):
            inside.wait()

    threads = [_in_thread(lambda g=g: hold(g)) for g in ("GPU-a", "GPU-b")]
    inside.wait()
    for thread in threads:
        thread.join()
    assert not inside.broken


def test_a_gpu_held_by_one_claim_makes_another_wait_and_time_out(tmp_path: Path) -> None:
    locks = GpuLocks(tmp_path, timeout_s=0.2)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with locks.gpus(["GPU-a", "GPU-b"]):
            held.set()
            release.wait(5)

    thread = _in_thread(hold)
    assert held.wait(5)
    with pytest.raises(GpuLockTimeoutError, match=r"GPU GPU-b: waited 0\.2s"), locks.gpus(["GPU-c", "GPU-b"]):
        pass
    with locks.gpus(["GPU-c"]):  # a GPU nobody holds is free
        pass
    release.set()
    thread.join()
    with locks.gpus(["GPU-b"]):
        pass


def test_shared_sections_of_one_gpu_run_together_and_exclude_an_exclusive_one(tmp_path: Path) -> None:
    """Fractional shares of one GPU are prepared side by side; a claim that changes the GPU waits for them,
    and once it waits, new shares wait behind it (it is not starved)."""
    locks = GpuLocks(tmp_path, timeout_s=0.3)
    inside = threading.Barrier(3, timeout=5)  # breaks unless both shared holders are inside together
    release = threading.Event()

    def share() -> None:
        with locks.gpus([], shared=["GPU-a"]):
            inside.wait()
            release.wait(5)

    threads = [_in_thread(share) for _ in range(2)]
    inside.wait()
    assert not inside.broken
    with pytest.raises(GpuLockTimeoutError, match=r"GPU GPU-a: waited 0\.3s"), locks.gpus(["GPU-a"]):
        pass
    with pytest.raises(GpuLockTimeoutError), locks.gpus(["GPU-a"], shared=["GPU-a"]):  # both ways: exclusive
        pass
    release.set()
    for thread in threads:
        thread.join()

    locks = GpuLocks(tmp_path, timeout_s=10)
    exclusive_in, exclusive_out = threading.Event(), threading.Event()
    order: list[str] = []

    def change_gpu() -> None:
        with locks.gpus(["GPU-a"]):
            exclusive_in.set()
            order.append("exclusive")
            exclusive_out.wait(5)

    holder = threading.Event()

    def early_share() -> None:
        with locks.gpus([], shared=["GPU-a"]):
            holder.set()
            exclusive_out.wait(0.2)  # still inside when the exclusive one starts to wait
            order.append("early share")

    first = _in_thread(early_share)
    assert holder.wait(5)
    writer = _in_thread(change_gpu)
    while not locks._gpu_locks["GPU-a"]._exclusive_waiting:  # the exclusive one waits
        threading.Event().wait(0.005)

    def late_share() -> None:
        with locks.gpus([], shared=["GPU-a"]):
            order.append("late share")

    late = _in_thread(late_share)
    first.join()
    assert exclusive_in.wait(5)
    exclusive_out.set()
    writer.join()
    late.join()
    assert order == ["early share", "exclusive", "late share"]


def test_node_section_waits_for_gpu_sections_and_holds_new_ones_back(tmp_path: Path) -> None:
    locks = GpuLocks(tmp_path, timeout_s=0.3)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with locks.gpus(["GPU-a"]):
            held.set()
            release.wait(5)

    thread = _in_thread(hold)
    assert held.wait(5)
    with pytest.raises(GpuLockTimeoutError, match="claims being prepared"), locks.node():
        pass
    release.set()
    thread.join()
    with locks.node():
        outsider: list[BaseException] = []

        def try_gpu() -> None:
            try:
                with locks.gpus(["GPU-z"]):
                    pass
            except GpuLockTimeoutError as exc:
                outsider.append(exc)

        other = _in_thread(try_gpu)
        other.join()
        assert outsider and "node-wide work" in str(outsider[0])
        with locks.gpus(["GPU-a"]), locks.node():  # its own thread: re-entrant both ways down
            pass


def test_sections_are_reentrant_and_the_node_cannot_be_asked_for_from_inside_a_gpu(tmp_path: Path) -> None:
    locks = GpuLocks(tmp_path)
    with (
        locks.gpus(["GPU-a"]),
        locks.gpus(["GPU-a", "GPU-b"]),
        pytest.raises(RuntimeError, match="wait for itself"),
        locks.node(),
    ):
        pass
    with locks.node():  # all released: free again
        pass


_OTHER_PLUGIN = """
import sys, time
from dra_gpu.gpu_locks import GpuLocks
locks = GpuLocks(sys.argv[1])
with locks.gpus([sys.argv[2]]):
    print("held", flush=True)
    time.sleep(5)
"""


def test_another_plugin_process_holding_a_gpu_excludes_it_here(tmp_path: Path) -> None:
    other = subprocess.Popen(
        [sys.executable, "-c", _OTHER_PLUGIN, str(tmp_path), "GPU-a"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "held"
        locks = GpuLocks(tmp_path, file_timeout_s=0.2)
        with (
            pytest.raises(GpuLockTimeoutError, match=r"gpu-GPU-a\.lock: held by another plugin instance"),
            locks.gpus(["GPU-a"]),
        ):
            pass
        with (
            pytest.raises(GpuLockTimeoutError, match=r"gpu-GPU-a\.lock: held by another plugin instance"),
            locks.gpus([], shared=["GPU-a"]),  # a share too: the other process has the GPU
        ):
            pass
        with locks.gpus(["GPU-b"]):  # its other GPUs are free
            pass
        with (
            pytest.raises(GpuLockTimeoutError, match=r"node\.lock: held by another plugin instance"),
            locks.node(),
        ):
            pass
    finally:
        other.kill()
        other.wait()
    with locks.gpus(["GPU-a"]), GpuLocks(tmp_path).gpus(["GPU-b"]):
        pass


_OTHER_PLUGIN_NODE = """
import sys
from dra_gpu.gpu_locks import GpuLocks, GpuLockTimeoutError
try:
    with GpuLocks(sys.argv[1], file_timeout_s=0.2).node():
        print("got")
except GpuLockTimeoutError:
    print("held")
"""


def _other_process_node_section(directory: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _OTHER_PLUGIN_NODE, str(directory)], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_the_node_file_stays_locked_until_the_last_gpu_section_of_this_process_ends(tmp_path: Path) -> None:
    """The GPU sections of this process share one descriptor of node.lock: the first one to end must not
    unlock it for the others."""
    locks = GpuLocks(tmp_path)
    first_in, second_in, first_out, second_out = (threading.Event() for _ in range(4))

    def section(gpu: str, entered: threading.Event, leave: threading.Event) -> None:
        with locks.gpus([gpu]):
            entered.set()
            leave.wait(10)

    threads = [
        _in_thread(lambda: section("GPU-a", first_in, first_out)),
        _in_thread(lambda: section("GPU-b", second_in, second_out)),
    ]
    assert first_in.wait(5) and second_in.wait(5)
    assert _other_process_node_section(tmp_path) == "held"
    first_out.set()
    threads[0].join(5)
    assert _other_process_node_section(tmp_path) == "held"  # GPU-b's section is still in
    second_out.set()
    threads[1].join(5)
    assert _other_process_node_section(tmp_path) == "got"
    with locks.node():  # and this process's own node section after it
        pass


def test_calls_for_one_claim_take_turns_and_leave_nothing_behind(tmp_path: Path) -> None:
    """Shares of a GPU hold it side by side, so two calls for one claim are kept apart by the claim's own lock
    (re-entrant); other claims go on meanwhile; a finished claim leaves no lock behind."""
    locks = GpuLocks(tmp_path, timeout_s=0.2)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with locks.claim("uid-1"), locks.claim("uid-1"):
            held.set()
            release.wait(5)

    thread = _in_thread(hold)
    assert held.wait(5)
    with pytest.raises(GpuLockTimeoutError, match=r"claim uid-1: waited 0\.2s"), locks.claim("uid-1"):
        pass
    with locks.claim("uid-2"):
        pass
    release.set()
    thread.join()
    with locks.claim("uid-1"):
        pass
    assert locks._claim_locks == {}
