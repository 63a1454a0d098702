"""Switching the store's hot loops between their pure-Python and compiled implementations in tests."""

from __future__ import annotations

import pytest
from rocketstore.services.dispatcher import decode
from rocketstore.services.index import index_file

from rocketstore.storage import _speedups, codec


def implementations(kind: str) -> dict[tuple[object, str], object]:
    """(module, attribute) -> the function of implementation ``kind`` ("python" or "compiled")."""
    if kind == "python":
        return {(codec, "encode_records"): codec.encode_records_py,
                (codec, "place_records"): codec.place_records_py,
                (decode, "walk_records"): decode.walk_records_py,
                (index_file, "index_key_hash"): index_file.index_key_hash_py,
                (index_file, "put_message_keys"): index_file.put_message_keys_py}
    compiled = _speedups.compiled
    assert compiled is not None, "the compiled hot loops are not built"
    return {(codec, "encode_records"): codec.encode_records,  # the wrapper that passes parse_host and crc32
            (codec, "place_records"): codec.place_records,  # the wrapper that passes crc32 (or None)
            (decode, "walk_records"): compiled.walk_records,
            (index_file, "index_key_hash"): compiled.index_key_hash,
            (index_file, "put_message_keys"): compiled.put_message_keys}


def use_hot_loops(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for (module, name), fn in implementations(kind).items():
        monkeypatch.setattr(module, name, fn)
