"""Process and outcome reward models: loading, dynamic batching, hot swap (``prm:<name>``, ``orm:<name>``)."""

from reward_service.models.registry import ModelRegistry
from reward_service.models.settings import ModelSettings, PreloadModel
from reward_service.models.spec import ModelInfo, ModelKind, ModelSpec, PrmFormat

__all__ = [
    "ModelInfo",
    "ModelKind",
    "ModelRegistry",
    "ModelSettings",
    "ModelSpec",
    "PreloadModel",
    "PrmFormat",
]
