"""Every on-disk format of the store, laid out once: RocketMQ's files, byte for byte.

All integers are big-endian. Readers and writers (the CommitLog's codec, the index service, the gateway's
local reads, ``doctor``) import the structs and positions below instead of repeating numbers, and
``tests/test_formats.py`` checks the compiled twin's (``_hotloops.c``) constants against them.

* **CommitLog record** (RocketMQ's MessageExtEncoder, V1; encoded and decoded by ``codec.py``)::

      TOTALSIZE(4) MAGICCODE(4) BODYCRC(4) QUEUEID(4) FLAG(4) QUEUEOFFSET(8)
      PHYSICALOFFSET(8) SYSFLAG(4) BORNTIMESTAMP(8) BORNHOST(8|20) STORETIMESTAMP(8)
      STOREHOSTADDRESS(8|20) RECONSUMETIMES(4) PREPAREDTRANSACTIONOFFSET(8)
      BODYLEN(4) BODY TOPICLEN(1) TOPIC PROPERTIESLEN(2) PROPERTIES

  A file ends with a blank: TOTALSIZE (the rest of the file) and BLANK_MAGIC_CODE.
* **ConsumeQueue unit** (ConsumeQueue.CQ_STORE_UNIT_SIZE): commitLogOffset(8) size(4) tagsCode(8).
* **IndexFile**: a header (IndexHeader: beginTimestamp(8) endTimestamp(8) beginPhyOffset(8) endPhyOffset(8)
  hashSlotCount(4) indexCount(4)), ``maxHashSlotNum`` hash slots of 4 bytes (the number of the slot's newest
  entry), then ``maxIndexNum`` entries: keyHash(4) phyOffset(8) timeDiff(4, seconds since beginTimestamp)
  prevIndex(4). Entry 0 is never used.
* **checkpoint** (StoreCheckpoint): one 4 KiB page; physicMsgTimestamp @0, logicsMsgTimestamp @8,
  indexMsgTimestamp @16.
"""

from __future__ import annotations

import struct

from rocketstore.storage.message import BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG

MESSAGE_MAGIC_CODE = 0xDAA320A7
BLANK_MAGIC_CODE = 0xCBD43194
END_FILE_MIN_BLANK_LENGTH = 4 + 4

# --- the record layout, named once ---------------------------------------------------------
# Every position and size below is computed from the struct formats of the fields before it, as
# aiokafka lays out its records; other modules import these names instead of repeating numbers.
# The head (TOTALSIZE .. BORNTIMESTAMP) is the same for every record; BORNHOST and STOREHOSTADDRESS
# are 8 bytes (IPv4) or 20 (IPv6, by SYSFLAG), so the fields after them move by 12 bytes per IPv6 host.
# TOTALSIZE MAGICCODE BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET SYSFLAG BORNTIMESTAMP
RECORD_HEAD_FORMAT = ">iIIiiqqiq"
RECORD_HEAD = struct.Struct(RECORD_HEAD_FORMAT)
POS_TOTALSIZE = 0
POS_MAGIC = struct.calcsize(">i")
POS_BODYCRC = struct.calcsize(">iI")
POS_QUEUEID = struct.calcsize(">iII")
POS_FLAG = struct.calcsize(">iIIi")
POS_QUEUEOFFSET = struct.calcsize(">iIIii")
POS_PHYSICALOFFSET = struct.calcsize(">iIIiiq")
POS_SYSFLAG = struct.calcsize(">iIIiiqq")
POS_BORNTIMESTAMP = struct.calcsize(">iIIiiqqi")
POS_BORNHOST = RECORD_HEAD.size

HOST_V4 = struct.Struct(">4sI")  # address, port
HOST_V6 = struct.Struct(">16sI")
HOST_V4_LENGTH = HOST_V4.size
HOST_V6_LENGTH = HOST_V6.size
HOST_V6_EXTRA = HOST_V6_LENGTH - HOST_V4_LENGTH  # how far an IPv6 host moves the fields after it
HOST_PORT_LENGTH = struct.calcsize(">I")
STORETIMESTAMP_LENGTH = struct.calcsize(">q")
# After STOREHOSTADDRESS: RECONSUMETIMES PREPAREDTRANSACTIONOFFSET BODYLEN, then BODY.
RECORD_MIDDLE = struct.Struct(">iqi")
RECONSUMETIMES_TO_BODYLEN = struct.calcsize(">iq")
BODYLEN_LENGTH = struct.calcsize(">i")
TOPICLEN_LENGTH = struct.calcsize(">B")  # V1: one byte
PROPERTIESLEN_LENGTH = struct.calcsize(">h")

# Positions of the fields after BORNHOST in a record with IPv4 hosts (RocketMQ's MessageDecoder
# exports STORE_TIMESTAMP_POSITION = 56); add HOST_V6_EXTRA for each IPv6 host before the field.
POS_STORETIMESTAMP = POS_BORNHOST + HOST_V4_LENGTH
POS_STOREHOST = POS_STORETIMESTAMP + STORETIMESTAMP_LENGTH
POS_RECONSUMETIMES = POS_STOREHOST + HOST_V4_LENGTH
POS_PREPAREDTRANSACTIONOFFSET = POS_RECONSUMETIMES + struct.calcsize(">i")
POS_BODYLEN = POS_RECONSUMETIMES + RECONSUMETIMES_TO_BODYLEN
POS_BODY = POS_BODYLEN + BODYLEN_LENGTH
# TOTALSIZE .. BODYLEN of a record with IPv4 hosts, in one struct (the body follows).
RECORD_V4_FIXED = struct.Struct(RECORD_HEAD_FORMAT + "4sIq4sIiqi")
# A V1 record with IPv4 hosts and empty body, topic and properties: RocketMQ's fixed overhead.
MIN_RECORD_LENGTH = POS_BODY + TOPICLEN_LENGTH + PROPERTIESLEN_LENGTH
# TOTALSIZE, MAGICCODE: how every record starts; the END_OF_FILE blank is only these 8 bytes.
RECORD_PREFIX = struct.Struct(">iI")

assert RECORD_HEAD.size == POS_BORNTIMESTAMP + STORETIMESTAMP_LENGTH
assert RECORD_V4_FIXED.size == POS_BODY and RECORD_PREFIX.size == END_FILE_MIN_BLANK_LENGTH
assert STOREHOSTADDRESS_V6_FLAG == BORNHOST_V6_FLAG << 1  # HOST_FLAGS_SHIFT reads both bits at once

# The fast walks look the moving positions up by the two host bits of SYSFLAG:
# ``table[(sys_flag >> HOST_FLAGS_SHIFT) & 3]``, index 1 = IPv6 born host, 2 = IPv6 store host.
HOST_FLAGS_SHIFT = BORNHOST_V6_FLAG.bit_length() - 1
STORETIMESTAMP_POSITIONS = tuple(POS_STORETIMESTAMP + HOST_V6_EXTRA * (i & 1) for i in range(4))
STOREHOST_POSITIONS = tuple(POS_STOREHOST + HOST_V6_EXTRA * (i & 1) for i in range(4))
RECONSUMETIMES_POSITIONS = tuple(POS_RECONSUMETIMES + HOST_V6_EXTRA * ((i & 1) + (i >> 1)) for i in range(4))
BODYLEN_POSITIONS = tuple(POS_BODYLEN + HOST_V6_EXTRA * ((i & 1) + (i >> 1)) for i in range(4))

# The head up to PHYSICALOFFSET: what a reader needs to place a record it found by its offset.
RECORD_HEAD_TO_PHYSICALOFFSET = struct.Struct(RECORD_HEAD_FORMAT[:8])
assert RECORD_HEAD_TO_PHYSICALOFFSET.size == POS_SYSFLAG

# --- ConsumeQueue -------------------------------------------------------------------------------
CQ_UNIT = struct.Struct(">qiq")  # commitLogOffset, size, tagsCode
CQ_STORE_UNIT_SIZE = CQ_UNIT.size
CQ_BLANK_SIZE = 0x7FFFFFFF  # the size field of a blank unit (a gap filled when a queue's file was rolled)
CQ_BLANK_UNIT = CQ_UNIT.pack(0, CQ_BLANK_SIZE, 0)


def cq_units(n: int) -> struct.Struct:
    """``n`` ConsumeQueue units as one struct (a batch packed or unpacked in one call)."""
    return struct.Struct(">" + "qiq" * n)


# --- IndexFile ----------------------------------------------------------------------------------
INDEX_HEADER = struct.Struct(">qqqqii")  # begin/end timestamp, begin/end phy offset, slot count, index count
INDEX_HEADER_SIZE = INDEX_HEADER.size
HASH_SLOT = struct.Struct(">i")
HASH_SLOT_SIZE = HASH_SLOT.size
INDEX_ENTRY = struct.Struct(">iqii")  # keyHash, phyOffset, timeDiff, prevIndex
INDEX_SIZE = INDEX_ENTRY.size
INVALID_INDEX = 0  # a slot or prevIndex pointing nowhere

# --- checkpoint ---------------------------------------------------------------------------------
CHECKPOINT_SIZE = 4096  # one OS page
CHECKPOINT_FIELD = struct.Struct(">q")
POS_PHYSIC_MSG_TIMESTAMP = 0
POS_LOGICS_MSG_TIMESTAMP = CHECKPOINT_FIELD.size
POS_INDEX_MSG_TIMESTAMP = 2 * CHECKPOINT_FIELD.size
