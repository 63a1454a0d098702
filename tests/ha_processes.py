"""Real-process master/slave brokers for the HA integration tests: a ``Broker`` (CommitLog, index,
dispatcher, optionally the gateway) and its ``rocketstore serve ha`` process over one data directory,
and the reads the tests compare brokers with. Import explicitly: ``from ha_processes import HABroker``."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from conftest import DEFAULT_BROKER_SETTINGS, RPC_TIMEOUT, Broker, PartOfBroker, ServiceProcess
from rocketstore.services.ha.client import HAClient, HAStatus

from rocketstore.storage.codec import decode_message
from rocketstore.storage.message import MessageExt
from rocketstore.v1 import commitlog_pb2 as cl_pb
from rocketstore.v1 import index_pb2 as ix_pb

FILE_SIZE = int(DEFAULT_BROKER_SETTINGS["mapedFileSizeCommitLog"])


class HAProcess(ServiceProcess):
    service = "ha"
    health_service = "rocketstore.v1.HA"
    client: HAClient | None = None

    def _make_stubs(self, channel) -> None:  # noqa: ANN001
        self.client = HAClient(self.endpoint, channel=channel)


class LocalHA(PartOfBroker, HAProcess):
    """Local mode: the ha service inside the broker process."""


class HABroker:
    """A Broker and its ha process; ``set(...)`` changes the settings every process restarts with."""

    def __init__(self, data_dir: Path, overrides: dict[str, str], log_dir: Path, ha_port: int | None = None,
                 with_gateway: bool = False) -> None:
        self.data_dir = data_dir
        self.broker = Broker(data_dir, overrides, log_dir, with_gateway=with_gateway)
        gateway = self.broker.gateway
        owner = self.broker.process
        if owner is not None:  # local mode: the broker process serves its ha service itself
            if ha_port:
                owner.ha_port, owner.ha_port_fixed = ha_port, True
            self.ha: HAProcess = LocalHA(data_dir, overrides, log_dir, port=1).join(
                owner, lambda p: f"127.0.0.1:{p.ha_port}")
            return
        self.ha = HAProcess(data_dir, overrides, log_dir, port=ha_port,
                            peers={"commitlog": self.broker.commitlog.endpoint,
                                   **({"gateway": gateway.endpoint} if gateway is not None else {})})

    @property
    def processes(self) -> list[ServiceProcess]:
        return [*self.broker.processes, self.ha]

    def start(self) -> HABroker:
        for p in self.processes:
            p.launch()
        for p in self.processes:
            p.wait_serving()
        return self

    def set(self, **overrides: str) -> None:
        for p in self.processes:
            p.overrides.update(overrides)

    def kill9(self) -> None:
        for p in self.processes:
            p.kill9()

    def terminate(self) -> None:
        for p in reversed(self.processes):
            code = p.terminate()
            assert code == 0, f"{p.service} exited with {code} on SIGTERM:\n{p.log_tail()}"

    def restart(self) -> HABroker:
        for p in self.processes:
            p.launch()
        for p in self.processes:
            p.wait_serving()
        return self

    def signal_all(self, sig: signal.Signals) -> None:
        """SIGSTOP / SIGCONT every process of the broker (a paused machine)."""
        for p in self.processes:
            assert p.proc is not None
            os.kill(p.proc.pid, sig)

    def close(self) -> list[str]:
        failures = []
        for p in reversed(self.processes):
            if p.proc is not None and p.proc.poll() is None:
                os.kill(p.proc.pid, signal.SIGCONT)  # a paused process cannot act on SIGTERM
            code = p.close()
            if code not in (None, 0):
                failures.append(f"{p.service} exited with {code} on SIGTERM:\n{p.log_tail()}")
        return failures

    def offsets(self) -> cl_pb.Offsets:
        return self.broker.commitlog.stub.GetOffsets(cl_pb.GetOffsetsRequest(), timeout=RPC_TIMEOUT)

    def stats(self) -> dict[str, str]:
        return dict(self.broker.commitlog.stub.GetStats(cl_pb.GetStatsRequest(), timeout=RPC_TIMEOUT).stats)

    def ha_status(self) -> HAStatus:
        assert self.ha.client is not None
        return self.ha.client.status(timeout=RPC_TIMEOUT)

    def append(self, messages: list[cl_pb.Message], timeout: float = RPC_TIMEOUT) -> list[cl_pb.AppendResult]:
        return list(self.broker.commitlog.stub.AppendBatch(cl_pb.AppendBatchRequest(messages=messages),
                                                           timeout=timeout).results)

    def dispatched(self) -> bool:
        """The index holds everything the CommitLog does (dispatch is caught up)."""
        stats = dict(self.broker.index.stub.GetStats(ix_pb.IndexStatsRequest(), timeout=RPC_TIMEOUT).stats)
        return int(stats["dispatchPosition"]) >= self.offsets().max_offset


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def messages(n: int, tag: str, topics: int = 2, queues: int = 4) -> list[cl_pb.Message]:
    return [cl_pb.Message(topic=f"HaTopic{i % topics}", queue_id=i % queues, body=f"{tag}-{i}".encode() * 100,
                          properties={"TAGS": tag, "KEYS": f"{tag}-{i}"}) for i in range(n)]


def commitlog_bytes(root: Path, start: int, end: int, file_size: int = FILE_SIZE) -> bytes:
    """The CommitLog bytes [start, end) read from the files on disk."""
    out = bytearray()
    at = start
    while at < end:
        base = at - at % file_size
        with open(root / "commitlog" / f"{base:020d}", "rb") as f:
            f.seek(at - base)
            out += f.read(min(end, base + file_size) - at)
        at = base + file_size
    return bytes(out)


def queues(b: HABroker) -> dict[tuple[str, int], list[tuple[tuple[int, ...], bytes]]]:
    """Every queue's (queue offsets, records) batches, read back through the broker's index."""
    stub = b.broker.index.stub
    out = {}
    for q in stub.GetQueueOffsets(ix_pb.GetQueueOffsetsRequest(), timeout=RPC_TIMEOUT).queues:
        units = []
        for batch in stub.ReadQueue(ix_pb.ReadQueueRequest(topic=q.topic, queue_id=q.queue_id,
                                                           start_offset=q.min_offset), timeout=RPC_TIMEOUT):
            units.append((tuple(batch.queue_offsets), batch.records))
        out[(q.topic, q.queue_id)] = units
    return out


def consumed(b: HABroker) -> dict[tuple[str, int, int], MessageExt]:
    """Every message the broker's index serves, by (topic, queue id, queue offset), decoded with its
    body CRC checked."""
    out = {}
    for (topic, queue_id), batches in queues(b).items():
        for offsets, records in batches:
            pos = 0
            for queue_offset in offsets:
                msg = decode_message(records, pos, check_crc=True)
                assert (msg.topic, msg.queue_id, msg.queue_offset) == (topic, queue_id, queue_offset)
                out[(topic, queue_id, queue_offset)] = msg
                pos += msg.store_size
            assert pos == len(records)
    return out


def assert_replicated(master: HABroker, slave: HABroker, timeout: float = 60) -> None:
    """The slave caught up: its CommitLog files are the master's byte for byte from its min offset,
    and its ConsumeQueues serve the same units."""
    wait_for(lambda: slave.offsets().max_offset == master.offsets().max_offset, timeout, "the slave to catch up")
    s = slave.offsets()
    assert commitlog_bytes(slave.data_dir, s.min_offset, s.max_offset) == \
        commitlog_bytes(master.data_dir, s.min_offset, s.max_offset)
    wait_for(lambda: queues(slave) == queues(master), timeout, "the slave's ConsumeQueues to match the master's")
