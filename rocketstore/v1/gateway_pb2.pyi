from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SendStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEND_OK: _ClassVar[SendStatus]
    SEND_FLUSH_DISK_TIMEOUT: _ClassVar[SendStatus]
    SEND_FLUSH_SLAVE_TIMEOUT: _ClassVar[SendStatus]
    SEND_SLAVE_NOT_AVAILABLE: _ClassVar[SendStatus]

class PullStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PULL_FOUND: _ClassVar[PullStatus]
    PULL_NO_NEW_MSG: _ClassVar[PullStatus]
    PULL_NO_MATCHED_MSG: _ClassVar[PullStatus]
    PULL_OFFSET_ILLEGAL: _ClassVar[PullStatus]

class TransactionResolution(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSACTION_UNKNOWN: _ClassVar[TransactionResolution]
    TRANSACTION_COMMIT: _ClassVar[TransactionResolution]
    TRANSACTION_ROLLBACK: _ClassVar[TransactionResolution]
SEND_OK: SendStatus
SEND_FLUSH_DISK_TIMEOUT: SendStatus
SEND_FLUSH_SLAVE_TIMEOUT: SendStatus
SEND_SLAVE_NOT_AVAILABLE: SendStatus
PULL_FOUND: PullStatus
PULL_NO_NEW_MSG: PullStatus
PULL_NO_MATCHED_MSG: PullStatus
PULL_OFFSET_ILLEGAL: PullStatus
TRANSACTION_UNKNOWN: TransactionResolution
TRANSACTION_COMMIT: TransactionResolution
TRANSACTION_ROLLBACK: TransactionResolution

class OutgoingMessage(_message.Message):
    __slots__ = ("body", "tags", "keys", "properties", "flag", "born_timestamp", "born_host", "uniq_key", "delay_time_level", "timer_deliver_ms", "timer_delay_sec", "timer_delay_ms", "compressed")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BODY_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    BORN_HOST_FIELD_NUMBER: _ClassVar[int]
    UNIQ_KEY_FIELD_NUMBER: _ClassVar[int]
    DELAY_TIME_LEVEL_FIELD_NUMBER: _ClassVar[int]
    TIMER_DELIVER_MS_FIELD_NUMBER: _ClassVar[int]
    TIMER_DELAY_SEC_FIELD_NUMBER: _ClassVar[int]
    TIMER_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    COMPRESSED_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    tags: str
    keys: str
    properties: _containers.ScalarMap[str, str]
    flag: int
    born_timestamp: int
    born_host: str
    uniq_key: str
    delay_time_level: int
    timer_deliver_ms: int
    timer_delay_sec: int
    timer_delay_ms: int
    compressed: bool
    def __init__(self, body: _Optional[bytes] = ..., tags: _Optional[str] = ..., keys: _Optional[str] = ..., properties: _Optional[_Mapping[str, str]] = ..., flag: _Optional[int] = ..., born_timestamp: _Optional[int] = ..., born_host: _Optional[str] = ..., uniq_key: _Optional[str] = ..., delay_time_level: _Optional[int] = ..., timer_deliver_ms: _Optional[int] = ..., timer_delay_sec: _Optional[int] = ..., timer_delay_ms: _Optional[int] = ..., compressed: _Optional[bool] = ...) -> None: ...

class ReceivedMessage(_message.Message):
    __slots__ = ("topic", "queue_id", "queue_offset", "commit_log_offset", "msg_id", "offset_msg_id", "tags", "keys", "body", "properties", "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times", "sys_flag", "flag", "store_size", "body_crc")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_MSG_ID_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    BORN_HOST_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    STORE_HOST_FIELD_NUMBER: _ClassVar[int]
    RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    SYS_FLAG_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    STORE_SIZE_FIELD_NUMBER: _ClassVar[int]
    BODY_CRC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    msg_id: str
    offset_msg_id: str
    tags: str
    keys: str
    body: bytes
    properties: _containers.ScalarMap[str, str]
    born_timestamp: int
    born_host: str
    store_timestamp: int
    store_host: str
    reconsume_times: int
    sys_flag: int
    flag: int
    store_size: int
    body_crc: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., commit_log_offset: _Optional[int] = ..., msg_id: _Optional[str] = ..., offset_msg_id: _Optional[str] = ..., tags: _Optional[str] = ..., keys: _Optional[str] = ..., body: _Optional[bytes] = ..., properties: _Optional[_Mapping[str, str]] = ..., born_timestamp: _Optional[int] = ..., born_host: _Optional[str] = ..., store_timestamp: _Optional[int] = ..., store_host: _Optional[str] = ..., reconsume_times: _Optional[int] = ..., sys_flag: _Optional[int] = ..., flag: _Optional[int] = ..., store_size: _Optional[int] = ..., body_crc: _Optional[int] = ...) -> None: ...

class SendRequest(_message.Message):
    __slots__ = ("producer_group", "topic", "queue_id", "messages", "columnar_results", "transaction")
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    COLUMNAR_RESULTS_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    producer_group: str
    topic: str
    queue_id: int
    messages: _containers.RepeatedCompositeFieldContainer[OutgoingMessage]
    columnar_results: bool
    transaction: bool
    def __init__(self, producer_group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[OutgoingMessage, _Mapping]]] = ..., columnar_results: _Optional[bool] = ..., transaction: _Optional[bool] = ...) -> None: ...

class SendResult(_message.Message):
    __slots__ = ("status", "msg_id", "offset_msg_id", "queue_id", "queue_offset", "commit_log_offset", "store_timestamp", "topic")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_MSG_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    status: SendStatus
    msg_id: str
    offset_msg_id: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    store_timestamp: int
    topic: str
    def __init__(self, status: _Optional[_Union[SendStatus, str]] = ..., msg_id: _Optional[str] = ..., offset_msg_id: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., commit_log_offset: _Optional[int] = ..., store_timestamp: _Optional[int] = ..., topic: _Optional[str] = ...) -> None: ...

class SendColumns(_message.Message):
    __slots__ = ("statuses", "msg_ids", "offset_msg_id_prefix", "commit_log_offsets", "queue_offsets", "store_timestamp", "topic", "queue_id")
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    MSG_IDS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_MSG_ID_PREFIX_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LOG_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedScalarFieldContainer[SendStatus]
    msg_ids: _containers.RepeatedScalarFieldContainer[str]
    offset_msg_id_prefix: str
    commit_log_offsets: _containers.RepeatedScalarFieldContainer[int]
    queue_offsets: _containers.RepeatedScalarFieldContainer[int]
    store_timestamp: int
    topic: str
    queue_id: int
    def __init__(self, statuses: _Optional[_Iterable[_Union[SendStatus, str]]] = ..., msg_ids: _Optional[_Iterable[str]] = ..., offset_msg_id_prefix: _Optional[str] = ..., commit_log_offsets: _Optional[_Iterable[int]] = ..., queue_offsets: _Optional[_Iterable[int]] = ..., store_timestamp: _Optional[int] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ...) -> None: ...

class SendResponse(_message.Message):
    __slots__ = ("results", "columns")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SendResult]
    columns: SendColumns
    def __init__(self, results: _Optional[_Iterable[_Union[SendResult, _Mapping]]] = ..., columns: _Optional[_Union[SendColumns, _Mapping]] = ...) -> None: ...

class StreamedSend(_message.Message):
    __slots__ = ("request_id", "send", "timeout_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SEND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    send: SendRequest
    timeout_ms: int
    def __init__(self, request_id: _Optional[int] = ..., send: _Optional[_Union[SendRequest, _Mapping]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class SendStreamRequest(_message.Message):
    __slots__ = ("sends",)
    SENDS_FIELD_NUMBER: _ClassVar[int]
    sends: _containers.RepeatedCompositeFieldContainer[StreamedSend]
    def __init__(self, sends: _Optional[_Iterable[_Union[StreamedSend, _Mapping]]] = ...) -> None: ...

class StreamedSendResult(_message.Message):
    __slots__ = ("request_id", "response", "error_code", "error_message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    response: SendResponse
    error_code: int
    error_message: str
    def __init__(self, request_id: _Optional[int] = ..., response: _Optional[_Union[SendResponse, _Mapping]] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...

class SendStreamResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[StreamedSendResult]
    def __init__(self, results: _Optional[_Iterable[_Union[StreamedSendResult, _Mapping]]] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("consumer_group", "topic", "queue_id", "offset", "max_messages", "expression", "poll_timeout_ms", "raw_records", "commit_offset")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    POLL_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    RAW_RECORDS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    queue_id: int
    offset: int
    max_messages: int
    expression: str
    poll_timeout_ms: int
    raw_records: bool
    commit_offset: int
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., max_messages: _Optional[int] = ..., expression: _Optional[str] = ..., poll_timeout_ms: _Optional[int] = ..., raw_records: _Optional[bool] = ..., commit_offset: _Optional[int] = ...) -> None: ...

class PullResponse(_message.Message):
    __slots__ = ("status", "next_begin_offset", "min_offset", "max_offset", "messages", "records", "queue_offsets", "suggest_pulling_from_slave")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NEXT_BEGIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    SUGGEST_PULLING_FROM_SLAVE_FIELD_NUMBER: _ClassVar[int]
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: _containers.RepeatedCompositeFieldContainer[ReceivedMessage]
    records: bytes
    queue_offsets: _containers.RepeatedScalarFieldContainer[int]
    suggest_pulling_from_slave: bool
    def __init__(self, status: _Optional[_Union[PullStatus, str]] = ..., next_begin_offset: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[ReceivedMessage, _Mapping]]] = ..., records: _Optional[bytes] = ..., queue_offsets: _Optional[_Iterable[int]] = ..., suggest_pulling_from_slave: _Optional[bool] = ...) -> None: ...

class SubscriptionEntry(_message.Message):
    __slots__ = ("topic", "expression")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    expression: str
    def __init__(self, topic: _Optional[str] = ..., expression: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("client_id", "consumer_group", "subscriptions", "consume_type", "message_model")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    CONSUME_TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_MODEL_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    consumer_group: str
    subscriptions: _containers.RepeatedCompositeFieldContainer[SubscriptionEntry]
    consume_type: str
    message_model: str
    def __init__(self, client_id: _Optional[str] = ..., consumer_group: _Optional[str] = ..., subscriptions: _Optional[_Iterable[_Union[SubscriptionEntry, _Mapping]]] = ..., consume_type: _Optional[str] = ..., message_model: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("group_version",)
    GROUP_VERSION_FIELD_NUMBER: _ClassVar[int]
    group_version: int
    def __init__(self, group_version: _Optional[int] = ...) -> None: ...

class UnregisterRequest(_message.Message):
    __slots__ = ("client_id", "consumer_group")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    consumer_group: str
    def __init__(self, client_id: _Optional[str] = ..., consumer_group: _Optional[str] = ...) -> None: ...

class UnregisterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetAssignmentRequest(_message.Message):
    __slots__ = ("consumer_group", "client_id", "topic")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    client_id: str
    topic: str
    def __init__(self, consumer_group: _Optional[str] = ..., client_id: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("queue_ids", "group_version", "members")
    QUEUE_IDS_FIELD_NUMBER: _ClassVar[int]
    GROUP_VERSION_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    queue_ids: _containers.RepeatedScalarFieldContainer[int]
    group_version: int
    members: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, queue_ids: _Optional[_Iterable[int]] = ..., group_version: _Optional[int] = ..., members: _Optional[_Iterable[str]] = ...) -> None: ...

class OffsetEntry(_message.Message):
    __slots__ = ("topic", "queue_id", "offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    offset: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class CommitOffsetsRequest(_message.Message):
    __slots__ = ("consumer_group", "offsets")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    offsets: _containers.RepeatedCompositeFieldContainer[OffsetEntry]
    def __init__(self, consumer_group: _Optional[str] = ..., offsets: _Optional[_Iterable[_Union[OffsetEntry, _Mapping]]] = ...) -> None: ...

class CommitOffsetsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QueryOffsetsRequest(_message.Message):
    __slots__ = ("consumer_group", "topic")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class QueryOffsetsResponse(_message.Message):
    __slots__ = ("offsets",)
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.RepeatedCompositeFieldContainer[OffsetEntry]
    def __init__(self, offsets: _Optional[_Iterable[_Union[OffsetEntry, _Mapping]]] = ...) -> None: ...

class GetConsumerProgressRequest(_message.Message):
    __slots__ = ("consumer_group", "topic")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    topic: str
    def __init__(self, consumer_group: _Optional[str] = ..., topic: _Optional[str] = ...) -> None: ...

class QueueProgress(_message.Message):
    __slots__ = ("topic", "queue_id", "broker_offset", "consumer_offset", "lag", "last_store_timestamp")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    LAST_STORE_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    lag: int
    last_store_timestamp: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., broker_offset: _Optional[int] = ..., consumer_offset: _Optional[int] = ..., lag: _Optional[int] = ..., last_store_timestamp: _Optional[int] = ...) -> None: ...

class ConsumerProgress(_message.Message):
    __slots__ = ("consumer_group", "queues", "total_lag")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_LAG_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    queues: _containers.RepeatedCompositeFieldContainer[QueueProgress]
    total_lag: int
    def __init__(self, consumer_group: _Optional[str] = ..., queues: _Optional[_Iterable[_Union[QueueProgress, _Mapping]]] = ..., total_lag: _Optional[int] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GroupInfo(_message.Message):
    __slots__ = ("consumer_group", "members", "subscriptions", "group_version")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    GROUP_VERSION_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    members: _containers.RepeatedScalarFieldContainer[str]
    subscriptions: _containers.RepeatedCompositeFieldContainer[SubscriptionEntry]
    group_version: int
    def __init__(self, consumer_group: _Optional[str] = ..., members: _Optional[_Iterable[str]] = ..., subscriptions: _Optional[_Iterable[_Union[SubscriptionEntry, _Mapping]]] = ..., group_version: _Optional[int] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupInfo]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupInfo, _Mapping]]] = ...) -> None: ...

class QueryMessageRequest(_message.Message):
    __slots__ = ("offset_msg_id", "msg_id", "key", "queue_offset", "topic", "queue_id", "begin_timestamp", "end_timestamp", "max_messages")
    OFFSET_MSG_ID_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    BEGIN_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    END_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    offset_msg_id: str
    msg_id: str
    key: str
    queue_offset: int
    topic: str
    queue_id: int
    begin_timestamp: int
    end_timestamp: int
    max_messages: int
    def __init__(self, offset_msg_id: _Optional[str] = ..., msg_id: _Optional[str] = ..., key: _Optional[str] = ..., queue_offset: _Optional[int] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., begin_timestamp: _Optional[int] = ..., end_timestamp: _Optional[int] = ..., max_messages: _Optional[int] = ...) -> None: ...

class QueryMessageResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ReceivedMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ReceivedMessage, _Mapping]]] = ...) -> None: ...

class TopicInfo(_message.Message):
    __slots__ = ("topic", "read_queue_nums", "write_queue_nums", "perm", "order", "system", "message_type")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    READ_QUEUE_NUMS_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUEUE_NUMS_FIELD_NUMBER: _ClassVar[int]
    PERM_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    order: bool
    system: bool
    message_type: str
    def __init__(self, topic: _Optional[str] = ..., read_queue_nums: _Optional[int] = ..., write_queue_nums: _Optional[int] = ..., perm: _Optional[int] = ..., order: _Optional[bool] = ..., system: _Optional[bool] = ..., message_type: _Optional[str] = ...) -> None: ...

class CreateTopicRequest(_message.Message):
    __slots__ = ("topic", "read_queue_nums", "write_queue_nums", "perm", "order", "message_type")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    READ_QUEUE_NUMS_FIELD_NUMBER: _ClassVar[int]
    WRITE_QUEUE_NUMS_FIELD_NUMBER: _ClassVar[int]
    PERM_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    order: bool
    message_type: str
    def __init__(self, topic: _Optional[str] = ..., read_queue_nums: _Optional[int] = ..., write_queue_nums: _Optional[int] = ..., perm: _Optional[int] = ..., order: _Optional[bool] = ..., message_type: _Optional[str] = ...) -> None: ...

class DeleteTopicRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class DeleteTopicResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ("include_system",)
    INCLUDE_SYSTEM_FIELD_NUMBER: _ClassVar[int]
    include_system: bool
    def __init__(self, include_system: _Optional[bool] = ...) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicInfo]
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicInfo, _Mapping]]] = ...) -> None: ...

class GetTopicStatsRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class QueueStats(_message.Message):
    __slots__ = ("queue_id", "min_offset", "max_offset", "last_store_timestamp")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_STORE_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    min_offset: int
    max_offset: int
    last_store_timestamp: int
    def __init__(self, queue_id: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., last_store_timestamp: _Optional[int] = ...) -> None: ...

class TopicStats(_message.Message):
    __slots__ = ("topic", "queues")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    topic: TopicInfo
    queues: _containers.RepeatedCompositeFieldContainer[QueueStats]
    def __init__(self, topic: _Optional[_Union[TopicInfo, _Mapping]] = ..., queues: _Optional[_Iterable[_Union[QueueStats, _Mapping]]] = ...) -> None: ...

class GetBrokerStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BrokerStatus(_message.Message):
    __slots__ = ("broker_name", "broker_role", "flush_disk_type", "put_tps", "get_tps", "put_messages", "get_messages", "put_bytes", "commitlog_min_offset", "commitlog_max_offset", "dispatch_behind_bytes", "dispatch_behind_millis", "disk_used_ratio", "stats", "slave_gateways")
    class StatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BROKER_NAME_FIELD_NUMBER: _ClassVar[int]
    BROKER_ROLE_FIELD_NUMBER: _ClassVar[int]
    FLUSH_DISK_TYPE_FIELD_NUMBER: _ClassVar[int]
    PUT_TPS_FIELD_NUMBER: _ClassVar[int]
    GET_TPS_FIELD_NUMBER: _ClassVar[int]
    PUT_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    GET_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_BEHIND_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_BEHIND_MILLIS_FIELD_NUMBER: _ClassVar[int]
    DISK_USED_RATIO_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    SLAVE_GATEWAYS_FIELD_NUMBER: _ClassVar[int]
    broker_name: str
    broker_role: str
    flush_disk_type: str
    put_tps: float
    get_tps: float
    put_messages: int
    get_messages: int
    put_bytes: int
    commitlog_min_offset: int
    commitlog_max_offset: int
    dispatch_behind_bytes: int
    dispatch_behind_millis: int
    disk_used_ratio: float
    stats: _containers.ScalarMap[str, str]
    slave_gateways: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, broker_name: _Optional[str] = ..., broker_role: _Optional[str] = ..., flush_disk_type: _Optional[str] = ..., put_tps: _Optional[float] = ..., get_tps: _Optional[float] = ..., put_messages: _Optional[int] = ..., get_messages: _Optional[int] = ..., put_bytes: _Optional[int] = ..., commitlog_min_offset: _Optional[int] = ..., commitlog_max_offset: _Optional[int] = ..., dispatch_behind_bytes: _Optional[int] = ..., dispatch_behind_millis: _Optional[int] = ..., disk_used_ratio: _Optional[float] = ..., stats: _Optional[_Mapping[str, str]] = ..., slave_gateways: _Optional[_Iterable[str]] = ...) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ("topics", "topic_pattern", "start_timestamp", "end_timestamp")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_PATTERN_FIELD_NUMBER: _ClassVar[int]
    START_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    END_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    topic_pattern: str
    start_timestamp: int
    end_timestamp: int
    def __init__(self, topics: _Optional[_Iterable[str]] = ..., topic_pattern: _Optional[str] = ..., start_timestamp: _Optional[int] = ..., end_timestamp: _Optional[int] = ...) -> None: ...

class QueueRange(_message.Message):
    __slots__ = ("topic", "queue_id", "min_offset", "max_offset", "start_offset_by_time", "end_offset_by_time")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_BY_TIME_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_BY_TIME_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    start_offset_by_time: int
    end_offset_by_time: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., start_offset_by_time: _Optional[int] = ..., end_offset_by_time: _Optional[int] = ...) -> None: ...

class ListQueuesResponse(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueRange]
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueRange, _Mapping]]] = ...) -> None: ...

class BatchReadRequest(_message.Message):
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

class RecordBatch(_message.Message):
    __slots__ = ("records", "queue_offsets", "next_offset")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    records: bytes
    queue_offsets: _containers.RepeatedScalarFieldContainer[int]
    next_offset: int
    def __init__(self, records: _Optional[bytes] = ..., queue_offsets: _Optional[_Iterable[int]] = ..., next_offset: _Optional[int] = ...) -> None: ...

class ConsumerSendBackRequest(_message.Message):
    __slots__ = ("consumer_group", "commit_log_offset", "delay_level", "max_reconsume_times")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DELAY_LEVEL_FIELD_NUMBER: _ClassVar[int]
    MAX_RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    commit_log_offset: int
    delay_level: int
    max_reconsume_times: int
    def __init__(self, consumer_group: _Optional[str] = ..., commit_log_offset: _Optional[int] = ..., delay_level: _Optional[int] = ..., max_reconsume_times: _Optional[int] = ...) -> None: ...

class ConsumerSendBackResponse(_message.Message):
    __slots__ = ("topic", "reconsume_times", "delay_level", "msg_id", "commit_log_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECONSUME_TIMES_FIELD_NUMBER: _ClassVar[int]
    DELAY_LEVEL_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    reconsume_times: int
    delay_level: int
    msg_id: str
    commit_log_offset: int
    def __init__(self, topic: _Optional[str] = ..., reconsume_times: _Optional[int] = ..., delay_level: _Optional[int] = ..., msg_id: _Optional[str] = ..., commit_log_offset: _Optional[int] = ...) -> None: ...

class EndTransactionRequest(_message.Message):
    __slots__ = ("producer_group", "transaction_id", "commit_log_offset", "queue_offset", "resolution", "from_transaction_check", "by_operator")
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    FROM_TRANSACTION_CHECK_FIELD_NUMBER: _ClassVar[int]
    BY_OPERATOR_FIELD_NUMBER: _ClassVar[int]
    producer_group: str
    transaction_id: str
    commit_log_offset: int
    queue_offset: int
    resolution: TransactionResolution
    from_transaction_check: bool
    by_operator: bool
    def __init__(self, producer_group: _Optional[str] = ..., transaction_id: _Optional[str] = ..., commit_log_offset: _Optional[int] = ..., queue_offset: _Optional[int] = ..., resolution: _Optional[_Union[TransactionResolution, str]] = ..., from_transaction_check: _Optional[bool] = ..., by_operator: _Optional[bool] = ...) -> None: ...

class EndTransactionResponse(_message.Message):
    __slots__ = ("msg_id", "commit_log_offset", "queue_offset", "topic", "queue_id")
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    msg_id: str
    commit_log_offset: int
    queue_offset: int
    topic: str
    queue_id: int
    def __init__(self, msg_id: _Optional[str] = ..., commit_log_offset: _Optional[int] = ..., queue_offset: _Optional[int] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ...) -> None: ...

class TransactionChecksRequest(_message.Message):
    __slots__ = ("producer_group", "client_id")
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    producer_group: str
    client_id: str
    def __init__(self, producer_group: _Optional[str] = ..., client_id: _Optional[str] = ...) -> None: ...

class TransactionCheck(_message.Message):
    __slots__ = ("message", "transaction_id", "commit_log_offset", "queue_offset")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    message: ReceivedMessage
    transaction_id: str
    commit_log_offset: int
    queue_offset: int
    def __init__(self, message: _Optional[_Union[ReceivedMessage, _Mapping]] = ..., transaction_id: _Optional[str] = ..., commit_log_offset: _Optional[int] = ..., queue_offset: _Optional[int] = ...) -> None: ...

class ListTransactionsRequest(_message.Message):
    __slots__ = ("producer_group",)
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    producer_group: str
    def __init__(self, producer_group: _Optional[str] = ...) -> None: ...

class PendingTransaction(_message.Message):
    __slots__ = ("transaction_id", "producer_group", "topic", "queue_id", "commit_log_offset", "queue_offset", "age_ms", "check_times", "tags", "keys")
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    AGE_MS_FIELD_NUMBER: _ClassVar[int]
    CHECK_TIMES_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    transaction_id: str
    producer_group: str
    topic: str
    queue_id: int
    commit_log_offset: int
    queue_offset: int
    age_ms: int
    check_times: int
    tags: str
    keys: str
    def __init__(self, transaction_id: _Optional[str] = ..., producer_group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., commit_log_offset: _Optional[int] = ..., queue_offset: _Optional[int] = ..., age_ms: _Optional[int] = ..., check_times: _Optional[int] = ..., tags: _Optional[str] = ..., keys: _Optional[str] = ...) -> None: ...

class ListTransactionsResponse(_message.Message):
    __slots__ = ("transactions",)
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    transactions: _containers.RepeatedCompositeFieldContainer[PendingTransaction]
    def __init__(self, transactions: _Optional[_Iterable[_Union[PendingTransaction, _Mapping]]] = ...) -> None: ...

class SubscriptionGroup(_message.Message):
    __slots__ = ("group_name", "consume_enable", "consume_from_min_enable", "consume_broadcast_enable", "retry_queue_nums", "retry_max_times", "broker_id", "which_broker_when_consume_slowly", "notify_consumer_ids_changed_enable", "consume_message_orderly", "group_retry_policy")
    GROUP_NAME_FIELD_NUMBER: _ClassVar[int]
    CONSUME_ENABLE_FIELD_NUMBER: _ClassVar[int]
    CONSUME_FROM_MIN_ENABLE_FIELD_NUMBER: _ClassVar[int]
    CONSUME_BROADCAST_ENABLE_FIELD_NUMBER: _ClassVar[int]
    RETRY_QUEUE_NUMS_FIELD_NUMBER: _ClassVar[int]
    RETRY_MAX_TIMES_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    WHICH_BROKER_WHEN_CONSUME_SLOWLY_FIELD_NUMBER: _ClassVar[int]
    NOTIFY_CONSUMER_IDS_CHANGED_ENABLE_FIELD_NUMBER: _ClassVar[int]
    CONSUME_MESSAGE_ORDERLY_FIELD_NUMBER: _ClassVar[int]
    GROUP_RETRY_POLICY_FIELD_NUMBER: _ClassVar[int]
    group_name: str
    consume_enable: bool
    consume_from_min_enable: bool
    consume_broadcast_enable: bool
    retry_queue_nums: int
    retry_max_times: int
    broker_id: int
    which_broker_when_consume_slowly: int
    notify_consumer_ids_changed_enable: bool
    consume_message_orderly: bool
    group_retry_policy: str
    def __init__(self, group_name: _Optional[str] = ..., consume_enable: _Optional[bool] = ..., consume_from_min_enable: _Optional[bool] = ..., consume_broadcast_enable: _Optional[bool] = ..., retry_queue_nums: _Optional[int] = ..., retry_max_times: _Optional[int] = ..., broker_id: _Optional[int] = ..., which_broker_when_consume_slowly: _Optional[int] = ..., notify_consumer_ids_changed_enable: _Optional[bool] = ..., consume_message_orderly: _Optional[bool] = ..., group_retry_policy: _Optional[str] = ...) -> None: ...

class GetClientThreadStackRequest(_message.Message):
    __slots__ = ("client_id", "timeout_ms")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    timeout_ms: int
    def __init__(self, client_id: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ClientThreadStack(_message.Message):
    __slots__ = ("client_id", "thread_stack")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    THREAD_STACK_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    thread_stack: str
    def __init__(self, client_id: _Optional[str] = ..., thread_stack: _Optional[str] = ...) -> None: ...

class ConsumeMessageDirectlyRequest(_message.Message):
    __slots__ = ("client_id", "topic", "msg_id", "timeout_ms")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    topic: str
    msg_id: str
    timeout_ms: int
    def __init__(self, client_id: _Optional[str] = ..., topic: _Optional[str] = ..., msg_id: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ConsumeMessageDirectlyResult(_message.Message):
    __slots__ = ("consume_result", "remark")
    CONSUME_RESULT_FIELD_NUMBER: _ClassVar[int]
    REMARK_FIELD_NUMBER: _ClassVar[int]
    consume_result: str
    remark: str
    def __init__(self, consume_result: _Optional[str] = ..., remark: _Optional[str] = ...) -> None: ...

class GetSubscriptionGroupRequest(_message.Message):
    __slots__ = ("group_name",)
    GROUP_NAME_FIELD_NUMBER: _ClassVar[int]
    group_name: str
    def __init__(self, group_name: _Optional[str] = ...) -> None: ...

class ListSubscriptionGroupsRequest(_message.Message):
    __slots__ = ("include_system",)
    INCLUDE_SYSTEM_FIELD_NUMBER: _ClassVar[int]
    include_system: bool
    def __init__(self, include_system: _Optional[bool] = ...) -> None: ...

class ListSubscriptionGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[SubscriptionGroup]
    def __init__(self, groups: _Optional[_Iterable[_Union[SubscriptionGroup, _Mapping]]] = ...) -> None: ...

class DeleteSubscriptionGroupRequest(_message.Message):
    __slots__ = ("group_name",)
    GROUP_NAME_FIELD_NUMBER: _ClassVar[int]
    group_name: str
    def __init__(self, group_name: _Optional[str] = ...) -> None: ...

class DeleteSubscriptionGroupResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListDeadLettersRequest(_message.Message):
    __slots__ = ("consumer_group", "offset", "max_messages")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    offset: int
    max_messages: int
    def __init__(self, consumer_group: _Optional[str] = ..., offset: _Optional[int] = ..., max_messages: _Optional[int] = ...) -> None: ...

class ListDeadLettersResponse(_message.Message):
    __slots__ = ("messages", "next_offset", "min_offset", "max_offset")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ReceivedMessage]
    next_offset: int
    min_offset: int
    max_offset: int
    def __init__(self, messages: _Optional[_Iterable[_Union[ReceivedMessage, _Mapping]]] = ..., next_offset: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ...) -> None: ...

class ResendDeadLetterRequest(_message.Message):
    __slots__ = ("consumer_group", "commit_log_offset")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    commit_log_offset: int
    def __init__(self, consumer_group: _Optional[str] = ..., commit_log_offset: _Optional[int] = ...) -> None: ...

class ResendDeadLetterResponse(_message.Message):
    __slots__ = ("topic", "queue_id", "msg_id", "commit_log_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    msg_id: str
    commit_log_offset: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., msg_id: _Optional[str] = ..., commit_log_offset: _Optional[int] = ...) -> None: ...

class ConsumeRequest(_message.Message):
    __slots__ = ("open", "assign", "unassign", "credit")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    ASSIGN_FIELD_NUMBER: _ClassVar[int]
    UNASSIGN_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    open: ConsumeOpen
    assign: ConsumeAssign
    unassign: ConsumeUnassign
    credit: ConsumeCredit
    def __init__(self, open: _Optional[_Union[ConsumeOpen, _Mapping]] = ..., assign: _Optional[_Union[ConsumeAssign, _Mapping]] = ..., unassign: _Optional[_Union[ConsumeUnassign, _Mapping]] = ..., credit: _Optional[_Union[ConsumeCredit, _Mapping]] = ...) -> None: ...

class ConsumeOpen(_message.Message):
    __slots__ = ("consumer_group", "client_id")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    consumer_group: str
    client_id: str
    def __init__(self, consumer_group: _Optional[str] = ..., client_id: _Optional[str] = ...) -> None: ...

class StreamQueue(_message.Message):
    __slots__ = ("assign_id", "topic", "queue_id", "offset", "expression")
    ASSIGN_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    assign_id: int
    topic: str
    queue_id: int
    offset: int
    expression: str
    def __init__(self, assign_id: _Optional[int] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., expression: _Optional[str] = ...) -> None: ...

class ConsumeAssign(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[StreamQueue]
    def __init__(self, queues: _Optional[_Iterable[_Union[StreamQueue, _Mapping]]] = ...) -> None: ...

class ConsumeUnassign(_message.Message):
    __slots__ = ("assign_ids",)
    ASSIGN_IDS_FIELD_NUMBER: _ClassVar[int]
    assign_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, assign_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ConsumeCredit(_message.Message):
    __slots__ = ("messages", "bytes")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    messages: int
    bytes: int
    def __init__(self, messages: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class ConsumeBatch(_message.Message):
    __slots__ = ("assign_id", "topic", "queue_id", "records", "queue_offsets", "sizes", "next_offset", "offset_reset", "max_offset", "suggest_pulling_from_slave")
    ASSIGN_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    OFFSET_RESET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SUGGEST_PULLING_FROM_SLAVE_FIELD_NUMBER: _ClassVar[int]
    assign_id: int
    topic: str
    queue_id: int
    records: bytes
    queue_offsets: _containers.RepeatedScalarFieldContainer[int]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    next_offset: int
    offset_reset: bool
    max_offset: int
    suggest_pulling_from_slave: bool
    def __init__(self, assign_id: _Optional[int] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., records: _Optional[bytes] = ..., queue_offsets: _Optional[_Iterable[int]] = ..., sizes: _Optional[_Iterable[int]] = ..., next_offset: _Optional[int] = ..., offset_reset: _Optional[bool] = ..., max_offset: _Optional[int] = ..., suggest_pulling_from_slave: _Optional[bool] = ...) -> None: ...
