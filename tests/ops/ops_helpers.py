"""Helpers of the operations tests: scrape a collector and read its samples back with
prometheus_client's own text parser."""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from xirang_platform.ops.exporter import XirangCollector, scrape

Labels = tuple[tuple[str, str], ...]


def parse(text: str) -> dict[str, dict[Labels, float]]:
    """Sample name -> (sorted label pairs -> value), from exposition text."""
    out: dict[str, dict[Labels, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name][tuple(sorted(s.labels.items()))] = s.value
    return dict(out)


def scraped(collector: XirangCollector) -> dict[str, dict[Labels, float]]:
    """One scrape of `collector`, parsed."""
    return parse(scrape(collector))


def labels(**pairs: str) -> Labels:
    """Sorted label pairs, as `parse` keys them."""
    return tuple(sorted(pairs.items()))
