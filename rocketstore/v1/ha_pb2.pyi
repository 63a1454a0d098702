from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetConfigFilesRequest(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class ConfigFile(_message.Message):
    __slots__ = ("name", "exists", "content")
    NAME_FIELD_NUMBER: _ClassVar[int]
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    exists: bool
    content: bytes
    def __init__(self, name: _Optional[str] = ..., exists: _Optional[bool] = ..., content: _Optional[bytes] = ...) -> None: ...

class ConfigFiles(_message.Message):
    __slots__ = ("files",)
    FILES_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[ConfigFile]
    def __init__(self, files: _Optional[_Iterable[_Union[ConfigFile, _Mapping]]] = ...) -> None: ...

class SlaveReport(_message.Message):
    __slots__ = ("max_offset", "broker_name", "broker_id", "check_offset", "check_crc32", "gateway_endpoint", "takes_more", "error")
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    CHECK_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CHECK_CRC32_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    TAKES_MORE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    max_offset: int
    broker_name: str
    broker_id: int
    check_offset: int
    check_crc32: int
    gateway_endpoint: str
    takes_more: bool
    error: str
    def __init__(self, max_offset: _Optional[int] = ..., broker_name: _Optional[str] = ..., broker_id: _Optional[int] = ..., check_offset: _Optional[int] = ..., check_crc32: _Optional[int] = ..., gateway_endpoint: _Optional[str] = ..., takes_more: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class Transfer(_message.Message):
    __slots__ = ("offset", "data", "master_max_offset", "more")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MASTER_MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    master_max_offset: int
    more: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ..., master_max_offset: _Optional[int] = ..., more: _Optional[_Iterable[bytes]] = ...) -> None: ...

class GetHAStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SlaveConnection(_message.Message):
    __slots__ = ("connection_id", "slave_address", "broker_name", "broker_id", "start_offset", "acked_offset", "sent_offset", "lag_bytes", "gateway_endpoint", "error")
    CONNECTION_ID_FIELD_NUMBER: _ClassVar[int]
    SLAVE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ACKED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SENT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_BYTES_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    connection_id: str
    slave_address: str
    broker_name: str
    broker_id: int
    start_offset: int
    acked_offset: int
    sent_offset: int
    lag_bytes: int
    gateway_endpoint: str
    error: str
    def __init__(self, connection_id: _Optional[str] = ..., slave_address: _Optional[str] = ..., broker_name: _Optional[str] = ..., broker_id: _Optional[int] = ..., start_offset: _Optional[int] = ..., acked_offset: _Optional[int] = ..., sent_offset: _Optional[int] = ..., lag_bytes: _Optional[int] = ..., gateway_endpoint: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class HAStatus(_message.Message):
    __slots__ = ("role", "max_offset", "slaves", "master_address", "connected", "master_max_offset", "lag_bytes", "error", "lag_millis", "refused_slaves")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SLAVES_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    MASTER_MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_BYTES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LAG_MILLIS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_SLAVES_FIELD_NUMBER: _ClassVar[int]
    role: str
    max_offset: int
    slaves: _containers.RepeatedCompositeFieldContainer[SlaveConnection]
    master_address: str
    connected: bool
    master_max_offset: int
    lag_bytes: int
    error: str
    lag_millis: int
    refused_slaves: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, role: _Optional[str] = ..., max_offset: _Optional[int] = ..., slaves: _Optional[_Iterable[_Union[SlaveConnection, _Mapping]]] = ..., master_address: _Optional[str] = ..., connected: _Optional[bool] = ..., master_max_offset: _Optional[int] = ..., lag_bytes: _Optional[int] = ..., error: _Optional[str] = ..., lag_millis: _Optional[int] = ..., refused_slaves: _Optional[_Iterable[str]] = ...) -> None: ...
