"""fedsv participant: MPI-style ranks that train locally and stream their deltas to the coordinator."""

from fedsv.config.logs import quiet_grpc_core

quiet_grpc_core()  # before anything imports grpc: gRPC core reads its log level once, at import
