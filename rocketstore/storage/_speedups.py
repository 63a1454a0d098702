"""The compiled hot loops (``rocketstore.storage._hotloops``, built from ``rocketstore/storage/_hotloops.c`` by
``pip install`` when the machine has a C compiler), or nothing.

Each loop has a pure-Python twin next to the code that calls it (``codec.encode_records``,
``codec.place_records``, ``decode.walk_records``, ``index_file.put_message_keys``,
``index_file.index_key_hash_py``); the module picks the compiled one when it is here. Both give the same bytes
and results (``tests/test_hot_loops_agree.py``) and both run in the test suite.
``ROCKETSTORE_NO_EXTENSIONS=1`` (any value but "" and "0") forces the pure-Python code, as aiokafka's
``AIOKAFKA_NO_EXTENSIONS`` does.
"""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["NO_EXTENSIONS_VARIABLE", "compiled", "enabled"]

NO_EXTENSIONS_VARIABLE = "ROCKETSTORE_NO_EXTENSIONS"


def _load() -> ModuleType | None:
    if os.environ.get(NO_EXTENSIONS_VARIABLE, "") not in ("", "0"):
        return None
    try:
        from rocketstore.storage import _hotloops  # type: ignore[attr-defined]
    except ImportError:  # no compiler when the package was installed: the pure-Python loops serve
        return None
    return _hotloops  # type: ignore[no-any-return]


compiled: ModuleType | None = _load()


def enabled() -> bool:
    """Whether the compiled loops are in use."""
    return compiled is not None
