"""Prometheus metrics of one app: the scheduler's state, read at scrape time, and request latencies.

Everything lives in the app's own ``CollectorRegistry`` (no process-global metrics), so two apps in one
process (tests) never share or double-register a metric.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

#: request latency buckets (seconds): a short clip takes well under a second, a long file minutes
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300, 600)

#: scheduler.stats() key -> (metric name, help, kind)
_STATS = {
    "queue_depth": ("whisperkv_queue_depth", "jobs waiting for their first window to be scheduled", "gauge"),
    "active_jobs": ("whisperkv_active_jobs", "jobs queued or running", "gauge"),
    "active_rows": (
        "whisperkv_active_rows",
        "decoder rows (windows, beams, samples) in the batch now",
        "gauge",
    ),
    "last_batch_rows": ("whisperkv_batch_rows", "rows in the most recent decoder step (batch size)", "gauge"),
    "self_kv_bytes": ("whisperkv_self_kv_bytes", "bytes of Self-KV held by active rows", "gauge"),
    "cross_kv_bytes": ("whisperkv_cross_kv_bytes", "bytes of Cross-KV held by active windows", "gauge"),
    "steps_total": ("whisperkv_decoder_steps", "decoder steps run", "counter"),
    "tokens_total": ("whisperkv_decoded_tokens", "tokens decoded over all rows", "counter"),
    "windows_encoded": ("whisperkv_windows_encoded", "30 s windows the encoder ran for", "counter"),
    "encoder_seconds": (
        "whisperkv_encoder_seconds",
        "wall seconds the scheduler spent encoding windows (Cross-KV projection included)",
        "counter",
    ),
    "heap_trims": (
        "whisperkv_heap_trims",
        "idle spells after which the heap's free memory went back to the kernel",
        "counter",
    ),
}


class SchedulerCollector(Collector):
    """Reads ``scheduler.stats()`` on each scrape; tokens/s and mean rows per step since the last scrape."""

    def __init__(self, stats: Callable[[], dict]) -> None:
        self._stats = stats
        self._last: tuple[float, int, int] | None = None  # (time, steps_total, tokens_total)

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        for key, (name, doc, kind) in _STATS.items():
            if key not in stats:
                continue
            family = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
            yield family(name, doc, value=float(stats[key]))
        now, steps, tokens = (
            time.monotonic(),
            int(stats.get("steps_total", 0)),
            int(stats.get("tokens_total", 0)),
        )
        rate, rows = 0.0, 0.0
        if self._last is not None:
            elapsed = now - self._last[0]
            d_steps, d_tokens = steps - self._last[1], tokens - self._last[2]
            rate = d_tokens / elapsed if elapsed > 0 else 0.0
            rows = d_tokens / d_steps if d_steps > 0 else 0.0
        self._last = (now, steps, tokens)
        yield GaugeMetricFamily(
            "whisperkv_tokens_per_second", "tokens decoded per second since the previous scrape", value=rate
        )
        yield GaugeMetricFamily(
            "whisperkv_mean_batch_rows",
            "tokens per decoder step since the previous scrape (mean batch size)",
            value=rows,
        )


class ServeMetrics:
    """The app's registry: scheduler gauges plus per-endpoint request counts and latencies."""

    def __init__(self, stats: Callable[[], dict]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(SchedulerCollector(stats))
        self.requests = Counter(
            "whisperkv_requests", "HTTP requests answered", ["endpoint", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "whisperkv_request_duration_seconds",
            "time from request to response, per endpoint",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

        self.stream_reuse = Counter(
            "whisperkv_stream_reuse",
            "Realtime updates' reuse decisions by provenance: kind (encoder_output, cross_kv, "
            "prompt_self_kv) and outcome (accepted, refused)",
            ["kind", "outcome"],
            registry=self.registry,
        )
        self.stream_work = Counter(
            "whisperkv_stream_updates",
            "Realtime updates decoded and windows they encoded (what = updates, encodes)",
            ["what"],
            registry=self.registry,
        )

    def count_stream_reuse(self, before: dict | None, now: dict) -> None:
        """Add what one session's reuse summary (``StreamState.summary``) gained since ``before``."""
        old, new = _reuse_totals(before), _reuse_totals(now)
        for (kind, outcome), total in new.items():
            gained = total - old.get((kind, outcome), 0)
            if outcome == "work":
                self.stream_work.labels(what=kind).inc(gained)
            else:
                self.stream_reuse.labels(kind=kind, outcome=outcome).inc(gained)

    def observe(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()
        self.latency.labels(endpoint=endpoint).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _reuse_totals(summary: dict | None) -> dict[tuple[str, str], int]:
    """(kind, accepted | refused) → count, and (updates | encodes, work) → count, of a reuse summary."""
    if summary is None:
        return {}
    totals = {(kind, "accepted"): n for kind, n in summary["accepted"].items()}
    totals.update({(kind, "refused"): sum(by.values()) for kind, by in summary["refused"].items()})
    totals.update({(what, "work"): summary[what] for what in ("updates", "encodes")})
    return totals
