"""The gateway's ``apache.rocketmq.v2`` stubs (``rocketstore.v2``) are the published protocol: every
message, field (number, type, label, message or enum type, oneof, optional), enum value and service method
(request, response, streaming) matches the descriptors the official client (``rocketmq-python-client``
5.1.2) ships, loaded in the client's own process."""

from __future__ import annotations

import base64
from pathlib import PurePosixPath
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

from rocketstore.v2 import definition_pb2, service_pb2
from tests.rmq5_venv import run_client

FieldShape = tuple[int, int, int, str, int | None, bool]


def _shape(proto: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """Everything of a proto file that is on the wire or in a stub's signature, keyed by full name."""
    out: dict[str, Any] = {}

    def enum(prefix: str, e: descriptor_pb2.EnumDescriptorProto) -> None:
        out[f"enum {prefix}{e.name}"] = {v.name: v.number for v in e.value}

    def message(prefix: str, m: descriptor_pb2.DescriptorProto) -> None:
        name = f"{prefix}{m.name}"
        out[f"message {name}"] = {
            f.name: (f.number, f.type, f.label, f.type_name,
                     f.oneof_index if f.HasField("oneof_index") else None, f.proto3_optional)
            for f in m.field}
        out[f"oneofs {name}"] = [o.name for o in m.oneof_decl]
        for nested in m.nested_type:
            message(f"{name}.", nested)
        for e in m.enum_type:
            enum(f"{name}.", e)

    prefix = f".{proto.package}."
    for m in proto.message_type:
        message(prefix, m)
    for e in proto.enum_type:
        enum(prefix, e)
    for service in proto.service:
        out[f"service {prefix}{service.name}"] = {
            m.name: (m.input_type, m.output_type, m.client_streaming, m.server_streaming) for m in service.method}
    out["package"] = proto.package
    out["imports"] = sorted(PurePosixPath(d).name for d in proto.dependency)
    return out


@pytest.fixture(scope="module")
def published() -> dict[str, descriptor_pb2.FileDescriptorProto]:
    files = run_client("descriptors.py", {})
    return {PurePosixPath(name).name: descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(data))
            for name, data in files.items()}


def _ours(module: Any) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    return proto


@pytest.mark.parametrize("module", [definition_pb2, service_pb2], ids=["definition", "service"])
def test_every_message_field_enum_and_method_matches_the_published_descriptors(
        published: dict[str, descriptor_pb2.FileDescriptorProto], module: Any) -> None:
    ours = _ours(module)
    theirs = published[PurePosixPath(ours.name).name]
    mine, reference = _shape(ours), _shape(theirs)
    assert sorted(mine) == sorted(reference), "the files declare different messages, enums or services"
    for key in reference:
        assert mine[key] == reference[key], key


def test_the_service_has_every_published_method(published: dict[str, descriptor_pb2.FileDescriptorProto]) -> None:
    methods = {m.name for m in published["service.proto"].service[0].method}
    assert methods == set(service_pb2.DESCRIPTOR.services_by_name["MessagingService"].methods_by_name)
    assert {"QueryRoute", "Heartbeat", "SendMessage", "QueryAssignment", "ReceiveMessage", "AckMessage",
            "Telemetry", "NotifyClientTermination", "ChangeInvisibleDuration", "RecallMessage"} <= methods


def test_a_changed_field_number_is_noticed(published: dict[str, descriptor_pb2.FileDescriptorProto]) -> None:
    # The comparison itself can fail: renumber one field of our copy and it differs from the published one.
    ours = _ours(definition_pb2)
    message = next(m for m in ours.message_type if m.name == "SystemProperties")
    next(f for f in message.field if f.name == "message_group").number = 99
    assert _shape(ours)["message .apache.rocketmq.v2.SystemProperties"] != \
        _shape(published["definition.proto"])["message .apache.rocketmq.v2.SystemProperties"]
