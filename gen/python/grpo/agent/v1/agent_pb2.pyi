from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunEpisodeRequest(_message.Message):
    __slots__ = ("task", "base_url", "deadline_unix_ms", "episode_id")
    TASK_FIELD_NUMBER: _ClassVar[int]
    BASE_URL_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    task: _struct_pb2.Struct
    base_url: str
    deadline_unix_ms: int
    episode_id: str
    def __init__(self, task: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., base_url: _Optional[str] = ..., deadline_unix_ms: _Optional[int] = ..., episode_id: _Optional[str] = ...) -> None: ...

class RunEpisodeResponse(_message.Message):
    __slots__ = ("reward", "metadata")
    REWARD_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    reward: float
    metadata: _struct_pb2.Struct
    def __init__(self, reward: _Optional[float] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...
