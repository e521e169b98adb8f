from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListEnvironmentsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListEnvironmentsResponse(_message.Message):
    __slots__ = ("environments",)
    ENVIRONMENTS_FIELD_NUMBER: _ClassVar[int]
    environments: _containers.RepeatedCompositeFieldContainer[EnvironmentInfo]
    def __init__(self, environments: _Optional[_Iterable[_Union[EnvironmentInfo, _Mapping]]] = ...) -> None: ...

class EnvironmentInfo(_message.Message):
    __slots__ = ("name", "description", "kind", "available", "status")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    kind: str
    available: bool
    status: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., kind: _Optional[str] = ..., available: _Optional[bool] = ..., status: _Optional[str] = ...) -> None: ...

class OpenEpisodeRequest(_message.Message):
    __slots__ = ("environment", "params", "metadata")
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    environment: str
    params: _struct_pb2.Struct
    metadata: _struct_pb2.Struct
    def __init__(self, environment: _Optional[str] = ..., params: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class OpenEpisodeResponse(_message.Message):
    __slots__ = ("episode_id", "tools", "prompt_suffix")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_SUFFIX_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    tools: _containers.RepeatedCompositeFieldContainer[ToolDefinition]
    prompt_suffix: str
    def __init__(self, episode_id: _Optional[str] = ..., tools: _Optional[_Iterable[_Union[ToolDefinition, _Mapping]]] = ..., prompt_suffix: _Optional[str] = ...) -> None: ...

class ToolDefinition(_message.Message):
    __slots__ = ("name", "description", "parameters")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters: _struct_pb2.Struct
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("episode_id", "calls")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    def __init__(self, episode_id: _Optional[str] = ..., calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments_json: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("results", "done")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ToolResult]
    done: bool
    def __init__(self, results: _Optional[_Iterable[_Union[ToolResult, _Mapping]]] = ..., done: _Optional[bool] = ...) -> None: ...

class ToolResult(_message.Message):
    __slots__ = ("call_id", "name", "content", "error", "truncated")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    name: str
    content: str
    error: bool
    truncated: bool
    def __init__(self, call_id: _Optional[str] = ..., name: _Optional[str] = ..., content: _Optional[str] = ..., error: _Optional[bool] = ..., truncated: _Optional[bool] = ...) -> None: ...

class GetRewardRequest(_message.Message):
    __slots__ = ("episode_id",)
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    def __init__(self, episode_id: _Optional[str] = ...) -> None: ...

class GetRewardResponse(_message.Message):
    __slots__ = ("reward", "error")
    REWARD_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    reward: float
    error: str
    def __init__(self, reward: _Optional[float] = ..., error: _Optional[str] = ...) -> None: ...

class CloseEpisodeRequest(_message.Message):
    __slots__ = ("episode_id",)
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    def __init__(self, episode_id: _Optional[str] = ...) -> None: ...

class CloseEpisodeResponse(_message.Message):
    __slots__ = ("closed",)
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    closed: bool
    def __init__(self, closed: _Optional[bool] = ...) -> None: ...

class OpenEpisodesRequest(_message.Message):
    __slots__ = ("episodes",)
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    episodes: _containers.RepeatedCompositeFieldContainer[OpenEpisodeRequest]
    def __init__(self, episodes: _Optional[_Iterable[_Union[OpenEpisodeRequest, _Mapping]]] = ...) -> None: ...

class OpenEpisodesResponse(_message.Message):
    __slots__ = ("opened",)
    OPENED_FIELD_NUMBER: _ClassVar[int]
    opened: _containers.RepeatedCompositeFieldContainer[OpenedEpisode]
    def __init__(self, opened: _Optional[_Iterable[_Union[OpenedEpisode, _Mapping]]] = ...) -> None: ...

class OpenedEpisode(_message.Message):
    __slots__ = ("index", "episode", "error")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    EPISODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    index: int
    episode: OpenEpisodeResponse
    error: EntryError
    def __init__(self, index: _Optional[int] = ..., episode: _Optional[_Union[OpenEpisodeResponse, _Mapping]] = ..., error: _Optional[_Union[EntryError, _Mapping]] = ...) -> None: ...

class StepEpisodesRequest(_message.Message):
    __slots__ = ("steps",)
    STEPS_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[StepRequest]
    def __init__(self, steps: _Optional[_Iterable[_Union[StepRequest, _Mapping]]] = ...) -> None: ...

class StepEpisodesResponse(_message.Message):
    __slots__ = ("stepped",)
    STEPPED_FIELD_NUMBER: _ClassVar[int]
    stepped: _containers.RepeatedCompositeFieldContainer[SteppedEpisode]
    def __init__(self, stepped: _Optional[_Iterable[_Union[SteppedEpisode, _Mapping]]] = ...) -> None: ...

class SteppedEpisode(_message.Message):
    __slots__ = ("index", "step", "error")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    index: int
    step: StepResponse
    error: EntryError
    def __init__(self, index: _Optional[int] = ..., step: _Optional[_Union[StepResponse, _Mapping]] = ..., error: _Optional[_Union[EntryError, _Mapping]] = ...) -> None: ...

class CloseEpisodesRequest(_message.Message):
    __slots__ = ("episode_ids",)
    EPISODE_IDS_FIELD_NUMBER: _ClassVar[int]
    episode_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, episode_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CloseEpisodesResponse(_message.Message):
    __slots__ = ("closed",)
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    closed: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, closed: _Optional[_Iterable[bool]] = ...) -> None: ...

class EntryError(_message.Message):
    __slots__ = ("code", "details", "retry_after_ms")
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    code: int
    details: str
    retry_after_ms: int
    def __init__(self, code: _Optional[int] = ..., details: _Optional[str] = ..., retry_after_ms: _Optional[int] = ...) -> None: ...
