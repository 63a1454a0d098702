"""One home for every on-disk format (``rocketstore/storage/formats.py``): the compiled twin of the hot loops
(``rocketstore/storage/_hotloops.c``) spells the same positions as C constants, and each must equal the Python one,
so a change of the layout in one place and not the other fails here rather than corrupting a store."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from rocketstore.storage import codec, formats, message

C_SOURCE = Path(formats.__file__).with_name("_hotloops.c")
_DEFINE = re.compile(r"^#define (\w+) (.+?)\s*(?:/\*.*)?$", re.M)


def _c_constants() -> dict[str, str]:
    return dict(_DEFINE.findall(C_SOURCE.read_text()))


# Every C constant that states a fact of a format, and the Python value it must equal.
EXPECTED = {
    "MESSAGE_MAGIC_CODE": formats.MESSAGE_MAGIC_CODE,
    "END_FILE_MIN_BLANK_LENGTH": formats.END_FILE_MIN_BLANK_LENGTH,
    "POS_QUEUEID": formats.POS_QUEUEID,
    "POS_FLAG": formats.POS_FLAG,
    "POS_QUEUEOFFSET": formats.POS_QUEUEOFFSET,
    "POS_PHYSICALOFFSET": formats.POS_PHYSICALOFFSET,
    "POS_SYSFLAG": formats.POS_SYSFLAG,
    "POS_BORNTIMESTAMP": formats.POS_BORNTIMESTAMP,
    "POS_BORNHOST": formats.POS_BORNHOST,
    "POS_STORETIMESTAMP": formats.POS_STORETIMESTAMP,
    "POS_BODYLEN": formats.POS_BODYLEN,
    "HOST_V6_EXTRA": formats.HOST_V6_EXTRA,
    "MIN_RECORD_LENGTH": formats.MIN_RECORD_LENGTH,
    "MAX_TOPIC_LENGTH": codec.MAX_TOPIC_LENGTH,
    "MAX_PROPERTIES_LENGTH": codec.MAX_PROPERTIES_LENGTH,
    "RECORD_SIZE_SLACK": codec.RECORD_SIZE_SLACK,
    "BORNHOST_V6_FLAG": message.BORNHOST_V6_FLAG,
    "STOREHOSTADDRESS_V6_FLAG": message.STOREHOSTADDRESS_V6_FLAG,
    "TRANSACTION_PREPARED_TYPE": message.TRANSACTION_PREPARED_TYPE,
    "TRANSACTION_ROLLBACK_TYPE": message.TRANSACTION_ROLLBACK_TYPE,
    "INDEX_HEADER_SIZE": formats.INDEX_HEADER_SIZE,
    "HASH_SLOT_SIZE": formats.HASH_SLOT_SIZE,
    "INDEX_SIZE": formats.INDEX_SIZE,
    "CRC32_PREFIX_LEN": len(codec.CRC32_PREFIX),
    "CRC32_DIGITS": codec.CRC32_DIGITS,
    "CRC32_RESERVED_LEN": codec.CRC32_RESERVED_LEN,
}


def _c_value(text: str) -> int:
    return int(eval(text.rstrip("uUlL"), {}, {}))  # integer literals and products of them only


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_compiled_twin_spells_each_format_constant_as_formats_does(name: str) -> None:
    defined = _c_constants()
    assert name in defined, f"{C_SOURCE.name} no longer defines {name}: drop it here or define it there"
    assert _c_value(defined[name]) == EXPECTED[name]


def test_every_format_fact_of_the_c_source_is_checked() -> None:
    """A new #define of the C source that is a number must be added to EXPECTED (or to the plumbing below)."""
    plumbing = {"PY_SSIZE_T_CLEAN", "INT_MAX32", "CRC32_PREFIX", "INTERN",
                "PUMP_SCRATCH", "PEER_ENTRY", "TLS_RECORD_HANDSHAKE"}  # the TLS port demultiplexer's, not the store's
    assert set(_c_constants()) - plumbing == set(EXPECTED)
    assert _c_constants()["CRC32_PREFIX"] == '"' + codec.CRC32_PREFIX.decode().replace("\x01", "\\x01") + '"'


def test_the_layout_adds_up() -> None:
    assert formats.CQ_STORE_UNIT_SIZE == 20 and formats.CQ_BLANK_UNIT == struct.pack(">qiq", 0, 0x7FFFFFFF, 0)
    assert formats.INDEX_HEADER_SIZE == 40 and formats.INDEX_SIZE == 20 and formats.HASH_SLOT_SIZE == 4
    assert formats.RECORD_HEAD.size == formats.POS_BORNHOST
    assert formats.RECORD_HEAD_TO_PHYSICALOFFSET.size == formats.POS_SYSFLAG
    assert formats.POS_INDEX_MSG_TIMESTAMP + formats.CHECKPOINT_FIELD.size <= formats.CHECKPOINT_SIZE
    assert formats.cq_units(3).size == 3 * formats.CQ_STORE_UNIT_SIZE
