from __future__ import annotations

from e2e.lib.metrics import HistogramTotal, histogram_names, histogram_total, label_values

TEXT = """\
# HELP dra_gpu_request_duration_seconds How long requests take
# TYPE dra_gpu_request_duration_seconds histogram
dra_gpu_request_duration_seconds_bucket{method="NodePrepareResources",le="0.1"} 1
dra_gpu_request_duration_seconds_bucket{method="NodePrepareResources",le="+Inf"} 2
dra_gpu_request_duration_seconds_sum{method="NodePrepareResources"} 0.75
dra_gpu_request_duration_seconds_count{method="NodePrepareResources"} 2
dra_gpu_request_duration_seconds_bucket{method="NodeUnprepareResources",le="+Inf"} 1
dra_gpu_request_duration_seconds_sum{method="NodeUnprepareResources"} 0.5
dra_gpu_request_duration_seconds_count{method="NodeUnprepareResources"} 1
# TYPE dra_gpu_prepared_devices gauge
dra_gpu_prepared_devices 3
"""


def test_histogram_sum_and_count_filtered_by_label() -> None:
    total = histogram_total(TEXT, "dra_gpu_request_duration_seconds", {"method": "NodePrepareResources"})
    assert total == HistogramTotal(0.75, 2)
    everything = histogram_total(TEXT, "dra_gpu_request_duration_seconds")
    assert everything == HistogramTotal(1.25, 3)


def test_absent_metric_counts_as_zero_and_differences_work() -> None:
    before = histogram_total("", "dra_gpu_request_duration_seconds")
    after = histogram_total(TEXT, "dra_gpu_request_duration_seconds", {"method": "NodePrepareResources"})
    assert after.minus(before) == HistogramTotal(0.75, 2)


def test_names_and_label_values() -> None:
    assert histogram_names(TEXT) == ["dra_gpu_request_duration_seconds"]
    assert label_values(TEXT, "dra_gpu_request_duration_seconds", "method") == {
        "NodePrepareResources",
        "NodeUnprepareResources",
    }
