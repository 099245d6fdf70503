"""Generated protobuf and gRPC code for the fedsv.v1 wire contract (regenerate with python -m fedsv.common.protogen)."""
