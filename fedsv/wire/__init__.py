"""fedsv.wire: what crosses the network: the tensor codec, size limits, generated gRPC code, call settings."""
