from google.protobuf import struct_pb2 as _struct_pb2
from grpo.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]
    FINISH_REASON_TURN_LIMIT: _ClassVar[FinishReason]
    FINISH_REASON_ERROR: _ClassVar[FinishReason]

class WeightFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WEIGHT_FORMAT_UNSPECIFIED: _ClassVar[WeightFormat]
    WEIGHT_FORMAT_LORA_ADAPTER: _ClassVar[WeightFormat]
    WEIGHT_FORMAT_STATE_DICT: _ClassVar[WeightFormat]

class WeightTransport(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WEIGHT_TRANSPORT_UNSPECIFIED: _ClassVar[WeightTransport]
    WEIGHT_TRANSPORT_GRPC_STREAM: _ClassVar[WeightTransport]
    WEIGHT_TRANSPORT_SHARED_MEMORY: _ClassVar[WeightTransport]
    WEIGHT_TRANSPORT_TORCH_DISTRIBUTED: _ClassVar[WeightTransport]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORT: FinishReason
FINISH_REASON_TURN_LIMIT: FinishReason
FINISH_REASON_ERROR: FinishReason
WEIGHT_FORMAT_UNSPECIFIED: WeightFormat
WEIGHT_FORMAT_LORA_ADAPTER: WeightFormat
WEIGHT_FORMAT_STATE_DICT: WeightFormat
WEIGHT_TRANSPORT_UNSPECIFIED: WeightTransport
WEIGHT_TRANSPORT_GRPC_STREAM: WeightTransport
WEIGHT_TRANSPORT_SHARED_MEMORY: WeightTransport
WEIGHT_TRANSPORT_TORCH_DISTRIBUTED: WeightTransport

class Prompt(_message.Message):
    __slots__ = ("id", "messages", "text", "token_ids", "episode")
    ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    EPISODE_FIELD_NUMBER: _ClassVar[int]
    id: str
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChatMessage]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    episode: Episode
    def __init__(self, id: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_common_pb2.ChatMessage, _Mapping]]] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., episode: _Optional[_Union[Episode, _Mapping]] = ...) -> None: ...

class Episode(_message.Message):
    __slots__ = ("environment", "params", "metadata", "max_turns", "max_tool_calls", "target", "skip_reward")
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SKIP_REWARD_FIELD_NUMBER: _ClassVar[int]
    environment: str
    params: _struct_pb2.Struct
    metadata: _struct_pb2.Struct
    max_turns: int
    max_tool_calls: int
    target: str
    skip_reward: bool
    def __init__(self, environment: _Optional[str] = ..., params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., max_turns: _Optional[int] = ..., max_tool_calls: _Optional[int] = ..., target: _Optional[str] = ..., skip_reward: _Optional[bool] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "stop", "seed", "repetition_penalty", "min_tokens")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    max_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    seed: int
    repetition_penalty: float
    min_tokens: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., max_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., seed: _Optional[int] = ..., repetition_penalty: _Optional[float] = ..., min_tokens: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompts", "n", "sampling", "continue_across_updates", "min_policy_version")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_ACROSS_UPDATES_FIELD_NUMBER: _ClassVar[int]
    MIN_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[Prompt]
    n: int
    sampling: SamplingParams
    continue_across_updates: bool
    min_policy_version: int
    def __init__(self, prompts: _Optional[_Iterable[_Union[Prompt, _Mapping]]] = ..., n: _Optional[int] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., continue_across_updates: _Optional[bool] = ..., min_policy_version: _Optional[int] = ...) -> None: ...

class Turn(_message.Message):
    __slots__ = ("start", "end", "policy_version", "tool_calls")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    policy_version: int
    tool_calls: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ..., policy_version: _Optional[int] = ..., tool_calls: _Optional[int] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("prompt_id", "prompt_token_ids", "token_ids", "text", "logprobs", "finish_reason", "policy_version", "tool_mask", "turns", "tool_call_count", "tool_failure_count", "env_reward", "error", "token_versions")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOOL_MASK_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOOL_FAILURE_COUNT_FIELD_NUMBER: _ClassVar[int]
    ENV_REWARD_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TOKEN_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: FinishReason
    policy_version: int
    tool_mask: _containers.RepeatedScalarFieldContainer[int]
    turns: _containers.RepeatedCompositeFieldContainer[Turn]
    tool_call_count: int
    tool_failure_count: int
    env_reward: float
    error: str
    token_versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, prompt_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., logprobs: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., policy_version: _Optional[int] = ..., tool_mask: _Optional[_Iterable[int]] = ..., turns: _Optional[_Iterable[_Union[Turn, _Mapping]]] = ..., tool_call_count: _Optional[int] = ..., tool_failure_count: _Optional[int] = ..., env_reward: _Optional[float] = ..., error: _Optional[str] = ..., token_versions: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("completions",)
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    completions: _containers.RepeatedCompositeFieldContainer[Completion]
    def __init__(self, completions: _Optional[_Iterable[_Union[Completion, _Mapping]]] = ...) -> None: ...

class WeightChunk(_message.Message):
    __slots__ = ("version", "format", "adapter_config_json", "total_bytes", "sha256", "data")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    version: int
    format: WeightFormat
    adapter_config_json: str
    total_bytes: int
    sha256: str
    data: bytes
    def __init__(self, version: _Optional[int] = ..., format: _Optional[_Union[WeightFormat, str]] = ..., adapter_config_json: _Optional[str] = ..., total_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class UpdateWeightsResponse(_message.Message):
    __slots__ = ("policy_version", "bytes_received", "tensors_loaded", "apply_seconds")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    TENSORS_LOADED_FIELD_NUMBER: _ClassVar[int]
    APPLY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    bytes_received: int
    tensors_loaded: int
    apply_seconds: float
    def __init__(self, policy_version: _Optional[int] = ..., bytes_received: _Optional[int] = ..., tensors_loaded: _Optional[int] = ..., apply_seconds: _Optional[float] = ...) -> None: ...

class LoadWeightsRequest(_message.Message):
    __slots__ = ("path", "version", "format")
    PATH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    path: str
    version: int
    format: WeightFormat
    def __init__(self, path: _Optional[str] = ..., version: _Optional[int] = ..., format: _Optional[_Union[WeightFormat, str]] = ...) -> None: ...

class LoadWeightsResponse(_message.Message):
    __slots__ = ("policy_version", "tensors_loaded", "apply_seconds")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_LOADED_FIELD_NUMBER: _ClassVar[int]
    APPLY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    tensors_loaded: int
    apply_seconds: float
    def __init__(self, policy_version: _Optional[int] = ..., tensors_loaded: _Optional[int] = ..., apply_seconds: _Optional[float] = ...) -> None: ...

class SleepRequest(_message.Message):
    __slots__ = ("level",)
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    level: int
    def __init__(self, level: _Optional[int] = ...) -> None: ...

class MemoryUsage(_message.Message):
    __slots__ = ("rss_bytes", "cuda_allocated_bytes", "cuda_reserved_bytes")
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    CUDA_ALLOCATED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CUDA_RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    rss_bytes: int
    cuda_allocated_bytes: int
    cuda_reserved_bytes: int
    def __init__(self, rss_bytes: _Optional[int] = ..., cuda_allocated_bytes: _Optional[int] = ..., cuda_reserved_bytes: _Optional[int] = ...) -> None: ...

class SleepResponse(_message.Message):
    __slots__ = ("level", "memory_before", "memory_after")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BEFORE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_AFTER_FIELD_NUMBER: _ClassVar[int]
    level: int
    memory_before: MemoryUsage
    memory_after: MemoryUsage
    def __init__(self, level: _Optional[int] = ..., memory_before: _Optional[_Union[MemoryUsage, _Mapping]] = ..., memory_after: _Optional[_Union[MemoryUsage, _Mapping]] = ...) -> None: ...

class WakeUpRequest(_message.Message):
    __slots__ = ("tags",)
    TAGS_FIELD_NUMBER: _ClassVar[int]
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tags: _Optional[_Iterable[str]] = ...) -> None: ...

class WakeUpResponse(_message.Message):
    __slots__ = ("weights_valid", "memory", "wake_seconds")
    WEIGHTS_VALID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    WAKE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    weights_valid: bool
    memory: MemoryUsage
    wake_seconds: float
    def __init__(self, weights_valid: _Optional[bool] = ..., memory: _Optional[_Union[MemoryUsage, _Mapping]] = ..., wake_seconds: _Optional[float] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("engine", "device", "model", "policy_version", "sleep_level", "sleeping_tags", "weights_valid", "memory", "max_model_len", "weight_format", "weight_transport", "weight_transports", "weight_shm_dir", "weight_shm_token", "openai_port")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SLEEP_LEVEL_FIELD_NUMBER: _ClassVar[int]
    SLEEPING_TAGS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_VALID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_TRANSPORTS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_SHM_DIR_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_SHM_TOKEN_FIELD_NUMBER: _ClassVar[int]
    OPENAI_PORT_FIELD_NUMBER: _ClassVar[int]
    engine: str
    device: str
    model: str
    policy_version: int
    sleep_level: int
    sleeping_tags: _containers.RepeatedScalarFieldContainer[str]
    weights_valid: bool
    memory: MemoryUsage
    max_model_len: int
    weight_format: WeightFormat
    weight_transport: WeightTransport
    weight_transports: _containers.RepeatedScalarFieldContainer[WeightTransport]
    weight_shm_dir: str
    weight_shm_token: str
    openai_port: int
    def __init__(self, engine: _Optional[str] = ..., device: _Optional[str] = ..., model: _Optional[str] = ..., policy_version: _Optional[int] = ..., sleep_level: _Optional[int] = ..., sleeping_tags: _Optional[_Iterable[str]] = ..., weights_valid: _Optional[bool] = ..., memory: _Optional[_Union[MemoryUsage, _Mapping]] = ..., max_model_len: _Optional[int] = ..., weight_format: _Optional[_Union[WeightFormat, str]] = ..., weight_transport: _Optional[_Union[WeightTransport, str]] = ..., weight_transports: _Optional[_Iterable[_Union[WeightTransport, str]]] = ..., weight_shm_dir: _Optional[str] = ..., weight_shm_token: _Optional[str] = ..., openai_port: _Optional[int] = ...) -> None: ...

class OpenWeightChannelRequest(_message.Message):
    __slots__ = ("transport", "init_method", "rank", "world_size", "backend", "timeout_seconds")
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    INIT_METHOD_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    transport: WeightTransport
    init_method: str
    rank: int
    world_size: int
    backend: str
    timeout_seconds: float
    def __init__(self, transport: _Optional[_Union[WeightTransport, str]] = ..., init_method: _Optional[str] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., backend: _Optional[str] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class OpenWeightChannelResponse(_message.Message):
    __slots__ = ("transport",)
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    transport: WeightTransport
    def __init__(self, transport: _Optional[_Union[WeightTransport, str]] = ...) -> None: ...

class TensorLayout(_message.Message):
    __slots__ = ("name", "dtype", "shape", "bucket", "offset", "nbytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    bucket: int
    offset: int
    nbytes: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., bucket: _Optional[int] = ..., offset: _Optional[int] = ..., nbytes: _Optional[int] = ...) -> None: ...

class UpdateWeightsFromChannelRequest(_message.Message):
    __slots__ = ("version", "format", "adapter_config_json", "tensors", "bucket_bytes", "bucket_files")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    BUCKET_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FILES_FIELD_NUMBER: _ClassVar[int]
    version: int
    format: WeightFormat
    adapter_config_json: str
    tensors: _containers.RepeatedCompositeFieldContainer[TensorLayout]
    bucket_bytes: _containers.RepeatedScalarFieldContainer[int]
    bucket_files: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[int] = ..., format: _Optional[_Union[WeightFormat, str]] = ..., adapter_config_json: _Optional[str] = ..., tensors: _Optional[_Iterable[_Union[TensorLayout, _Mapping]]] = ..., bucket_bytes: _Optional[_Iterable[int]] = ..., bucket_files: _Optional[_Iterable[str]] = ...) -> None: ...

class UpdateWeightsFromChannelResponse(_message.Message):
    __slots__ = ("policy_version", "bytes_received", "tensors_loaded", "transfer_seconds", "apply_seconds", "transport")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    TENSORS_LOADED_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    APPLY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    bytes_received: int
    tensors_loaded: int
    transfer_seconds: float
    apply_seconds: float
    transport: WeightTransport
    def __init__(self, policy_version: _Optional[int] = ..., bytes_received: _Optional[int] = ..., tensors_loaded: _Optional[int] = ..., transfer_seconds: _Optional[float] = ..., apply_seconds: _Optional[float] = ..., transport: _Optional[_Union[WeightTransport, str]] = ...) -> None: ...

class CloseWeightChannelRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CloseWeightChannelResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class OpenAgentSessionRequest(_message.Message):
    __slots__ = ("ttl_seconds", "sampling", "min_policy_version", "max_completion_tokens")
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MIN_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ttl_seconds: float
    sampling: SamplingParams
    min_policy_version: int
    max_completion_tokens: int
    def __init__(self, ttl_seconds: _Optional[float] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., min_policy_version: _Optional[int] = ..., max_completion_tokens: _Optional[int] = ...) -> None: ...

class OpenAgentSessionResponse(_message.Message):
    __slots__ = ("session_id", "expires_unix_ms", "openai_port")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    OPENAI_PORT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    expires_unix_ms: int
    openai_port: int
    def __init__(self, session_id: _Optional[str] = ..., expires_unix_ms: _Optional[int] = ..., openai_port: _Optional[int] = ...) -> None: ...

class OpenAgentSessionsRequest(_message.Message):
    __slots__ = ("session", "count")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    session: OpenAgentSessionRequest
    count: int
    def __init__(self, session: _Optional[_Union[OpenAgentSessionRequest, _Mapping]] = ..., count: _Optional[int] = ...) -> None: ...

class OpenAgentSessionsResponse(_message.Message):
    __slots__ = ("sessions",)
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[OpenAgentSessionResponse]
    def __init__(self, sessions: _Optional[_Iterable[_Union[OpenAgentSessionResponse, _Mapping]]] = ...) -> None: ...

class GetAgentTrajectoryRequest(_message.Message):
    __slots__ = ("session_id", "close")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    close: bool
    def __init__(self, session_id: _Optional[str] = ..., close: _Optional[bool] = ...) -> None: ...

class AgentSequence(_message.Message):
    __slots__ = ("token_ids", "loss_mask", "logprobs", "policy_versions")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    loss_mask: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    policy_versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., loss_mask: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., policy_versions: _Optional[_Iterable[int]] = ...) -> None: ...

class GetAgentTrajectoryResponse(_message.Message):
    __slots__ = ("sequences", "calls", "retokenized_tokens", "prefix_mismatches")
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    RETOKENIZED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_MISMATCHES_FIELD_NUMBER: _ClassVar[int]
    sequences: _containers.RepeatedCompositeFieldContainer[AgentSequence]
    calls: int
    retokenized_tokens: int
    prefix_mismatches: int
    def __init__(self, sequences: _Optional[_Iterable[_Union[AgentSequence, _Mapping]]] = ..., calls: _Optional[int] = ..., retokenized_tokens: _Optional[int] = ..., prefix_mismatches: _Optional[int] = ...) -> None: ...

class CloseAgentSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseAgentSessionResponse(_message.Message):
    __slots__ = ("closed",)
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    closed: bool
    def __init__(self, closed: _Optional[bool] = ...) -> None: ...
