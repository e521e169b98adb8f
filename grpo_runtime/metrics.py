"""Per-RPC Prometheus metrics and the HTTP endpoint that serves them.

Metrics (labels in braces):

- ``grpo_rpc_requests_total{service,method,code}``: finished RPCs by final status code name
  (``OK``, ``INVALID_ARGUMENT``, ...), so errors are counted by code;
- ``grpo_rpc_duration_seconds{service,method}``: wall time from the handler's start to its end;
- ``grpo_rpc_in_flight{service,method}``: RPCs being handled now.

Each server owns its :class:`prometheus_client.CollectorRegistry`, so several servers in one process
(tests) do not clash; services can register their own metrics in :attr:`RpcMetrics.registry`.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# Latency buckets (s): sub-millisecond health checks up to multi-minute weight loads.
DURATION_BUCKETS_S = (
    *(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1),
    *(0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)


class RpcMetrics:
    """The runtime's RPC metrics in a private registry, plus an optional HTTP exporter."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.requests = Counter(
            "grpo_rpc_requests_total",
            "Finished RPCs by service, method and final status code.",
            ["service", "method", "code"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "grpo_rpc_duration_seconds",
            "RPC handling time in seconds.",
            ["service", "method"],
            buckets=DURATION_BUCKETS_S,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "grpo_rpc_in_flight", "RPCs being handled now.", ["service", "method"], registry=self.registry
        )
        self._httpd: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def observe(self, service: str, method: str, code: str, duration_s: float) -> None:
        """Record one finished RPC."""
        self.requests.labels(service, method, code).inc()
        self.duration.labels(service, method).observe(duration_s)

    def serve_http(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread; returns the bound port (for port 0)."""
        self._httpd, self._thread = start_http_server(port, addr=host.strip("[]"), registry=self.registry)
        return int(self._httpd.server_port)

    def stop_http(self) -> None:
        """Stop the HTTP exporter if it runs; waits for its thread."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._httpd = self._thread = None
