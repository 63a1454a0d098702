"""Generated gRPC stubs of the internal contracts (package rocketstore.v1); see protos/."""
