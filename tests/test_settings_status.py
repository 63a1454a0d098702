"""Every setting says what it does here: honoured (and by which service), ignored or not yet.

The table's claims are checked against the source, a key set to no effect is warned about once, and
docs/settings.md is regenerated whenever the table changes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import CommitLogProcess
from structlog.testing import capture_logs

from rocketstore.config import settings as settings_module
from rocketstore.config import settings_doc
from rocketstore.config.settings import KEYS, SERVICES, KeyStatus, Settings, describe, load_settings, lookup_key

ROOT = Path(__file__).resolve().parent.parent
NO_ENV: dict[str, str] = {}
WARNING = "setting has no effect"

# Settings properties computed from a key: reading the property reads the key.
READ_THROUGH = {
    "message_delay_level": ("delay_level_millis", "max_delay_level"),
    "delete_when": ("delete_when_hours",),
}


@pytest.fixture(autouse=True)
def fresh_process_warnings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts as a fresh process would: nothing warned about yet."""
    monkeypatch.setattr(settings_module, "_warned_ineffective", set())
    yield


def _sources(directory: Path) -> str:
    return "\n".join(path.read_text(encoding="utf-8") for path in sorted(directory.rglob("*.py")))


def _reads(source: str, attr: str) -> bool:
    names = (attr, *READ_THROUGH.get(attr, ()))
    return re.search(r"\.(?:" + "|".join(names) + r")\b", source) is not None


def test_every_key_has_exactly_one_allowed_status() -> None:
    for key in KEYS:
        assert isinstance(key.status, KeyStatus), key.name
        assert set(key.readers) <= set(SERVICES), f"{key.name} names unknown services {key.readers}"
        assert len(set(key.readers)) == len(key.readers), key.name
        if key.status is KeyStatus.HONOURED:
            assert key.readers, f"{key.name} is honoured by no service"
            assert key.has_effect
        else:
            assert key.note, f"{key.name} is {key.status.value} without saying why"
            assert not key.has_effect
    # NOT_YET is for features later work builds; none is left since reads from the slave were built.
    assert {key.status for key in KEYS} >= {KeyStatus.HONOURED, KeyStatus.IGNORED}


def test_readers_are_the_services_whose_code_reads_the_key() -> None:
    """The table may not claim a key is read where it is not, nor hide a service that reads it."""
    services = {name: _sources(ROOT / "services" / name) for name in SERVICES}
    elsewhere = "\n".join(
        path.read_text(encoding="utf-8")
        for directory in (ROOT / "rocketstore", ROOT / "spark")
        for path in sorted(directory.rglob("*.py"))
        if path.name not in ("settings.py", "settings_doc.py") and "v1" not in path.parts
    )
    wrong = []
    for key in KEYS:
        found = {name for name, source in services.items() if _reads(source, key.attr)}
        if found != set(key.readers):
            wrong.append(f"{key.name}: read by {sorted(found)}, the table says {sorted(key.readers)}")
        if not key.readers and _reads(elsewhere, key.attr):
            wrong.append(f"{key.name}: the table says nothing reads it, but rocketstore/ or spark/ does")
    assert not wrong, "\n".join(wrong)


def test_slave_read_enable_is_honoured_by_the_gateways_pulls() -> None:
    key = lookup_key("slaveReadEnable")
    assert key is not None and key.status is KeyStatus.HONOURED and key.readers == ("gateway",)


@pytest.mark.parametrize("name", [
    "checkTransactionMessageEnable", "transactionTimeOut", "transactionCheckMax", "transactionCheckInterval",
])
def test_transaction_keys_are_honoured_by_the_gateways_check(name: str) -> None:
    key = lookup_key(name)
    assert key is not None and key.status is KeyStatus.HONOURED and key.readers == ("gateway",)


@pytest.mark.parametrize("name", [
    "useEpollNativeSelector", "transferMsgByHeap", "useReentrantLockWhenPutMessage",
    "sendMessageThreadPoolNums", "pullMessageThreadPoolNums", "waitTimeMillsInSendQueue", "longPollingEnable",
])
def test_knobs_with_no_meaning_here_are_ignored(name: str) -> None:
    key = lookup_key(name)
    assert key is not None and key.status is KeyStatus.IGNORED


def _warnings(logs: list[dict[str, object]]) -> list[dict[str, object]]:
    return [entry for entry in logs if entry["event"] == WARNING]


def test_a_key_with_no_effect_set_away_from_its_default_is_warned_once(tmp_path: Path) -> None:
    path = tmp_path / "broker.properties"
    path.write_text("slaveReadEnable=true\nuseEpollNativeSelector=true\n", encoding="utf-8")
    with capture_logs() as logs:
        load_settings(str(path), overrides={"sendMessageThreadPoolNums": "7"}, environ=NO_ENV)
        load_settings(str(path), overrides={"sendMessageThreadPoolNums": "7"}, environ=NO_ENV)  # same process
    warnings = {entry["key"]: entry for entry in _warnings(logs)}
    assert len(_warnings(logs)) == 2
    # slaveReadEnable is honoured (reads from the slave): no warning.
    assert set(warnings) == {"useEpollNativeSelector", "sendMessageThreadPoolNums"}
    assert all(entry["log_level"] == "warning" for entry in warnings.values())

    epoll = warnings["useEpollNativeSelector"]
    assert epoll["value"] == "true" and epoll["status"] == "ignored"
    assert "Netty" in str(epoll["reason"])
    assert epoll["source"] == f"in {path} line 2"
    pool = warnings["sendMessageThreadPoolNums"]
    assert pool["value"] == "7" and pool["source"] == "in flag sendMessageThreadPoolNums"
    assert pool["reason"] == lookup_key("sendMessageThreadPoolNums").note  # type: ignore[union-attr]


def test_keys_at_their_default_are_silent_even_when_set() -> None:
    defaults = {key.name: key.to_text(key.default) for key in KEYS if not key.has_effect}
    with capture_logs() as logs:
        settings = load_settings(overrides=defaults, environ=NO_ENV)
    assert settings == Settings()
    assert _warnings(logs) == []


def test_honoured_keys_away_from_their_default_are_silent() -> None:
    with capture_logs() as logs:
        load_settings(overrides={"flushDiskType": "SYNC_FLUSH", "fileReservedTime": "1",
                                 "maxTransferCountOnMessageInMemory": "64"}, environ=NO_ENV)
    assert _warnings(logs) == []


def test_a_key_set_by_environment_is_warned_with_its_variable() -> None:
    with capture_logs() as logs:
        load_settings(environ={"ROCKETSTORE_USE_EPOLL_NATIVE_SELECTOR": "true"})
    (warning,) = _warnings(logs)
    assert warning["key"] == "useEpollNativeSelector" and warning["value"] == "true"
    assert warning["source"] == "in environment variable ROCKETSTORE_USE_EPOLL_NATIVE_SELECTOR"


def test_a_started_service_logs_one_warning_per_ineffective_key(
    commitlog_factory: Callable[..., CommitLogProcess],
) -> None:
    proc = commitlog_factory({"useEpollNativeSelector": "true", "longPollingEnable": "false",
                              "slaveReadEnable": "true", "flushDiskType": "SYNC_FLUSH"})
    lines = [json.loads(line) for line in proc.log_text().splitlines() if line.startswith("{")]
    warned = [line for line in lines if line.get("event") == WARNING]
    assert sorted(line["key"] for line in warned) == ["longPollingEnable", "useEpollNativeSelector"]
    by_key = {line["key"]: line for line in warned}
    assert by_key["useEpollNativeSelector"]["value"] == "true"
    assert by_key["longPollingEnable"]["reason"] == lookup_key("longPollingEnable").note  # type: ignore[union-attr]
    assert all(line["level"] == "warning" for line in warned)


def test_docs_settings_md_is_fresh() -> None:
    problem = settings_doc.check()
    assert problem is None, problem


def test_the_static_view_of_settings_is_fresh() -> None:
    """rocketstore/config/settings_fields.py, what mypy knows of Settings: every key's attribute with its type."""
    problem = settings_doc.check_fields()
    assert problem is None, problem
    from rocketstore.config.settings_fields import SettingsFields

    assert list(SettingsFields.__annotations__) == [key.attr for key in KEYS]


def test_the_doc_has_a_row_per_key_with_its_status_and_readers() -> None:
    rows = {line.split(" | ")[0].lstrip("| ").split(",")[0]: line for line in describe().splitlines()[2:]}
    assert len(rows) == len(KEYS)
    for key in KEYS:
        row = rows[key.name]
        cells = [cell.strip() for cell in row.strip("|").split(" | ")]
        assert cells[3].startswith(key.status.value), row
        assert cells[4] == (", ".join(key.readers) or "nothing"), row
    doc = settings_doc.render()
    assert describe() in doc and "**not yet**" in doc


def test_check_reports_a_stale_or_missing_doc(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "settings.md"
    assert settings_doc.check(path) is not None and "missing" in str(settings_doc.check(path))
    assert settings_doc.main(["--output", str(path)]) == 0
    assert settings_doc.check(path) is None
    assert settings_doc.main(["--check", "--output", str(path)]) == 0

    path.write_text(path.read_text().replace("| honoured", "| ignored", 1))
    assert "stale" in str(settings_doc.check(path))
    assert settings_doc.main(["--check", "--output", str(path)]) == 1
    assert "python -m rocketstore.config.settings_doc" in capsys.readouterr().err
