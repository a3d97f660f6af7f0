"""The services' Prometheus metrics: prometheus_client, one registry per app.

Shared by the receiver and the REST catalog. Each app owns a :class:`Metrics` with its own
``CollectorRegistry``, not the process-global default one: tests (and an embedded stack) create
many apps in one process, and the global registry refuses a metric name registered twice.
prometheus_client writes the exposition format (escaping, histogram series, ``_created``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST
Kind = Literal["counter", "gauge", "histogram"]


class Metrics:
    """Metrics declared once with their labels (:meth:`describe`), then updated by name."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._metrics: dict[str, Counter | Gauge | Histogram] = {}

    def describe(self, name: str, kind: Kind, text: str, labels: Sequence[str] = ()) -> None:
        names = list(labels)
        if kind == "counter":
            self._metrics[name] = Counter(name, text, names, registry=self.registry)
        elif kind == "gauge":
            self._metrics[name] = Gauge(name, text, names, registry=self.registry)
        else:
            self._metrics[name] = Histogram(name, text, names, registry=self.registry, buckets=LATENCY_BUCKETS)

    def _child(self, name: str, labels: dict[str, str]) -> Counter | Gauge | Histogram:
        metric = self._metrics[name]
        return metric.labels(**labels) if labels else metric

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        child = self._child(name, labels)
        if not isinstance(child, Counter | Gauge):
            raise TypeError(f"{name} is not a counter or gauge")
        child.inc(amount)

    def set(self, name: str, value: float, **labels: str) -> None:
        child = self._child(name, labels)
        if not isinstance(child, Gauge):
            raise TypeError(f"{name} is not a gauge")
        child.set(value)

    def observe(self, name: str, value: float, **labels: str) -> None:
        child = self._child(name, labels)
        if not isinstance(child, Histogram):
            raise TypeError(f"{name} is not a histogram")
        child.observe(value)

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def render(self) -> str:
        return generate_latest(self.registry).decode()
