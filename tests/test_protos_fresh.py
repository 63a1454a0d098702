"""The committed gRPC stubs (rocketstore/v1) are what protoc makes of protos/ today.

When this fails, run ``python -m rocketstore.protogen`` and commit the regenerated stubs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

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
