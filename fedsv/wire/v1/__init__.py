"""Generated protobuf and gRPC code of the fedsv.v1 wire contract (python -m fedsv.wire.protogen)."""
