"""Receipt handles as RocketMQ's proxy issues them (``ExtraInfoUtil.buildExtraInfo`` plus the CommitLog offset
the proxy appends): ``"<ck start offset> <pop time> <invisible ms> <revive qid> <topic type> <broker name>
<queue id> <queue offset> <commit log offset>"``, topic type 0 for the topic itself, 1 for the group's pop
retry topic (V1), and revive qid 999 for an ordered pop. The client treats the handle as opaque; the broker
checks every one against the checkpoints it holds open (``PopProcessor.find``)."""

from __future__ import annotations

import dataclasses

__all__ = ["ORDER_REVIVE_QID", "ReceiptHandle"]

ORDER_REVIVE_QID = 999  # KeyBuilder.POP_ORDER_REVIVE_QUEUE
_MAX_LENGTH = 1024


@dataclasses.dataclass(frozen=True)
class ReceiptHandle:
    start_offset: int
    pop_time: int
    invisible_ms: int
    revive_qid: int
    retry: bool
    broker_name: str
    queue_id: int
    offset: int
    commitlog_offset: int

    def encode(self) -> str:
        return (f"{self.start_offset} {self.pop_time} {self.invisible_ms} {self.revive_qid} {int(self.retry)} "
                f"{self.broker_name} {self.queue_id} {self.offset} {self.commitlog_offset}")

    @classmethod
    def decode(cls, text: str) -> ReceiptHandle:
        """Raises ValueError saying what is wrong with a handle that is not one."""
        if not text:
            raise ValueError("the receipt handle is empty")
        if len(text) > _MAX_LENGTH:
            raise ValueError(f"the receipt handle is {len(text)} characters: it is not one this broker issued")
        fields = text.split(" ")
        if len(fields) != 9:
            raise ValueError(f"the receipt handle has {len(fields)} fields, not 9: it is not one this broker issued")
        try:
            numbers = [int(fields[i]) for i in (0, 1, 2, 3, 4, 6, 7, 8)]
        except ValueError:
            raise ValueError("the receipt handle has a field that is not a number where one is expected") from None
        start, pop_time, invisible, revive_qid, kind, queue_id, offset, commitlog_offset = numbers
        if kind not in (0, 1):
            raise ValueError(f"the receipt handle's topic type is {kind}; expected 0 or 1")
        if min(start, pop_time, invisible, revive_qid, queue_id, offset, commitlog_offset) < 0:
            raise ValueError("the receipt handle has a negative offset, time or queue")
        return cls(start, pop_time, invisible, revive_qid, bool(kind), fields[5], queue_id, offset, commitlog_offset)
