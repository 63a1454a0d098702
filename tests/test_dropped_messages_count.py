"""The count of a CommitLog file's consumable messages, which the forced clean-up reports when it deletes
unconsumed ones: by topic and queue, IPv4 and IPv6 hosts alike, transaction halves left out."""

from __future__ import annotations

from rocketstore.services.commitlog.dropped_messages import count_file_messages

from rocketstore.storage.codec import encode_message
from rocketstore.storage.message import TRANSACTION_PREPARED_TYPE, Message


def test_messages_are_counted_by_topic_and_queue_whatever_their_hosts() -> None:
    records, offset = bytearray(), 0
    layout = [("Orders", 0, "10.0.0.1:1000", "127.0.0.1:10911", 0), ("Orders", 0, "[::1]:1000", "127.0.0.1:10911", 0),
              ("Orders", 1, "10.0.0.1:1000", "[::2]:10911", 0), ("Audit", 0, "[::1]:1000", "[::2]:10911", 0),
              ("Orders", 0, "10.0.0.1:1000", "127.0.0.1:10911", TRANSACTION_PREPARED_TYPE)]
    for queue_offset, (topic, queue_id, born, store, sys_flag) in enumerate(layout):
        record = encode_message(Message(topic, b"x" * 50, queue_id=queue_id, born_host=born, sys_flag=sys_flag),
                                queue_offset, offset, 1_700_000_000_000, store_host=store)
        records += record
        offset += len(record)
    records += bytes(64)  # the zeroed rest of the file
    assert count_file_messages(records, len(records)) == {
        ("Orders", 0): (0, 1, 2), ("Orders", 1): (2, 2, 1), ("Audit", 0): (3, 3, 1)}
