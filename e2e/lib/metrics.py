"""Reading the plugin's Prometheus metrics: how long NodePrepareResources took (pure parsing)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class HistogramTotal:
    sum_s: float
    count: float

    def minus(self, earlier: HistogramTotal) -> HistogramTotal:
        return HistogramTotal(self.sum_s - earlier.sum_s, self.count - earlier.count)


def histogram_total(text: str, metric: str, labels: Mapping[str, str] | None = None) -> HistogramTotal:
    """Sum and count of histogram `metric` over the series whose labels include `labels`.

    `metric` is the family name without `_sum`/`_count`. A metric that is absent counts as zero, so a
    before/after difference works from the first scrape.
    """
    want = dict(labels or {})
    total_sum = 0.0
    total_count = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != metric:
            continue
        for sample in family.samples:
            if any(sample.labels.get(k) != v for k, v in want.items()):
                continue
            if sample.name == f"{metric}_sum":
                total_sum += sample.value
            elif sample.name == f"{metric}_count":
                total_count += sample.value
    return HistogramTotal(total_sum, total_count)


def histogram_names(text: str) -> list[str]:
    """Every histogram family in the exposition (used to find the prepare histogram by name)."""
    return sorted(f.name for f in text_string_to_metric_families(text) if f.type == "histogram")


def label_values(text: str, metric: str, label: str) -> set[str]:
    values: set[str] = set()
    for family in text_string_to_metric_families(text):
        if family.name == metric:
            for sample in family.samples:
                if label in sample.labels:
                    values.add(sample.labels[label])
    return values
