from __future__ import annotations

from pathlib import Path

import pytest

from e2e.lib.summary import (
    ExampleRow,
    examples_table,
    load_report,
    record_row,
    record_timing,
    render_table,
    timings_table,
)


def test_table_pads_columns_to_the_widest_cell() -> None:
    text = render_table(("a", "bb"), [("xxx", "y"), ("z", "wwww")])
    lines = text.splitlines()
    assert lines[0] == "a    bb"
    assert lines[1] == "---  ----"
    assert lines[2] == "xxx  y"
    assert lines[3] == "z    wwww"


def test_long_cells_are_cut_and_whitespace_collapsed() -> None:
    text = render_table(("h",), [("a  b\nc" + "x" * 100,)], max_width=10)
    assert text.splitlines()[2] == "a b cxxxx…"


def test_row_with_wrong_cell_count_is_refused() -> None:
    with pytest.raises(ValueError, match="has 1 cells, the table has 2 columns"):
        render_table(("a", "b"), [("only",)])


def test_examples_table_has_the_five_columns() -> None:
    text = examples_table([ExampleRow("gpu-per-pod", "2/2 Running", "gpu-0, gpu-1", "exclusive", "pass")])
    assert text.splitlines()[0].split() == ["example", "pods", "devices", "sharing", "effect", "result"]
    assert "gpu-per-pod" in text and text.rstrip().endswith("pass")


def test_report_file_rows_are_replaced_by_example_name(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    record_row(path, ExampleRow("a", "1/1", "gpu-0", "-", "fail", "boom"))
    record_row(path, ExampleRow("b", "1/1", "gpu-1", "-", "pass"))
    record_row(path, ExampleRow("a", "1/1", "gpu-0", "-", "pass"))
    record_timing(path, "pod_to_running_s", 1.23456)
    report = load_report(path)
    assert [(r.example, r.result) for r in report.rows] == [("b", "pass"), ("a", "pass")]
    assert report.timings_s == {"pod_to_running_s": 1.235}


def test_timings_table_orders_known_labels_and_marks_missing() -> None:
    text = timings_table(
        {"b": 0.25, "a": 150.0, "extra": 3.0}, {"a": "cluster build", "b": "pod start", "c": "x"}
    )
    rows = [line.split("  ")[0].strip() for line in text.splitlines()[2:]]
    assert rows == ["cluster build", "pod start", "x", "extra"]
    assert "2.5 min" in text and "250 ms" in text and "n/a" in text


def test_percent_keys_are_not_seconds() -> None:
    assert "12.5 %" in timings_table({"prepare_share_pct": 12.5}, {"prepare_share_pct": "share"})


def test_build_timings_prefer_whole_target_records() -> None:
    from e2e.lib.report import build_timings

    components = {"etcd": {"build_s": 40.0}, "kubelet": {"build_s": 70.0}, "helm": {"build_s": 400.0}}
    assert build_timings({"components": components}) == {"cluster_build_cold_s": 110.0}
    full = {
        "components": components,
        "targets": {"all": {"cold_s": 900.0, "warm_s": 0.4}},
        "cluster_start": {"control_plane_s": 5.0, "node_ready_s": 21.5},
    }
    assert build_timings(full) == {
        "cluster_build_cold_s": 900.0,
        "cluster_build_warm_s": 0.4,
        "cluster_start_s": 21.5,
    }


def test_junit_outcomes_read_pass_fail_skip(tmp_path: Path) -> None:
    from e2e.lib.report import junit_outcomes

    xml = tmp_path / "j.xml"
    xml.write_text(
        '<testsuites><testsuite name="s">'
        '<testcase classname="a" name="ok"/>'
        '<testcase classname="a" name="bad"><failure message="boom&#10;more">tb</failure></testcase>'
        '<testcase classname="a" name="skipped"><skipped message="no webhook"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert junit_outcomes(xml) == [
        ("ok", "pass", ""),
        ("bad", "FAIL", "boom"),
        ("skipped", "skip", "no webhook"),
    ]
