"""A tiny service used to test the runtime (not the real rollout or trainer logic).

It implements a few RPCs of the real generated ``RolloutService`` and ``TrainerService`` with
test-local behaviour chosen by the request, so the tests can drive every path of the runtime:

- ``Generate``: the first prompt's text selects what happens — ``sleep:<s>`` waits s seconds then
  answers, ``invalid`` raises InvalidArgument on ``prompts[0].text``, ``crash`` raises RuntimeError,
  ``big:<n>`` answers with an n-byte completion text, ``flaky:<key>`` raises Unavailable on the first
  two calls with that key (the retry test), anything else is echoed back; each answer logs
  ``generated <text>``;
- ``GetStatus`` logs a line from "domain code" and answers ``engine="test"``;
- ``Sleep`` (admin) answers with the requested level;
- ``UpdateWeights`` (admin, client streaming) counts the bytes received;
- ``WatchRun`` (server streaming) yields 3 events, or fails with NotFound after one for run id ``missing``.

Run as a script it serves both through :func:`grpo_runtime.cli.run_service` (the SIGTERM test).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

from grpo.rollout.v1 import rollout_pb2, rollout_pb2_grpc
from grpo.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from pydantic import BaseModel, ConfigDict

from grpo_runtime.cli import run_service
from grpo_runtime.errors import InvalidArgument, NotFound, Unavailable
from grpo_runtime.server import ServiceBinding

log = logging.getLogger("runtime_test_service")


class EchoRollout(rollout_pb2_grpc.RolloutServiceServicer):
    def __init__(self) -> None:
        self.calls_by_text: dict[str, int] = {}

    async def Generate(
        self, request: rollout_pb2.GenerateRequest, context: Any
    ) -> rollout_pb2.GenerateResponse:
        text = request.prompts[0].text if request.prompts else ""
        self.calls_by_text[text] = self.calls_by_text.get(text, 0) + 1
        if text.startswith("sleep:"):
            await asyncio.sleep(float(text.removeprefix("sleep:")))
        elif text == "invalid":
            raise InvalidArgument("must not be 'invalid'", field="prompts[0].text")
        elif text == "crash":
            raise RuntimeError("engine exploded")
        elif text.startswith("flaky:") and self.calls_by_text[text] <= 2:
            raise Unavailable("warming up")
        elif text.startswith("big:"):
            text = "x" * int(text.removeprefix("big:"))
        log.info("generated %s", text[:32])
        return rollout_pb2.GenerateResponse(completions=[rollout_pb2.Completion(prompt_id="p0", text=text)])

    async def GetStatus(
        self, request: rollout_pb2.GetStatusRequest, context: Any
    ) -> rollout_pb2.GetStatusResponse:
        log.info("status requested")
        return rollout_pb2.GetStatusResponse(engine="test")

    async def Sleep(self, request: rollout_pb2.SleepRequest, context: Any) -> rollout_pb2.SleepResponse:
        return rollout_pb2.SleepResponse(level=request.level)

    async def UpdateWeights(self, request_iterator: Any, context: Any) -> rollout_pb2.UpdateWeightsResponse:
        received = 0
        async for chunk in request_iterator:
            received += len(chunk.data)
        return rollout_pb2.UpdateWeightsResponse(bytes_received=received)


class CountingTrainer(trainer_pb2_grpc.TrainerServiceServicer):
    async def WatchRun(self, request: trainer_pb2.WatchRunRequest, context: Any):
        for step in range(3):
            yield trainer_pb2.RunEvent(run_id=request.run_id, step=step, total_steps=3)
            if request.run_id == "missing":
                raise NotFound("no such run", field="run_id")


def bindings() -> list[ServiceBinding]:
    return [
        ServiceBinding(
            servicer=EchoRollout(),
            add_to_server=rollout_pb2_grpc.add_RolloutServiceServicer_to_server,
            descriptor=rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"],
        ),
        ServiceBinding(
            servicer=CountingTrainer(),
            add_to_server=trainer_pb2_grpc.add_TrainerServiceServicer_to_server,
            descriptor=trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"],
        ),
    ]


class ScriptSettings(BaseModel):
    """The script's own settings (the config file minus ``server:``), to exercise their validation."""

    model_config = ConfigDict(extra="forbid")
    greeting: str = "hello"


async def build(args: argparse.Namespace, settings: dict[str, Any]):
    ScriptSettings.model_validate(settings)
    return bindings(), None


def main(argv: list[str] | None = None) -> int:
    return run_service(
        prog="runtime_test_service",
        description="Test service for the grpo_runtime tests.",
        default_port=50099,
        build=build,
        argv=argv,
    )


if __name__ == "__main__":
    sys.exit(main())
