"""The standard ``grpc.health.v1.Health`` service for a grpc.aio server.

Same protocol and semantics as ``grpc_health.v1.health.aio.HealthServicer`` (``Check`` answers
NOT_FOUND for an unknown service; ``Watch`` streams SERVICE_UNKNOWN for it, then every change), with
one difference that matters for graceful shutdown: once :meth:`enter_graceful_shutdown` has marked
everything NOT_SERVING, open ``Watch`` streams send that status and end. The reference
implementation keeps them open, so a single watcher (a load balancer, a test) would hold the server's
graceful stop for the whole grace period.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# A grpc.health.v1 ServingStatus enum value; protobuf enum values are plain ints.
ServingStatus = int
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
OVERALL = ""


class HealthServicer(health_pb2_grpc.HealthServicer):
    """Serving status per service name (``""`` = the whole server)."""

    def __init__(self) -> None:
        self._status: dict[str, ServingStatus] = {OVERALL: NOT_SERVING}
        self._changed = asyncio.Condition()
        self._version = 0  # bumped on every change, so watchers never miss one
        self._shutting_down = False

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def status(self, service: str = OVERALL) -> ServingStatus | None:
        """The current status of ``service``, or None when it is not registered."""
        return self._status.get(service)

    async def set(self, service: str, status: ServingStatus) -> None:
        """Set the status of ``service``; ignored once graceful shutdown has started."""
        if not self._shutting_down:
            await self._set(service, status)

    async def enter_graceful_shutdown(self) -> None:
        """Mark every service NOT_SERVING for good and end open Watch streams."""
        if self._shutting_down:
            return
        self._shutting_down = True
        async with self._changed:
            for service in self._status:
                self._status[service] = NOT_SERVING
            self._version += 1
            self._changed.notify_all()

    async def _set(self, service: str, status: ServingStatus) -> None:
        async with self._changed:
            self._status[service] = status
            self._version += 1
            self._changed.notify_all()

    async def Check(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext):
        status = self._status.get(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext) -> None:
        last_sent: ServingStatus | None = None
        while True:
            async with self._changed:
                seen = self._version
                status = self._status.get(request.service, SERVICE_UNKNOWN)
                shutting_down = self._shutting_down
            if status != last_sent:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                last_sent = status
            if shutting_down:
                return
            await self._wait_for_change_after(seen)

    async def _wait_for_change_after(self, seen: int) -> None:
        """Return once the status version has moved past ``seen``."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._version != seen)
