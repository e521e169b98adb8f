"""TrainerService servicer: each RPC converts its request, calls the RunManager once, converts the result
(with the service's codec, :mod:`trainer_service.codec`, shared with the client)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from grpo.trainer.v1 import trainer_pb2, trainer_pb2_grpc

from trainer_service import codec
from trainer_service.core.runs import RunManager


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    def __init__(self, runs: RunManager):
        self._runs = runs

    async def StartRun(self, request: trainer_pb2.StartRunRequest, context: grpc.aio.ServicerContext):
        run_id = await self._runs.start(request.config_yaml, run_id=request.run_id, resume=request.resume)
        return trainer_pb2.StartRunResponse(run_id=run_id)

    async def WatchRun(
        self, request: trainer_pb2.WatchRunRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[trainer_pb2.RunEvent]:
        async for event in self._runs.watch(request.run_id):
            yield codec.encode_run_event(request.run_id, event)

    async def GetRun(self, request: trainer_pb2.GetRunRequest, context: grpc.aio.ServicerContext):
        return trainer_pb2.GetRunResponse(run=codec.encode_run_info(self._runs.get(request.run_id)))

    async def StopRun(self, request: trainer_pb2.StopRunRequest, context: grpc.aio.ServicerContext):
        return trainer_pb2.StopRunResponse(run=codec.encode_run_info(self._runs.stop(request.run_id)))

    async def ListRuns(self, request: trainer_pb2.ListRunsRequest, context: grpc.aio.ServicerContext):
        return trainer_pb2.ListRunsResponse(runs=[codec.encode_run_info(info) for info in self._runs.list()])
