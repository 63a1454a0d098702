from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetMessageStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GET_FOUND: _ClassVar[GetMessageStatus]
    GET_NO_MATCHED_MESSAGE: _ClassVar[GetMessageStatus]
    GET_MESSAGE_WAS_REMOVING: _ClassVar[GetMessageStatus]
    GET_OFFSET_FOUND_NULL: _ClassVar[GetMessageStatus]
    GET_OFFSET_OVERFLOW_BADLY: _ClassVar[GetMessageStatus]
    GET_OFFSET_OVERFLOW_ONE: _ClassVar[GetMessageStatus]
    GET_OFFSET_TOO_SMALL: _ClassVar[GetMessageStatus]
    GET_NO_MATCHED_LOGIC_QUEUE: _ClassVar[GetMessageStatus]
    GET_NO_MESSAGE_IN_QUEUE: _ClassVar[GetMessageStatus]
GET_FOUND: GetMessageStatus
GET_NO_MATCHED_MESSAGE: GetMessageStatus
GET_MESSAGE_WAS_REMOVING: GetMessageStatus
GET_OFFSET_FOUND_NULL: GetMessageStatus
GET_OFFSET_OVERFLOW_BADLY: GetMessageStatus
GET_OFFSET_OVERFLOW_ONE: GetMessageStatus
GET_OFFSET_TOO_SMALL: GetMessageStatus
GET_NO_MATCHED_LOGIC_QUEUE: GetMessageStatus
GET_NO_MESSAGE_IN_QUEUE: GetMessageStatus

class DispatchBatch(_message.Message):
    __slots__ = ("topic", "queue_id", "queue_offset", "physical_offset", "size", "tags_code", "store_timestamp", "sys_flag", "keys", "uniq_key", "from_offset", "next_offset", "commitlog_max_offset", "lag_millis", "commitlog_instance_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PHYSICAL_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    TAGS_CODE_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    SYS_FLAG_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    UNIQ_KEY_FIELD_NUMBER: _ClassVar[int]
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_MILLIS_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    topic: _containers.RepeatedScalarFieldContainer[str]
    queue_id: _containers.RepeatedScalarFieldContainer[int]
    queue_offset: _containers.RepeatedScalarFieldContainer[int]
    physical_offset: _containers.RepeatedScalarFieldContainer[int]
    size: _containers.RepeatedScalarFieldContainer[int]
    tags_code: _containers.RepeatedScalarFieldContainer[int]
    store_timestamp: _containers.RepeatedScalarFieldContainer[int]
    sys_flag: _containers.RepeatedScalarFieldContainer[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    uniq_key: _containers.RepeatedScalarFieldContainer[str]
    from_offset: int
    next_offset: int
    commitlog_max_offset: int
    lag_millis: int
    commitlog_instance_id: str
    def __init__(self, topic: _Optional[_Iterable[str]] = ..., queue_id: _Optional[_Iterable[int]] = ..., queue_offset: _Optional[_Iterable[int]] = ..., physical_offset: _Optional[_Iterable[int]] = ..., size: _Optional[_Iterable[int]] = ..., tags_code: _Optional[_Iterable[int]] = ..., store_timestamp: _Optional[_Iterable[int]] = ..., sys_flag: _Optional[_Iterable[int]] = ..., keys: _Optional[_Iterable[str]] = ..., uniq_key: _Optional[_Iterable[str]] = ..., from_offset: _Optional[int] = ..., next_offset: _Optional[int] = ..., commitlog_max_offset: _Optional[int] = ..., lag_millis: _Optional[int] = ..., commitlog_instance_id: _Optional[str] = ...) -> None: ...

class DispatchAck(_message.Message):
    __slots__ = ("position",)
    POSITION_FIELD_NUMBER: _ClassVar[int]
    position: int
    def __init__(self, position: _Optional[int] = ...) -> None: ...

class GetPositionRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Position(_message.Message):
    __slots__ = ("position", "consume_queue_max_physical_offset", "index_end_physical_offset", "commitlog_instance_id")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    CONSUME_QUEUE_MAX_PHYSICAL_OFFSET_FIELD_NUMBER: _ClassVar[int]
    INDEX_END_PHYSICAL_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    position: int
    consume_queue_max_physical_offset: int
    index_end_physical_offset: int
    commitlog_instance_id: str
    def __init__(self, position: _Optional[int] = ..., consume_queue_max_physical_offset: _Optional[int] = ..., index_end_physical_offset: _Optional[int] = ..., commitlog_instance_id: _Optional[str] = ...) -> None: ...

class TruncateRequest(_message.Message):
    __slots__ = ("physical_offset", "commitlog_instance_id")
    PHYSICAL_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    physical_offset: int
    commitlog_instance_id: str
    def __init__(self, physical_offset: _Optional[int] = ..., commitlog_instance_id: _Optional[str] = ...) -> None: ...

class GetMessageRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "offset", "max_messages", "expression", "without_bodies", "max_bytes")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    WITHOUT_BODIES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    offset: int
    max_messages: int
    expression: str
    without_bodies: bool
    max_bytes: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., max_messages: _Optional[int] = ..., expression: _Optional[str] = ..., without_bodies: _Optional[bool] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class GetMessageResponse(_message.Message):
    __slots__ = ("status", "next_begin_offset", "min_offset", "max_offset", "suggest_pulling_from_slave", "records", "queue_offsets", "physical_offsets", "sizes")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NEXT_BEGIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SUGGEST_PULLING_FROM_SLAVE_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    PHYSICAL_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    suggest_pulling_from_slave: bool
    records: bytes
    queue_offsets: _containers.RepeatedScalarFieldContainer[int]
    physical_offsets: _containers.RepeatedScalarFieldContainer[int]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, status: _Optional[_Union[GetMessageStatus, str]] = ..., next_begin_offset: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., suggest_pulling_from_slave: _Optional[bool] = ..., records: _Optional[bytes] = ..., queue_offsets: _Optional[_Iterable[int]] = ..., physical_offsets: _Optional[_Iterable[int]] = ..., sizes: _Optional[_Iterable[int]] = ...) -> None: ...

class ReadQueueRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "start_offset", "end_offset", "expression", "batch_messages")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    BATCH_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    start_offset: int
    end_offset: int
    expression: str
    batch_messages: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., start_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., expression: _Optional[str] = ..., batch_messages: _Optional[int] = ...) -> None: ...

class ReadQueueBatch(_message.Message):
    __slots__ = ("records", "queue_offsets", "next_offset")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    records: bytes
    queue_offsets: _containers.RepeatedScalarFieldContainer[int]
    next_offset: int
    def __init__(self, records: _Optional[bytes] = ..., queue_offsets: _Optional[_Iterable[int]] = ..., next_offset: _Optional[int] = ...) -> None: ...

class GetQueueOffsetsRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class QueueOffset(_message.Message):
    __slots__ = ("topic", "queue_id", "min_offset", "max_offset", "last_store_timestamp")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_STORE_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_store_timestamp: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., last_store_timestamp: _Optional[int] = ...) -> None: ...

class GetQueueOffsetsResponse(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueOffset]
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueOffset, _Mapping]]] = ...) -> None: ...

class GetOffsetByTimeRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "timestamp")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    timestamp: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., timestamp: _Optional[int] = ...) -> None: ...

class GetOffsetByTimeResponse(_message.Message):
    __slots__ = ("offset",)
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    offset: int
    def __init__(self, offset: _Optional[int] = ...) -> None: ...

class QueryByKeyRequest(_message.Message):
    __slots__ = ("topic", "key", "max_messages", "begin_timestamp", "end_timestamp")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    BEGIN_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    END_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    topic: str
    key: str
    max_messages: int
    begin_timestamp: int
    end_timestamp: int
    def __init__(self, topic: _Optional[str] = ..., key: _Optional[str] = ..., max_messages: _Optional[int] = ..., begin_timestamp: _Optional[int] = ..., end_timestamp: _Optional[int] = ...) -> None: ...

class QueryByKeyResponse(_message.Message):
    __slots__ = ("records", "physical_offsets")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    PHYSICAL_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    records: bytes
    physical_offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, records: _Optional[bytes] = ..., physical_offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QueueAdvances(_message.Message):
    __slots__ = ("topic", "queue_id", "max_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: _containers.RepeatedScalarFieldContainer[str]
    queue_id: _containers.RepeatedScalarFieldContainer[int]
    max_offset: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[_Iterable[str]] = ..., queue_id: _Optional[_Iterable[int]] = ..., max_offset: _Optional[_Iterable[int]] = ...) -> None: ...

class DeleteTopicQueuesRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class DeleteTopicQueuesResponse(_message.Message):
    __slots__ = ("deleted_queues",)
    DELETED_QUEUES_FIELD_NUMBER: _ClassVar[int]
    deleted_queues: int
    def __init__(self, deleted_queues: _Optional[int] = ...) -> None: ...

class IndexStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class IndexStatsResponse(_message.Message):
    __slots__ = ("stats",)
    class StatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATS_FIELD_NUMBER: _ClassVar[int]
    stats: _containers.ScalarMap[str, str]
    def __init__(self, stats: _Optional[_Mapping[str, str]] = ...) -> None: ...
