"""Prometheus metrics of a service's HTTP endpoint (:mod:`grpo_runtime.http_companion`), exported on the
gRPC server's ``/metrics`` beside the RPC metrics.

- ``grpo_http_requests_total{path,method,code}``: finished requests by route, HTTP method and status code
  (``200``, ``400``, ``413``, ``429``, ...; ``cancelled`` when the client went away first), the HTTP
  counterpart of ``grpo_rpc_requests_total``;
- ``grpo_http_request_duration_seconds{path,method}``: wall time from the request's arrival to its response,
  in the RPC metrics' buckets (:data:`grpo_runtime.metrics.DURATION_BUCKETS_S`);
- ``grpo_http_in_flight{path,method}``: requests being handled now.

``path`` is the route's pattern (``/get_reward``, ``/health``), or ``unmatched`` for a request no route takes
(an unknown path: 404; a known path with another method: 405), so a caller cannot grow the label set;
``method`` is one of the HTTP methods or ``other``.
The metrics live outside any registry; :class:`HttpMetrics` is a collector the server registers (the
binding's ``collectors``), so several servers in one process keep their counts apart.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import web
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from grpo_runtime.metrics import DURATION_BUCKETS_S

UNMATCHED = "unmatched"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HttpMetrics(Collector):
    """The endpoint's request counts, latencies and in-flight gauge; :attr:`middleware` records them."""

    def __init__(self) -> None:
        self.requests = Counter(
            "grpo_http_requests_total",
            "Finished HTTP requests by route, method and status code.",
            ["path", "method", "code"],
            registry=None,
        )
        self.duration = Histogram(
            "grpo_http_request_duration_seconds",
            "HTTP request handling time in seconds.",
            ["path", "method"],
            buckets=DURATION_BUCKETS_S,
            registry=None,
        )
        self.in_flight = Gauge(
            "grpo_http_in_flight", "HTTP requests being handled now.", ["path", "method"], registry=None
        )

    def collect(self) -> Iterator[Metric]:
        for metric in (self.requests, self.duration, self.in_flight):
            yield from metric.collect()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Counts every request, those the router answers itself (404, 405) and failed handlers (500)."""
        resource = request.match_info.route.resource
        path = resource.canonical if resource is not None else UNMATCHED
        method = request.method if request.method in METHODS else "other"
        started = time.perf_counter()
        code = "500"  # a handler that raises something other than an HTTP status: aiohttp answers 500
        gauge = self.in_flight.labels(path, method)
        gauge.inc()
        try:
            response = await handler(request)
            code = str(response.status)
            return response
        except web.HTTPException as exc:
            code = str(exc.status)
            raise
        except asyncio.CancelledError:  # the client closed the connection before the answer
            code = "cancelled"
            raise
        finally:
            gauge.dec()
            self.requests.labels(path, method, code).inc()
            self.duration.labels(path, method).observe(time.perf_counter() - started)
