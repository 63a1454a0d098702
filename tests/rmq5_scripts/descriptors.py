"""Print the official client's published apache.rocketmq.v2 descriptors (definition and service) as JSON:
{file name: base64 of its serialized FileDescriptorProto}. Runs in the client's virtualenv."""

import base64
import json

from google.protobuf import descriptor_pb2
from rocketmq.grpc_protocol import definition_pb2, service_pb2

out = {}
for module in (definition_pb2, service_pb2):
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    out[proto.name] = base64.b64encode(proto.SerializeToString()).decode()
print(json.dumps(out))
