"""The RPC plumbing: gRPC servers and their interceptors, in-process channels, internal clients' calls, TLS."""
