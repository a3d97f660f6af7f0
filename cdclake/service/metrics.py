"""Prometheus text exposition (format 0.0.4) for the services' counters, gauges and histograms.

Shared by the receiver and the REST catalog. Kept to what they need; one process, so plain dicts
under the GIL suffice.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

LabelValues = tuple[tuple[str, str], ...]

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _labels(lv: LabelValues, extra: str = "") -> str:
    parts = [f'{k}="{_escape(v)}"' for k, v in lv]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _num(v: float) -> str:
    """Full precision (unix timestamps need 10+ digits); integers without a fraction."""
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Metrics:
    def __init__(self) -> None:
        self._help: dict[str, tuple[str, str]] = {}
        self._values: dict[str, dict[LabelValues, float]] = defaultdict(dict)
        self._hist: dict[str, dict[LabelValues, list[float]]] = defaultdict(dict)

    def describe(self, name: str, kind: str, text: str) -> None:
        self._help[name] = (kind, text)

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        lv = tuple(sorted(labels.items()))
        series = self._values[name]
        series[lv] = series.get(lv, 0.0) + amount

    def set(self, name: str, value: float, **labels: str) -> None:
        self._values[name][tuple(sorted(labels.items()))] = value

    def observe(self, name: str, value: float, **labels: str) -> None:
        lv = tuple(sorted(labels.items()))
        # counts per bucket (non-cumulative), then +Inf count, then sum
        h = self._hist[name].setdefault(lv, [0.0] * (len(LATENCY_BUCKETS) + 2))
        h[bisect.bisect_left(LATENCY_BUCKETS, value)] += 1
        h[-1] += value

    def value(self, name: str, **labels: str) -> float:
        return self._values[name].get(tuple(sorted(labels.items())), 0.0)

    def render(self) -> str:
        out: list[str] = []
        for name, (kind, text) in sorted(self._help.items()):
            out.append(f"# HELP {name} {text}")
            out.append(f"# TYPE {name} {kind}")
            if kind == "histogram":
                for lv, h in sorted(self._hist[name].items()):
                    acc = 0.0
                    for bound, n in zip(LATENCY_BUCKETS, h, strict=False):
                        acc += n
                        le = f'le="{bound:g}"'
                        out.append(f"{name}_bucket{_labels(lv, le)} {_num(acc)}")
                    acc += h[len(LATENCY_BUCKETS)]
                    inf = 'le="+Inf"'
                    out.append(f"{name}_bucket{_labels(lv, inf)} {_num(acc)}")
                    out.append(f"{name}_count{_labels(lv)} {_num(acc)}")
                    out.append(f"{name}_sum{_labels(lv)} {_num(h[-1])}")
            else:
                for lv, v in sorted(self._values[name].items()):
                    out.append(f"{name}{_labels(lv)} {_num(v)}")
        return "\n".join(out) + "\n"
