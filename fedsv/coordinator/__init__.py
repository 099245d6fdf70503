"""fedsv coordinator: selects participants, aggregates, values each round, keeps the ledger."""

from fedsv.config.logs import quiet_grpc_core

quiet_grpc_core()  # before anything imports grpc: gRPC core reads its log level once, at import
