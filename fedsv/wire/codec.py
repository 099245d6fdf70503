"""Tensor codec for the wire: named tensors as raw little-endian bytes in checksummed, bounded chunks."""

from __future__ import annotations

import hashlib
import logging
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from fedsv.wire.limits import DEFAULT_CHUNK_BYTES, MAX_CHUNK_BYTES
from fedsv.wire.v1 import fedsv_pb2

logger = logging.getLogger(__name__)

SHA256_BYTES = 32

WIRE_ERROR_REASONS: tuple[str, ...] = (
    "bad_header",
    "unexpected_tensors",
    "too_large",
    "too_many_tensors",
    "bad_chunk",
    "incomplete",
    "checksum_mismatch",
    "non_finite",
)

TensorSpecs = Mapping[str, tuple[str, tuple[int, ...]]]


class WireError(Exception):
    """A tensor set that breaks the wire contract; `reason` is a short label for metrics and status codes."""

    def __init__(self, reason: str, message: str) -> None:
        if reason not in WIRE_ERROR_REASONS:
            raise ValueError(f"unknown WireError reason {reason!r}; expected one of {WIRE_ERROR_REASONS}")
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class _DType:
    torch_dtype: torch.dtype
    wire: np.dtype  # little-endian numpy dtype of the raw bytes on the wire

    @property
    def itemsize(self) -> int:
        return int(self.wire.itemsize)


# bfloat16 has no numpy dtype: its raw bits travel as int16. bool travels as one byte (0 or 1).
DTYPES: dict[str, _DType] = {
    "float32": _DType(torch.float32, np.dtype("<f4")),
    "float64": _DType(torch.float64, np.dtype("<f8")),
    "float16": _DType(torch.float16, np.dtype("<f2")),
    "bfloat16": _DType(torch.bfloat16, np.dtype("<i2")),
    "int64": _DType(torch.int64, np.dtype("<i8")),
    "int32": _DType(torch.int32, np.dtype("<i4")),
    "uint8": _DType(torch.uint8, np.dtype("u1")),
    "bool": _DType(torch.bool, np.dtype("u1")),
}
_NAME_OF: dict[torch.dtype, str] = {d.torch_dtype: name for name, d in DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """The wire name of a torch dtype; ValueError for dtypes the wire does not carry."""
    try:
        return _NAME_OF[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype} is not supported on the wire; supported: {sorted(DTYPES)}") from None


def spec_of(tensors: Mapping[str, torch.Tensor]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Name -> (wire dtype name, shape) of each tensor, e.g. to pass as an assembler's `expected`."""
    return {name: (dtype_name(t.dtype), tuple(int(d) for d in t.shape)) for name, t in tensors.items()}


def _spec_bytes(spec: fedsv_pb2.TensorSpec) -> int:
    dt = DTYPES.get(spec.dtype)
    if dt is None:
        raise WireError("bad_header", f"tensor {spec.name!r} has unknown dtype {spec.dtype!r}")
    if any(d < 0 for d in spec.shape):
        raise WireError("bad_header", f"tensor {spec.name!r} has a negative dimension in {list(spec.shape)}")
    return math.prod(spec.shape) * dt.itemsize


def tensor_set_bytes(header: fedsv_pb2.TensorSetHeader) -> int:
    """Sum of the byte sizes of the header's tensor specs (WireError 'bad_header' on a bad spec)."""
    return sum(_spec_bytes(spec) for spec in header.tensors)


def _to_wire_array(name: str, tensor: torch.Tensor) -> np.ndarray:
    """The tensor's raw little-endian bytes as a flat uint8 array (no copy for contiguous CPU tensors)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor {name!r} is a {type(tensor).__name__}, not a torch.Tensor")
    if tensor.layout != torch.strided:
        raise ValueError(f"tensor {name!r} has layout {tensor.layout}; only dense tensors go on the wire")
    wire = DTYPES[dtype_name(tensor.dtype)].wire
    t = tensor.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    arr = t.numpy().reshape(-1)
    if arr.dtype == np.bool_:
        arr = arr.view(np.uint8)
    return arr.astype(wire, copy=False).view(np.uint8)


class ChunkPayloads:
    """The chunk payloads of an encoded tensor set: a re-iterable, indexable view over one byte snapshot."""

    def __init__(self, data: bytes, chunk_bytes: int) -> None:
        self._data = data
        self.chunk_bytes = chunk_bytes

    @property
    def total_bytes(self) -> int:
        return len(self._data)

    def __len__(self) -> int:
        return -(-len(self._data) // self.chunk_bytes)

    def __getitem__(self, index: int) -> bytes:
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"chunk index {index} out of range for {n} chunks")
        start = index * self.chunk_bytes
        return self._data[start : start + self.chunk_bytes]

    def __iter__(self) -> Iterator[bytes]:
        for i in range(len(self)):
            yield self[i]


def wire_size(tensors: Mapping[str, torch.Tensor]) -> int:
    """The bytes the tensors take on the wire (their encoding's total_bytes)."""
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())


def encode_tensor_set(
    tensors: Mapping[str, torch.Tensor], chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> tuple[fedsv_pb2.TensorSetHeader, ChunkPayloads]:
    """Encode named tensors as a header and chunk payloads of at most chunk_bytes each.

    The payloads are cut lazily from a single byte snapshot taken here, so later changes to the
    tensors do not affect them and the same payloads can be sent to many receivers.
    """
    if not 1 <= chunk_bytes <= MAX_CHUNK_BYTES:
        raise ValueError(f"chunk_bytes must be in [1, {MAX_CHUNK_BYTES}], got {chunk_bytes}")
    if not tensors:
        raise ValueError("cannot encode an empty tensor set")
    header = fedsv_pb2.TensorSetHeader()
    arrays: list[np.ndarray] = []
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"tensor names must be non-empty strings, got {name!r}")
        arr = _to_wire_array(name, tensor)
        header.tensors.add(name=name, dtype=dtype_name(tensor.dtype), shape=[int(d) for d in tensor.shape])
        arrays.append(arr)
    data = b"".join(a.data for a in arrays)
    del arrays
    payloads = ChunkPayloads(data, chunk_bytes)
    header.total_bytes = len(data)
    header.num_chunks = len(payloads)
    header.sha256 = hashlib.sha256(data).digest()
    logger.debug(
        "encoded %d tensors, %d bytes in %d chunks", len(header.tensors), len(data), header.num_chunks
    )
    return header, payloads


def iter_chunks(header: fedsv_pb2.TensorSetHeader, payloads: Iterable[bytes]) -> Iterator[fedsv_pb2.Chunk]:
    """Wrap payloads in Chunk messages indexed 0..n-1; ValueError if their count differs from the header's."""
    count = 0
    for index, data in enumerate(payloads):
        if index >= header.num_chunks:
            raise ValueError(f"more payloads than the header's num_chunks={header.num_chunks}")
        count = index + 1
        yield fedsv_pb2.Chunk(index=index, data=bytes(data))
    if count != header.num_chunks:
        raise ValueError(f"{count} payloads for a header announcing num_chunks={header.num_chunks}")


class TensorSetAssembler:
    """Receives one tensor set: validates its header, then its chunks, then decodes it in finish()."""

    def __init__(
        self,
        header: fedsv_pb2.TensorSetHeader,
        *,
        max_total_bytes: int,
        max_chunk_bytes: int,
        expected: TensorSpecs | None = None,
        max_tensors: int | None = None,
    ) -> None:
        if max_total_bytes < 0:
            raise ValueError(f"max_total_bytes must be >= 0, got {max_total_bytes}")
        if max_chunk_bytes < 1:
            raise ValueError(f"max_chunk_bytes must be >= 1, got {max_chunk_bytes}")
        self.header = header
        self.max_total_bytes = max_total_bytes
        self.max_chunk_bytes = max_chunk_bytes
        self.max_tensors = max_tensors
        self._validate_header(expected)
        self.total_bytes = int(header.total_bytes)
        self.num_chunks = int(header.num_chunks)
        self._buf: bytearray | None = bytearray(self.total_bytes)
        self._hash = hashlib.sha256()
        self._received = 0
        self._chunks = 0
        self._finished = False

    def _validate_header(self, expected: TensorSpecs | None) -> None:
        h = self.header
        if self.max_tensors is not None and len(h.tensors) > self.max_tensors:
            raise WireError("too_many_tensors", f"{len(h.tensors)} tensors > limit of {self.max_tensors}")
        if not h.tensors:
            raise WireError("bad_header", "header announces no tensors")
        names = [s.name for s in h.tensors]
        if any(not n for n in names):
            raise WireError("bad_header", "header has a tensor with an empty name")
        if len(set(names)) != len(names):
            dups = sorted(n for n, c in Counter(names).items() if c > 1)
            raise WireError("bad_header", f"duplicate tensor names {dups}")
        if len(h.sha256) != SHA256_BYTES:
            raise WireError("bad_header", f"sha256 has {len(h.sha256)} bytes, expected {SHA256_BYTES}")
        size = tensor_set_bytes(h)
        if h.total_bytes != size:
            raise WireError("bad_header", f"total_bytes={h.total_bytes} but the specs add up to {size}")
        if size == 0:
            if h.num_chunks != 0:
                raise WireError("bad_header", f"num_chunks={h.num_chunks} for an empty tensor set")
        else:
            least = -(-size // self.max_chunk_bytes)
            if not least <= h.num_chunks <= size:
                raise WireError(
                    "bad_header",
                    f"num_chunks={h.num_chunks} inconsistent with total_bytes={size} and "
                    f"max_chunk_bytes={self.max_chunk_bytes} (needs {least}..{size})",
                )
        if size > self.max_total_bytes:
            raise WireError("too_large", f"tensor set of {size} bytes > limit of {self.max_total_bytes}")
        if expected is not None:
            got = {s.name: (s.dtype, tuple(int(d) for d in s.shape)) for s in h.tensors}
            want = {n: (d, tuple(int(x) for x in shape)) for n, (d, shape) in expected.items()}
            if got != want:
                raise WireError("unexpected_tensors", _describe_mismatch(got, want))

    @property
    def bytes_received(self) -> int:
        return self._received

    @property
    def chunks_received(self) -> int:
        return self._chunks

    @property
    def complete(self) -> bool:
        """True once every announced chunk has arrived."""
        return self._chunks == self.num_chunks

    def add(self, chunk: fedsv_pb2.Chunk) -> None:
        """Append the next chunk (index order, size and running total are checked)."""
        if self._finished or self._buf is None:
            raise WireError("bad_chunk", "chunk after the tensor set was finished")
        if chunk.index != self._chunks:
            raise WireError("bad_chunk", f"chunk index {chunk.index} out of order; expected {self._chunks}")
        if chunk.index >= self.num_chunks:
            raise WireError("bad_chunk", f"chunk {chunk.index} beyond the announced {self.num_chunks} chunks")
        n = len(chunk.data)
        if n == 0:
            raise WireError("bad_chunk", f"chunk {chunk.index} is empty")
        if n > self.max_chunk_bytes:
            raise WireError(
                "too_large", f"chunk {chunk.index} has {n} bytes > limit of {self.max_chunk_bytes}"
            )
        if self._received + n > self.total_bytes:
            raise WireError(
                "bad_chunk",
                f"chunk {chunk.index} brings the total to {self._received + n} bytes, "
                f"more than the announced {self.total_bytes}",
            )
        self._buf[self._received : self._received + n] = chunk.data
        self._hash.update(chunk.data)
        self._received += n
        self._chunks += 1

    def finish(self, *, require_finite: bool = False) -> dict[str, torch.Tensor]:
        """Check completeness and the sha256, then decode into fresh, writable tensors in header order."""
        if self._finished or self._buf is None:
            raise WireError("bad_chunk", "tensor set already finished")
        if self._received != self.total_bytes or self._chunks != self.num_chunks:
            raise WireError(
                "incomplete",
                f"received {self._received}/{self.total_bytes} bytes "
                f"in {self._chunks}/{self.num_chunks} chunks",
            )
        if self._hash.digest() != self.header.sha256:
            raise WireError("checksum_mismatch", "sha256 of the received bytes differs from the header's")
        self._finished = True
        buf, self._buf = self._buf, None
        out: dict[str, torch.Tensor] = {}
        offset = 0
        for spec in self.header.tensors:
            out[spec.name] = _decode_one(buf, offset, spec)
            offset += _spec_bytes(spec)
        del buf
        if require_finite:
            bad = [n for n, t in out.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
            if bad:
                raise WireError("non_finite", f"NaN or Inf in tensors {bad}")
        return out


def _decode_one(buf: bytearray, offset: int, spec: fedsv_pb2.TensorSpec) -> torch.Tensor:
    dt = DTYPES[spec.dtype]
    shape = tuple(int(d) for d in spec.shape)
    count = math.prod(shape)
    if count == 0:
        return torch.empty(shape, dtype=dt.torch_dtype)
    raw = np.frombuffer(buf, dtype=dt.wire, count=count, offset=offset)
    # bool: normalise any non-zero byte to True; others: a native-order, aligned, writable copy.
    arr = raw != 0 if dt.torch_dtype == torch.bool else raw.astype(dt.wire.newbyteorder("="))
    t = torch.from_numpy(arr.reshape(shape))
    if dt.torch_dtype == torch.bfloat16:
        t = t.view(torch.bfloat16)
    return t


def _describe_mismatch(
    got: Mapping[str, tuple[str, tuple[int, ...]]], want: Mapping[str, tuple[str, tuple[int, ...]]]
) -> str:
    parts: list[str] = []
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    if missing:
        parts.append(f"missing {missing}")
    if extra:
        parts.append(f"unexpected {extra}")
    for name in sorted(set(got) & set(want)):
        if got[name] != want[name]:
            (gd, gs), (wd, ws) = got[name], want[name]
            parts.append(f"{name!r} is {gd}{list(gs)}, expected {wd}{list(ws)}")
    return "; ".join(parts)


def decode_tensor_set(
    header: fedsv_pb2.TensorSetHeader,
    chunks: Iterable[fedsv_pb2.Chunk],
    *,
    max_total_bytes: int,
    max_chunk_bytes: int,
    expected: TensorSpecs | None = None,
    require_finite: bool = False,
) -> dict[str, torch.Tensor]:
    """Assemble and decode a whole tensor set from its header and chunks (see TensorSetAssembler)."""
    asm = TensorSetAssembler(
        header, max_total_bytes=max_total_bytes, max_chunk_bytes=max_chunk_bytes, expected=expected
    )
    for chunk in chunks:
        asm.add(chunk)
    return asm.finish(require_finite=require_finite)
