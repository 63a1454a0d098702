"""What the master sends a slave, and from where (RocketMQ's HAConnection.WriteSocketService rules).

Pure functions: the start point of a stream, the chunks a run of CommitLog bytes is cut into, and
the tail check a slave sends so the master can tell a slave that holds bytes it never had.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

__all__ = ["CHECK_BYTES", "BadReport", "Diverged", "check_divergence", "check_first_report", "chunks", "crc32",
           "start_offset"]


CHECK_BYTES = 4096  # the tail a slave's first report carries the CRC of


class BadReport(ValueError):
    """A first report no slave sends: a negative offset, a tail check outside [0, max offset) or
    longer than CHECK_BYTES (the master would read all of it), a gateway that is not HOST:PORT."""


class Diverged(ValueError):
    """The slave's log is not a prefix of the master's: replicating would serve or keep bytes the
    master never had. The message carries both offsets and what to do."""


def start_offset(requested: int, master_max: int, file_size: int) -> int:
    """Where the stream to a slave starts: a slave that has nothing (0) starts at the beginning
    of the master's last CommitLog file, any other slave where it is."""
    if requested == 0:
        return master_max - master_max % file_size
    return requested


def chunks(offset: int, data: bytes | memoryview, batch_size: int, file_size: int) -> Iterator[tuple[int, memoryview]]:
    """Cut the bytes at ``offset`` into (offset, bytes) pieces of at most ``batch_size`` bytes, none
    of which crosses the end of a CommitLog file."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        room = file_size - offset % file_size
        n = min(batch_size, room, len(view) - done)
        yield offset, view[done:done + n]
        offset += n
        done += n


def check_first_report(max_offset: int, check_offset: int, gateway_endpoint: str) -> None:
    """Refuse what no slave sends, before the master reads anything for it."""
    if max_offset < 0:
        raise BadReport(f"max_offset is {max_offset}; CommitLog offsets are >= 0")
    in_range = max_offset - CHECK_BYTES <= check_offset < max_offset
    if check_offset < 0 or (check_offset != max_offset and not in_range):
        raise BadReport(f"check_offset is {check_offset}; the tail check covers at most the {CHECK_BYTES} bytes "
                        f"below max_offset {max_offset} (check_offset = max_offset: no check)")
    if gateway_endpoint:
        host, sep, port = gateway_endpoint.rpartition(":")
        if (not sep or not host or len(gateway_endpoint) > 255 or not port.isdigit() or not 0 < int(port) <= 65535
                or not gateway_endpoint.isprintable() or " " in gateway_endpoint):
            raise BadReport(f"gateway_endpoint {gateway_endpoint[:80]!r} is not HOST:PORT")


def check_divergence(slave_max: int, master_max: int) -> None:
    """Refuse a slave whose log ends beyond the master's."""
    if slave_max > master_max:
        raise Diverged(
            f"the slave's CommitLog ends at offset {slave_max}, beyond the master's max offset {master_max}: "
            "the master lost (or never had) the slave's tail. The slave does not replicate; make the broker "
            "with the longer log the master, or move the slave's store directory aside and start it empty")


def crc32(data: bytes | memoryview) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF
