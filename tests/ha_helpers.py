"""In-process replication pairs for the HA tests: two CommitLog stores, each behind a real
CommitLog gRPC server on a loopback port, and the HA master and slave between them (no
subprocesses). Import explicitly: ``from ha_helpers import ReplicaPair``."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from rocketstore.services.commitlog.client import CommitLogClient
from rocketstore.services.commitlog.servicer import SERVICE_NAME, CommitLogServicer
from rocketstore.services.commitlog.store import CommitLogStore
from rocketstore.services.ha.client import HAClient
from rocketstore.services.ha.master import HAMaster
from rocketstore.services.ha.servicer import SERVICE_NAME as HA_SERVICE_NAME
from rocketstore.services.ha.servicer import HAServicer
from rocketstore.services.ha.slave import HASlave
from storage_helpers import StoreFactory

from rocketstore.rpc.server import GrpcServer
from rocketstore.v1 import commitlog_pb2_grpc, ha_pb2_grpc


def wait_until(predicate: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class ServedStore:
    """A CommitLog store behind a real CommitLog gRPC server."""

    def __init__(self, store: CommitLogStore) -> None:
        self.store = store
        self.servicer = CommitLogServicer(store)
        self.server = GrpcServer("127.0.0.1", 0, max_workers=16)
        self.server.add(commitlog_pb2_grpc.add_CommitLogServicer_to_server, self.servicer, SERVICE_NAME)
        self.server.start()
        self.endpoint = self.server.endpoint
        self.link = CommitLogClient(self.endpoint)

    def close(self) -> None:
        self.link.close()
        self.servicer.close()
        self.server.stop(0)


class HAMasterServer:
    def __init__(self, served: ServedStore, port: int = 0) -> None:
        self.master = HAMaster(served.store.settings, served.link)
        servicer = HAServicer(served.store.settings, self.master, None, lambda: served.store.max_offset)
        self.server = GrpcServer("127.0.0.1", port, max_workers=16)
        self.server.add(ha_pb2_grpc.add_HAServicer_to_server, servicer, HA_SERVICE_NAME)
        self.server.start()
        self.master.start()
        self.endpoint = self.server.endpoint

    def close(self) -> None:
        self.master.stop()
        self.server.stop(0)


class ReplicaPair:
    """A master store (role given) and a SLAVE store under ``root``, with their HA sides."""

    def __init__(self, stores: StoreFactory, root: Path, master_role: str = "SYNC_MASTER",
                 heartbeat_ms: int = 200, housekeeping_ms: int = 2000, **overrides: object) -> None:
        self.stores = stores
        self.root = root
        self.overrides = {"haSendHeartbeatInterval": heartbeat_ms, "haHousekeepingInterval": housekeeping_ms,
                          **overrides}
        self.master_store = stores.start(root / "master", brokerRole=master_role, **self.overrides)
        self.master = ServedStore(self.master_store)
        self.ha_master = HAMasterServer(self.master)
        self.slave_store: CommitLogStore | None = None
        self.slave: ServedStore | None = None
        self.ha_slave: HASlave | None = None

    def start_slave(self, root: Path | None = None, **overrides: object) -> HASlave:
        settings_over = {**self.overrides, "brokerRole": "SLAVE", "brokerId": 1,
                         "haMasterAddress": self.ha_master.endpoint, **overrides}
        self.slave_store = self.stores.start(root or self.root / "slave", **settings_over)
        self.slave = ServedStore(self.slave_store)
        self.ha_slave = HASlave(self.slave_store.settings, self.slave.link, HAClient(self.ha_master.endpoint).replicate,
                                retry_s=0.1)
        self.ha_slave.start()
        return self.ha_slave

    def stop_slave(self) -> None:
        if self.ha_slave is not None:
            self.ha_slave.stop()
            self.ha_slave = None
        if self.slave is not None:
            self.slave.close()
            self.slave = None
        if self.slave_store is not None:
            self.slave_store.shutdown()

    def close(self) -> None:
        self.stop_slave()
        self.ha_master.close()
        self.master.close()
