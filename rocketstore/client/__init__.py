"""The Python client of the rocketstore gateway: producer, consumers and admin.

    from rocketstore.client import Message, Producer, PushConsumer, ConsumeStatus

    with Producer("127.0.0.1:8081") as producer:
        result = producer.send(Message("TopicTest", b"hello", tags="TagA", keys="order-1"))

    consumer = PushConsumer("127.0.0.1:8081", "my_group", lambda msgs, ctx: ConsumeStatus.CONSUME_SUCCESS)
    consumer.subscribe("TopicTest", "TagA || TagB")
    consumer.start()
    ...
    consumer.shutdown()
"""

from rocketstore.rpc.tls import ClientTls

from .admin import Admin
from .auth_admin import AuthAdmin
from .consume_stream import ConsumeStream, StreamQueue
from .consumer_config import ConsumeFromWhere, MessageModel
from .errors import (
    ClientError,
    DeadlineExceededError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnavailableError,
)
from .listener import ConsumeContext, ConsumeOrderlyStatus, ConsumeStatus, MessageListener
from .messages import (
    Message,
    MessageQueue,
    PullResult,
    PullStatus,
    ReceivedMessage,
    SendResult,
    SendStatus,
    decode_records,
)
from .producer import Producer, SendCallback
from .pull_consumer import PullConsumer
from .push_consumer import PushConsumer
from .selector import HashSelector, QueueSelector, RandomSelector, RoundRobinSelector
from .signing import Credentials
from .transaction_producer import (
    LocalTransactionState,
    TransactionListener,
    TransactionMQProducer,
    TransactionSendResult,
)

__all__ = [
    "AuthAdmin",
    "Credentials",
    "Admin",
    "ClientError",
    "ClientTls",
    "ConsumeContext",
    "ConsumeFromWhere",
    "ConsumeOrderlyStatus",
    "ConsumeStatus",
    "ConsumeStream",
    "DeadlineExceededError",
    "HashSelector",
    "InvalidArgumentError",
    "LocalTransactionState",
    "Message",
    "MessageListener",
    "MessageModel",
    "MessageQueue",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "QueueSelector",
    "RandomSelector",
    "ReceivedMessage",
    "ResourceExhaustedError",
    "RoundRobinSelector",
    "SendCallback",
    "SendResult",
    "SendStatus",
    "StreamQueue",
    "TransactionListener",
    "TransactionMQProducer",
    "TransactionSendResult",
    "UnavailableError",
    "decode_records",
]
