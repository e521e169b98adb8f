import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from grpo.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_KIND_UNSPECIFIED: _ClassVar[ModelKind]
    MODEL_KIND_PRM: _ClassVar[ModelKind]
    MODEL_KIND_ORM: _ClassVar[ModelKind]
    MODEL_KIND_JUDGE: _ClassVar[ModelKind]

class PrmFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRM_FORMAT_UNSPECIFIED: _ClassVar[PrmFormat]
    PRM_FORMAT_TOKEN_CLASSIFICATION: _ClassVar[PrmFormat]
    PRM_FORMAT_STEP_TAG: _ClassVar[PrmFormat]
MODEL_KIND_UNSPECIFIED: ModelKind
MODEL_KIND_PRM: ModelKind
MODEL_KIND_ORM: ModelKind
MODEL_KIND_JUDGE: ModelKind
PRM_FORMAT_UNSPECIFIED: PrmFormat
PRM_FORMAT_TOKEN_CLASSIFICATION: PrmFormat
PRM_FORMAT_STEP_TAG: PrmFormat

class Sample(_message.Message):
    __slots__ = ("id", "prompt", "completion", "completion_ids", "metadata", "group")
    ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_IDS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    id: str
    prompt: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChatMessage]
    completion: str
    completion_ids: _containers.RepeatedScalarFieldContainer[int]
    metadata: _struct_pb2.Struct
    group: str
    def __init__(self, id: _Optional[str] = ..., prompt: _Optional[_Iterable[_Union[_common_pb2.ChatMessage, _Mapping]]] = ..., completion: _Optional[str] = ..., completion_ids: _Optional[_Iterable[int]] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., group: _Optional[str] = ...) -> None: ...

class RewardSpec(_message.Message):
    __slots__ = ("name", "weight", "params")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    name: str
    weight: float
    params: _struct_pb2.Struct
    def __init__(self, name: _Optional[str] = ..., weight: _Optional[float] = ..., params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("samples", "rewards")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[Sample]
    rewards: _containers.RepeatedCompositeFieldContainer[RewardSpec]
    def __init__(self, samples: _Optional[_Iterable[_Union[Sample, _Mapping]]] = ..., rewards: _Optional[_Iterable[_Union[RewardSpec, _Mapping]]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("scores",)
    SCORES_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedCompositeFieldContainer[SampleScore]
    def __init__(self, scores: _Optional[_Iterable[_Union[SampleScore, _Mapping]]] = ...) -> None: ...

class SampleScore(_message.Message):
    __slots__ = ("id", "reward", "components")
    ID_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    reward: float
    components: _containers.RepeatedCompositeFieldContainer[ComponentScore]
    def __init__(self, id: _Optional[str] = ..., reward: _Optional[float] = ..., components: _Optional[_Iterable[_Union[ComponentScore, _Mapping]]] = ...) -> None: ...

class ComponentScore(_message.Message):
    __slots__ = ("name", "value", "step_scores", "error")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    STEP_SCORES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: float
    step_scores: _containers.RepeatedScalarFieldContainer[float]
    error: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[float] = ..., step_scores: _Optional[_Iterable[float]] = ..., error: _Optional[str] = ...) -> None: ...

class StressRewardRequest(_message.Message):
    __slots__ = ("samples", "rewards", "threshold", "attacks")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    ATTACKS_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[Sample]
    rewards: _containers.RepeatedCompositeFieldContainer[RewardSpec]
    threshold: float
    attacks: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, samples: _Optional[_Iterable[_Union[Sample, _Mapping]]] = ..., rewards: _Optional[_Iterable[_Union[RewardSpec, _Mapping]]] = ..., threshold: _Optional[float] = ..., attacks: _Optional[_Iterable[str]] = ...) -> None: ...

class StressRewardResponse(_message.Message):
    __slots__ = ("threshold", "attacks", "baseline")
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    ATTACKS_FIELD_NUMBER: _ClassVar[int]
    BASELINE_FIELD_NUMBER: _ClassVar[int]
    threshold: float
    attacks: _containers.RepeatedCompositeFieldContainer[AttackOutcome]
    baseline: _containers.RepeatedCompositeFieldContainer[SampleScore]
    def __init__(self, threshold: _Optional[float] = ..., attacks: _Optional[_Iterable[_Union[AttackOutcome, _Mapping]]] = ..., baseline: _Optional[_Iterable[_Union[SampleScore, _Mapping]]] = ...) -> None: ...

class AttackOutcome(_message.Message):
    __slots__ = ("name", "description", "example", "scores", "max_reward", "flagged")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    EXAMPLE_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    MAX_REWARD_FIELD_NUMBER: _ClassVar[int]
    FLAGGED_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    example: str
    scores: _containers.RepeatedCompositeFieldContainer[SampleScore]
    max_reward: float
    flagged: bool
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., example: _Optional[str] = ..., scores: _Optional[_Iterable[_Union[SampleScore, _Mapping]]] = ..., max_reward: _Optional[float] = ..., flagged: _Optional[bool] = ...) -> None: ...

class ListRewardsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListRewardsResponse(_message.Message):
    __slots__ = ("rewards",)
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    rewards: _containers.RepeatedCompositeFieldContainer[RewardInfo]
    def __init__(self, rewards: _Optional[_Iterable[_Union[RewardInfo, _Mapping]]] = ...) -> None: ...

class RewardInfo(_message.Message):
    __slots__ = ("name", "description", "params", "required_metadata", "min_value", "max_value", "group_aware", "available", "status")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_METADATA_FIELD_NUMBER: _ClassVar[int]
    MIN_VALUE_FIELD_NUMBER: _ClassVar[int]
    MAX_VALUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_AWARE_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    params: _containers.RepeatedCompositeFieldContainer[RewardParam]
    required_metadata: _containers.RepeatedScalarFieldContainer[str]
    min_value: float
    max_value: float
    group_aware: bool
    available: bool
    status: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., params: _Optional[_Iterable[_Union[RewardParam, _Mapping]]] = ..., required_metadata: _Optional[_Iterable[str]] = ..., min_value: _Optional[float] = ..., max_value: _Optional[float] = ..., group_aware: _Optional[bool] = ..., available: _Optional[bool] = ..., status: _Optional[str] = ...) -> None: ...

class RewardParam(_message.Message):
    __slots__ = ("name", "type", "default_value", "description")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    default_value: _struct_pb2.Value
    description: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., default_value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., description: _Optional[str] = ...) -> None: ...

class LoadModelRequest(_message.Message):
    __slots__ = ("name", "path", "kind", "prm_format", "device", "dtype", "trust_remote_code", "step_token", "positive_token", "negative_token", "judge_template", "judge_group_template")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PRM_FORMAT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    TRUST_REMOTE_CODE_FIELD_NUMBER: _ClassVar[int]
    STEP_TOKEN_FIELD_NUMBER: _ClassVar[int]
    POSITIVE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    JUDGE_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    JUDGE_GROUP_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    kind: ModelKind
    prm_format: PrmFormat
    device: str
    dtype: str
    trust_remote_code: bool
    step_token: str
    positive_token: str
    negative_token: str
    judge_template: str
    judge_group_template: str
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., kind: _Optional[_Union[ModelKind, str]] = ..., prm_format: _Optional[_Union[PrmFormat, str]] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., trust_remote_code: _Optional[bool] = ..., step_token: _Optional[str] = ..., positive_token: _Optional[str] = ..., negative_token: _Optional[str] = ..., judge_template: _Optional[str] = ..., judge_group_template: _Optional[str] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "path", "kind", "prm_format", "version", "device", "dtype", "loaded_at")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PRM_FORMAT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    LOADED_AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    kind: ModelKind
    prm_format: PrmFormat
    version: int
    device: str
    dtype: str
    loaded_at: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., kind: _Optional[_Union[ModelKind, str]] = ..., prm_format: _Optional[_Union[PrmFormat, str]] = ..., version: _Optional[int] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., loaded_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class LoadModelResponse(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: ModelInfo
    def __init__(self, model: _Optional[_Union[ModelInfo, _Mapping]] = ...) -> None: ...

class UnloadModelRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class UnloadModelResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...
