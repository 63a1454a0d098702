from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PutMessageStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PUT_OK: _ClassVar[PutMessageStatus]
    FLUSH_DISK_TIMEOUT: _ClassVar[PutMessageStatus]
    FLUSH_SLAVE_TIMEOUT: _ClassVar[PutMessageStatus]
    SLAVE_NOT_AVAILABLE: _ClassVar[PutMessageStatus]
    SERVICE_NOT_AVAILABLE: _ClassVar[PutMessageStatus]
    CREATE_MAPEDFILE_FAILED: _ClassVar[PutMessageStatus]
    MESSAGE_ILLEGAL: _ClassVar[PutMessageStatus]
    PROPERTIES_SIZE_EXCEEDED: _ClassVar[PutMessageStatus]
    OS_PAGECACHE_BUSY: _ClassVar[PutMessageStatus]
    UNKNOWN_ERROR: _ClassVar[PutMessageStatus]
PUT_OK: PutMessageStatus
FLUSH_DISK_TIMEOUT: PutMessageStatus
FLUSH_SLAVE_TIMEOUT: PutMessageStatus
SLAVE_NOT_AVAILABLE: PutMessageStatus
SERVICE_NOT_AVAILABLE: PutMessageStatus
CREATE_MAPEDFILE_FAILED: PutMessageStatus
MESSAGE_ILLEGAL: PutMessageStatus
PROPERTIES_SIZE_EXCEEDED: PutMessageStatus
OS_PAGECACHE_BUSY: PutMessageStatus
UNKNOWN_ERROR: PutMessageStatus

class Message(_message.Message):
    __slots__ = ("topic", "queue_id", "flag", "body", "properties", "sys_flag", "born_timestamp", "born_host", "reconsume_times", "prepared_transaction_offset", "properties_text")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    SYS_FLAG_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    BORN_HOST_FIELD_NUMBER: _ClassVar[int]
    RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    PREPARED_TRANSACTION_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_TEXT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    flag: int
    body: bytes
    properties: _containers.ScalarMap[str, str]
    sys_flag: int
    born_timestamp: int
    born_host: str
    reconsume_times: int
    prepared_transaction_offset: int
    properties_text: str
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., flag: _Optional[int] = ..., body: _Optional[bytes] = ..., properties: _Optional[_Mapping[str, str]] = ..., sys_flag: _Optional[int] = ..., born_timestamp: _Optional[int] = ..., born_host: _Optional[str] = ..., reconsume_times: _Optional[int] = ..., prepared_transaction_offset: _Optional[int] = ..., properties_text: _Optional[str] = ...) -> None: ...

class AppendBatchRequest(_message.Message):
    __slots__ = ("messages", "columnar")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    COLUMNAR_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    columnar: bool
    def __init__(self, messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., columnar: _Optional[bool] = ...) -> None: ...

class AppendResult(_message.Message):
    __slots__ = ("status", "reason", "msg_id", "wrote_offset", "wrote_bytes", "queue_offset", "store_timestamp")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    WROTE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    WROTE_BYTES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    status: PutMessageStatus
    reason: str
    msg_id: str
    wrote_offset: int
    wrote_bytes: int
    queue_offset: int
    store_timestamp: int
    def __init__(self, status: _Optional[_Union[PutMessageStatus, str]] = ..., reason: _Optional[str] = ..., msg_id: _Optional[str] = ..., wrote_offset: _Optional[int] = ..., wrote_bytes: _Optional[int] = ..., queue_offset: _Optional[int] = ..., store_timestamp: _Optional[int] = ...) -> None: ...

class AppendColumns(_message.Message):
    __slots__ = ("statuses", "reasons", "wrote_offsets", "wrote_bytes", "queue_offsets", "store_timestamp", "msg_id_prefix")
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    WROTE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    WROTE_BYTES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_PREFIX_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedScalarFieldContainer[PutMessageStatus]
    reasons: _containers.RepeatedScalarFieldContainer[str]
    wrote_offsets: _containers.RepeatedScalarFieldContainer[int]
    wrote_bytes: _containers.RepeatedScalarFieldContainer[int]
    queue_offsets: _containers.RepeatedScalarFieldContainer[int]
    store_timestamp: int
    msg_id_prefix: str
    def __init__(self, statuses: _Optional[_Iterable[_Union[PutMessageStatus, str]]] = ..., reasons: _Optional[_Iterable[str]] = ..., wrote_offsets: _Optional[_Iterable[int]] = ..., wrote_bytes: _Optional[_Iterable[int]] = ..., queue_offsets: _Optional[_Iterable[int]] = ..., store_timestamp: _Optional[int] = ..., msg_id_prefix: _Optional[str] = ...) -> None: ...

class AppendBatchResponse(_message.Message):
    __slots__ = ("results", "columns")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AppendResult]
    columns: AppendColumns
    def __init__(self, results: _Optional[_Iterable[_Union[AppendResult, _Mapping]]] = ..., columns: _Optional[_Union[AppendColumns, _Mapping]] = ...) -> None: ...

class Range(_message.Message):
    __slots__ = ("offset", "size")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    offset: int
    size: int
    def __init__(self, offset: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class ReadRecordsRequest(_message.Message):
    __slots__ = ("ranges",)
    RANGES_FIELD_NUMBER: _ClassVar[int]
    ranges: _containers.RepeatedCompositeFieldContainer[Range]
    def __init__(self, ranges: _Optional[_Iterable[_Union[Range, _Mapping]]] = ...) -> None: ...

class Record(_message.Message):
    __slots__ = ("offset", "data", "found", "corrupt")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    found: bool
    corrupt: _containers.RepeatedCompositeFieldContainer[CorruptRecord]
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ..., found: _Optional[bool] = ..., corrupt: _Optional[_Iterable[_Union[CorruptRecord, _Mapping]]] = ...) -> None: ...

class CorruptRecord(_message.Message):
    __slots__ = ("offset", "size", "reason")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    offset: int
    size: int
    reason: str
    def __init__(self, offset: _Optional[int] = ..., size: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ReadRecordsResponse(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[Record]
    def __init__(self, records: _Optional[_Iterable[_Union[Record, _Mapping]]] = ...) -> None: ...

class ReadRawRequest(_message.Message):
    __slots__ = ("offset", "max_bytes", "flushed_only")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    FLUSHED_ONLY_FIELD_NUMBER: _ClassVar[int]
    offset: int
    max_bytes: int
    flushed_only: bool
    def __init__(self, offset: _Optional[int] = ..., max_bytes: _Optional[int] = ..., flushed_only: _Optional[bool] = ...) -> None: ...

class ReadRawResponse(_message.Message):
    __slots__ = ("offset", "data", "max_offset")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    max_offset: int
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ..., max_offset: _Optional[int] = ...) -> None: ...

class TailRequest(_message.Message):
    __slots__ = ("from_offset", "max_chunk_bytes", "flushed_only")
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    FLUSHED_ONLY_FIELD_NUMBER: _ClassVar[int]
    from_offset: int
    max_chunk_bytes: int
    flushed_only: bool
    def __init__(self, from_offset: _Optional[int] = ..., max_chunk_bytes: _Optional[int] = ..., flushed_only: _Optional[bool] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("offset", "data", "max_offset")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    max_offset: int
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ..., max_offset: _Optional[int] = ...) -> None: ...

class GetOffsetsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Offsets(_message.Message):
    __slots__ = ("min_offset", "max_offset", "flushed_offset", "committed_offset", "recovered_offset", "instance_id")
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    FLUSHED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RECOVERED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    min_offset: int
    max_offset: int
    flushed_offset: int
    committed_offset: int
    recovered_offset: int
    instance_id: str
    def __init__(self, min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., flushed_offset: _Optional[int] = ..., committed_offset: _Optional[int] = ..., recovered_offset: _Optional[int] = ..., instance_id: _Optional[str] = ...) -> None: ...

class FlushRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeleteExpiredFilesRequest(_message.Message):
    __slots__ = ("force",)
    FORCE_FIELD_NUMBER: _ClassVar[int]
    force: bool
    def __init__(self, force: _Optional[bool] = ...) -> None: ...

class DeleteExpiredFilesResponse(_message.Message):
    __slots__ = ("deleted_files", "min_offset")
    DELETED_FILES_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    deleted_files: int
    min_offset: int
    def __init__(self, deleted_files: _Optional[int] = ..., min_offset: _Optional[int] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("stats", "offsets")
    class StatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    stats: _containers.ScalarMap[str, str]
    offsets: Offsets
    def __init__(self, stats: _Optional[_Mapping[str, str]] = ..., offsets: _Optional[_Union[Offsets, _Mapping]] = ...) -> None: ...

class AppendDataRequest(_message.Message):
    __slots__ = ("offset", "data", "master_max_offset", "replication_error")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MASTER_MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_ERROR_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    master_max_offset: int
    replication_error: str
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ..., master_max_offset: _Optional[int] = ..., replication_error: _Optional[str] = ...) -> None: ...

class AppendDataResponse(_message.Message):
    __slots__ = ("max_offset",)
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    max_offset: int
    def __init__(self, max_offset: _Optional[int] = ...) -> None: ...

class SlaveAck(_message.Message):
    __slots__ = ("connection_id", "slave_address", "acked_offset", "connected", "gateway_endpoint", "slave_error")
    CONNECTION_ID_FIELD_NUMBER: _ClassVar[int]
    SLAVE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ACKED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    SLAVE_ERROR_FIELD_NUMBER: _ClassVar[int]
    connection_id: str
    slave_address: str
    acked_offset: int
    connected: bool
    gateway_endpoint: str
    slave_error: str
    def __init__(self, connection_id: _Optional[str] = ..., slave_address: _Optional[str] = ..., acked_offset: _Optional[int] = ..., connected: _Optional[bool] = ..., gateway_endpoint: _Optional[str] = ..., slave_error: _Optional[str] = ...) -> None: ...

class ReportSlaveAcksResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SetLogicsErrorRequest(_message.Message):
    __slots__ = ("error", "reason")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    error: bool
    reason: str
    def __init__(self, error: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class SetLogicsErrorResponse(_message.Message):
    __slots__ = ("writable", "not_writable_reason")
    WRITABLE_FIELD_NUMBER: _ClassVar[int]
    NOT_WRITABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    writable: bool
    not_writable_reason: str
    def __init__(self, writable: _Optional[bool] = ..., not_writable_reason: _Optional[str] = ...) -> None: ...

class SetRetentionFloorRequest(_message.Message):
    __slots__ = ("dispatched_offset", "consumed_offset", "held_by")
    DISPATCHED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HELD_BY_FIELD_NUMBER: _ClassVar[int]
    dispatched_offset: int
    consumed_offset: int
    held_by: str
    def __init__(self, dispatched_offset: _Optional[int] = ..., consumed_offset: _Optional[int] = ..., held_by: _Optional[str] = ...) -> None: ...

class SetRetentionFloorResponse(_message.Message):
    __slots__ = ("min_offset",)
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    min_offset: int
    def __init__(self, min_offset: _Optional[int] = ...) -> None: ...
