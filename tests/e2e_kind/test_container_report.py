from __future__ import annotations

from e2e.lib.container_report import parse_report

LOG = """\
--- env
HOME=/root
NVIDIA_VISIBLE_DEVICES=void
CUDA_MPS_PIPE_DIRECTORY=/tmp/mps=pipe
--- devices
/dev/nvidia0
/dev/nvidiactl /dev/nvidia-uvm
--- end
"""


def test_env_and_devices_are_read() -> None:
    report = parse_report(LOG)
    assert report.complete
    assert report.env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/mps=pipe"
    assert report.devices == ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm")


def test_the_last_complete_report_wins() -> None:
    second = LOG.replace("/dev/nvidia0", "/dev/nvidia3")
    assert parse_report(LOG + second).devices[0] == "/dev/nvidia3"
    partial = LOG + "--- env\nA=1\n"
    assert parse_report(partial).devices[0] == "/dev/nvidia0"


def test_an_unfinished_report_is_marked_incomplete() -> None:
    report = parse_report("--- env\nA=1\n--- devices\n")
    assert not report.complete and report.env == {"A": "1"}
