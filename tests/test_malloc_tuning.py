"""The ha and CommitLog services keep freed megabyte buffers (glibc's mallopt), unless the user set
glibc's own variables, which then win."""

from __future__ import annotations

import pytest

from rocketstore.rpc.malloc_tuning import keep_freed_buffers


def test_the_thresholds_apply_on_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"):
        monkeypatch.delenv(name, raising=False)
    assert keep_freed_buffers()


def test_a_threshold_the_user_set_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert not keep_freed_buffers()
