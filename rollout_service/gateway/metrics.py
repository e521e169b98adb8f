"""Prometheus view of what the rollout service holds for sessions, read at scrape time:

- ``grpo_rollout_gateway_sessions``: gateway sessions open (an expired one until the registry is next used);
- ``grpo_rollout_gateway_recorded_tokens``: token ids their recorded calls hold, bounded by
  ``gateway.max_recorded_tokens``;
- ``grpo_rollout_session_cache_bytes``: bytes of KV cache the HF engine keeps for episodes' and sessions'
  next calls, bounded by ``session_cache_bytes``;
- ``grpo_rollout_session_cache_evictions_total``: caches it dropped to stay within that bound.

Scrapes run on the metrics server's thread, so they read counters and never change what they look at.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rollout_service.engines.base import Engine
from rollout_service.gateway.sessions import SessionRegistry


class SessionMetrics(Collector):
    """``sessions``: the gateway's registry (None: no gateway); ``engine``: the service's engine."""

    def __init__(self, engine: Engine, sessions: SessionRegistry | None) -> None:
        self._engine = engine
        self._sessions = sessions

    def collect(self) -> Iterator[Metric]:
        if self._sessions is not None:
            yield GaugeMetricFamily(
                "grpo_rollout_gateway_sessions", "Gateway sessions open.", value=self._sessions.open_count
            )
            yield GaugeMetricFamily(
                "grpo_rollout_gateway_recorded_tokens",
                "Token ids the open sessions' recorded calls hold (gateway.max_recorded_tokens).",
                value=self._sessions.held_tokens,
            )
        caches = self._engine.session_caches
        if caches is not None:
            yield GaugeMetricFamily(
                "grpo_rollout_session_cache_bytes",
                "Bytes of KV cache kept for episodes' and sessions' next calls (session_cache_bytes).",
                value=caches.nbytes,
            )
            yield CounterMetricFamily(
                "grpo_rollout_session_cache_evictions",
                "KV caches dropped to stay within session_cache_bytes.",
                value=caches.evicted,
            )
