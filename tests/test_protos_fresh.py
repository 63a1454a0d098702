"""The committed gRPC stubs (rocketstore/v1) are what protoc makes of protos/ today.

When this fails, run ``python -m rocketstore.protogen`` and commit the regenerated stubs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rocketstore import protogen

ROOT = Path(__file__).resolve().parent.parent


def test_stubs_are_fresh() -> None:
    problems = protogen.check(ROOT / "protos", ROOT)
    assert not problems, "stale gRPC stubs; run `python -m rocketstore.protogen`:\n" + "\n".join(problems)


def test_check_reports_a_changed_proto(tmp_path: Path) -> None:
    protos = tmp_path / "protos"
    shutil.copytree(ROOT / "protos", protos)
    out = tmp_path / "out"
    protogen.generate(protos, out)
    assert protogen.check(protos, out) == []

    proto = protos / "rocketstore" / "v1" / "commitlog.proto"
    proto.write_text(proto.read_text().replace("message GetOffsetsRequest {}",
                                               "message GetOffsetsRequest { bool extra = 1; }"))
    problems = protogen.check(protos, out)
    assert any(p.startswith("stale:") and "commitlog_pb2.py" in p for p in problems)

    (out / "rocketstore" / "v1" / "commitlog_pb2_grpc.py").unlink()
    (out / "rocketstore" / "v1" / "gone_pb2.py").write_text("# generated from a proto that was removed\n")
    problems = protogen.check(protos, out)
    assert any(p.startswith("missing:") and "commitlog_pb2_grpc.py" in p for p in problems)
    assert any(p.startswith("orphaned") and "gone_pb2.py" in p for p in problems)


def test_version_stamps_alone_do_not_make_stubs_stale() -> None:
    text = (ROOT / "rocketstore" / "v1" / "commitlog_pb2.py").read_text()
    bumped = text.replace("# Protobuf Python Version: ", "# Protobuf Python Version: 99.")
    assert protogen._normalise(bumped) == protogen._normalise(text)


def test_generate_names_the_missing_typing_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Neither beside the interpreter nor on PATH: generation stops before writing, naming what to install.
    monkeypatch.setattr(protogen.sys, "executable", str(tmp_path / "bin" / "python3"))
    monkeypatch.setenv("PATH", str(tmp_path))
    out = tmp_path / "out"
    with pytest.raises(protogen.ProtogenError, match="mypy-protobuf"):
        protogen.generate(ROOT / "protos", out)
    assert not (out / "rocketstore").exists()


def test_typed_grpc_stubs_are_generated_for_every_proto(tmp_path: Path) -> None:
    written = protogen.generate(ROOT / "protos", tmp_path)
    for proto in protogen.proto_files(ROOT / "protos"):
        pyi = tmp_path / "rocketstore" / "v1" / f"{proto.stem}_pb2_grpc.pyi"
        assert pyi in written
        assert "grpc.UnaryUnaryMultiCallable[" in pyi.read_text()


def test_v2_stubs_import_as_rocketstore_v2_and_keep_the_published_wire_names(tmp_path: Path) -> None:
    # RocketMQ 5's protos keep their published files, package and method paths; only the Python modules move
    # to rocketstore.v2, so they never clash with a copy named apache.rocketmq.v2 (the official client's).
    protogen.generate(ROOT / "protos", tmp_path)
    out = tmp_path / "rocketstore" / "v2"
    service = (out / "service_pb2.py").read_text()
    assert "from rocketstore.v2 import definition_pb2" in service
    assert "'rocketstore.v2.service_pb2'" in service
    assert "apache/rocketmq/v2/service.proto" in service
    assert "'/apache.rocketmq.v2.MessagingService/SendMessage'" in (out / "service_pb2_grpc.py").read_text()
    assert "from apache" not in "".join(p.read_text() for p in out.iterdir())
