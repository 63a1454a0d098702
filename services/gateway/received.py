"""Stored records as the client receives them (``ReceivedMessage``), shared by pulls and queries."""

from __future__ import annotations

from rocketstore.storage.codec import read_record_info
from rocketstore.storage.message import MessageExt, property_value
from rocketstore.v1 import gateway_pb2 as pb

__all__ = ["received", "tags_of"]


def received(m: MessageExt) -> pb.ReceivedMessage:
    props = m.properties
    return pb.ReceivedMessage(
        topic=m.topic, queue_id=m.queue_id, queue_offset=m.queue_offset, commit_log_offset=m.commitlog_offset,
        msg_id=props.get("UNIQ_KEY") or m.msg_id, offset_msg_id=m.msg_id, tags=props.get("TAGS", ""),
        keys=props.get("KEYS", ""), body=m.body, properties=props, born_timestamp=m.born_timestamp,
        born_host=m.born_host, store_timestamp=m.store_timestamp, store_host=m.store_host,
        reconsume_times=m.reconsume_times, sys_flag=m.sys_flag, flag=m.flag, store_size=m.store_size,
        body_crc=m.body_crc)


def tags_of(records: bytes, pos: int) -> str | None:
    """The TAGS property of the record at ``pos`` of ``records``, read without decoding the record."""
    return property_value(read_record_info(records, pos).properties_text, "TAGS")
