"""``RewardAdminService``: protobuf <-> domain conversion around the ``ModelRegistry``.

The admin token is enforced by the runtime (the RPCs carry the ``(grpo.common.v1.admin)`` option);
domain errors (InvalidArgument naming ``path``/``kind``/``device``..., NotFound) are mapped to status
codes by the runtime's interceptor.
"""

from __future__ import annotations

from google.protobuf import timestamp_pb2
from grpo.reward.v1 import reward_pb2, reward_pb2_grpc

from grpo_runtime.errors import InvalidArgument
from reward_service.models.registry import ModelRegistry
from reward_service.models.spec import ModelInfo, ModelKind, ModelSpec, PrmFormat

_KINDS = {
    reward_pb2.MODEL_KIND_PRM: ModelKind.PRM,
    reward_pb2.MODEL_KIND_ORM: ModelKind.ORM,
    reward_pb2.MODEL_KIND_JUDGE: ModelKind.JUDGE,
}
_KIND_PROTOS = {kind: proto for proto, kind in _KINDS.items()}
_FORMATS = {
    reward_pb2.PRM_FORMAT_UNSPECIFIED: PrmFormat.AUTO,
    reward_pb2.PRM_FORMAT_TOKEN_CLASSIFICATION: PrmFormat.TOKEN_CLASSIFICATION,
    reward_pb2.PRM_FORMAT_STEP_TAG: PrmFormat.STEP_TAG,
}
_FORMAT_PROTOS = {fmt: proto for proto, fmt in _FORMATS.items()}


def model_spec(request: reward_pb2.LoadModelRequest) -> ModelSpec:
    """LoadModelRequest → ModelSpec; empty strings mean "server default"."""
    if request.kind not in _KINDS:
        raise InvalidArgument("must be MODEL_KIND_PRM, MODEL_KIND_ORM or MODEL_KIND_JUDGE", field="kind")
    if request.prm_format not in _FORMATS:
        raise InvalidArgument(f"unknown value {request.prm_format}", field="prm_format")
    return ModelSpec(
        name=request.name,
        path=request.path,
        kind=_KINDS[request.kind],
        prm_format=_FORMATS[request.prm_format],
        device=request.device or None,
        dtype=request.dtype or None,
        trust_remote_code=request.trust_remote_code,
        step_token=request.step_token or None,
        positive_token=request.positive_token or None,
        negative_token=request.negative_token or None,
        judge_template=request.judge_template or None,
        judge_group_template=request.judge_group_template or None,
    )


def model_info(info: ModelInfo) -> reward_pb2.ModelInfo:
    loaded_at = timestamp_pb2.Timestamp()
    loaded_at.FromDatetime(info.loaded_at)
    return reward_pb2.ModelInfo(
        name=info.name,
        path=info.path,
        kind=_KIND_PROTOS[info.kind],
        prm_format=_FORMAT_PROTOS[info.prm_format or PrmFormat.AUTO],
        version=info.version,
        device=info.device,
        dtype=info.dtype,
        loaded_at=loaded_at,
    )


class RewardAdminServicer(reward_pb2_grpc.RewardAdminServiceServicer):
    """LoadModel / UnloadModel / ListModels over one shared registry."""

    def __init__(self, registry: ModelRegistry) -> None:
        self._registry = registry

    async def LoadModel(self, request, context) -> reward_pb2.LoadModelResponse:
        info = await self._registry.load(model_spec(request))
        return reward_pb2.LoadModelResponse(model=model_info(info))

    async def UnloadModel(self, request, context) -> reward_pb2.UnloadModelResponse:
        await self._registry.unload(request.name)
        return reward_pb2.UnloadModelResponse()

    async def ListModels(self, request, context) -> reward_pb2.ListModelsResponse:
        return reward_pb2.ListModelsResponse(models=[model_info(info) for info in self._registry.list()])
