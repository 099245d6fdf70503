"""The `fedsv` command and what it runs: launch, demo, report, certs and the paper's studies."""

from fedsv.config.logs import quiet_grpc_core

quiet_grpc_core()  # before anything imports grpc: gRPC core reads its log level once, at import
