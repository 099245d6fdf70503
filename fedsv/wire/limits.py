"""Size limits of gRPC messages, chunks and tensor streams: the one place both sides read them from."""

from __future__ import annotations

# Largest gRPC message either side sends or accepts (server and channel options alike).
GRPC_MESSAGE_BYTES = 8 << 20
# Chunk size a model or delta is cut into on the wire, unless the run asks for smaller chunks.
DEFAULT_CHUNK_BYTES = 1 << 20
# Bounds of a run's max_chunk_bytes: a chunk plus its message framing stays under 4 MiB, the message
# limit of gRPC peers that keep their defaults.
MIN_CHUNK_BYTES = 1 << 10
MAX_CHUNK_BYTES = (4 << 20) - 4096
# Largest tensor set (a model on the way down, an update on the way up) either side assembles.
MAX_TENSOR_SET_BYTES = 1 << 30

DEFAULT_MAX_SAMPLES = 10_000_000
"""The largest sample count a participant may declare at Join unless the server says otherwise
(`--max-samples-per-participant`): a FedAvg weight's bound before the guard caps it."""
