"""Tensor codec: bit-exact round trips, bounded chunks, and a WireError reason for every malformed stream."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsv.wire.codec import (
    DTYPES,
    WIRE_ERROR_REASONS,
    TensorSetAssembler,
    WireError,
    decode_tensor_set,
    encode_tensor_set,
    iter_chunks,
    spec_of,
    tensor_set_bytes,
)
from fedsv.wire.limits import DEFAULT_CHUNK_BYTES, MAX_CHUNK_BYTES
from fedsv.wire.v1 import fedsv_pb2

BIG = 1 << 30


def raw_bits(t: torch.Tensor) -> bytes:
    """The tensor's raw bytes, for bit-exact comparisons (NaN payloads and -0.0 included)."""
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert a[name].shape == b[name].shape, name
        assert raw_bits(a[name]) == raw_bits(b[name]), name


def roundtrip(
    tensors: dict[str, torch.Tensor], chunk_bytes: int = DEFAULT_CHUNK_BYTES, **kwargs: object
) -> dict[str, torch.Tensor]:
    header, payloads = encode_tensor_set(tensors, chunk_bytes)
    return decode_tensor_set(
        header,
        iter_chunks(header, payloads),
        max_total_bytes=BIG,
        max_chunk_bytes=chunk_bytes,
        **kwargs,  # type: ignore[arg-type]
    )


def sample_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "f32": torch.randn(3, 5, generator=g),
        "f64": torch.tensor([-0.0, float("nan"), float("inf"), -float("inf"), 5e-324], dtype=torch.float64),
        "f16": torch.randn(7, generator=g).to(torch.float16),
        "bf16": torch.randn(2, 3, 4, generator=g).to(torch.bfloat16),
        "i64": torch.tensor([-(2**63), 2**63 - 1, 0, -1], dtype=torch.int64),
        "i32": torch.randint(-(2**31), 2**31 - 1, (4, 1), generator=g, dtype=torch.int32),
        "u8": torch.arange(256, dtype=torch.uint8).reshape(16, 16),
        "bool": torch.tensor([[True, False, True]]),
        "scalar": torch.tensor(3.25),
        "scalar_bool": torch.tensor(True),
        "empty": torch.empty(0, 3),
        "empty_mid": torch.empty(2, 0, 4, dtype=torch.int64),
        "odd": torch.randn(1, 1, 3, 1, generator=g, dtype=torch.float64),
    }


# ----------------------------------------------------------------------------- round trips


def test_all_dtypes_and_odd_shapes_roundtrip_bit_exact() -> None:
    tensors = sample_tensors()
    assert {spec[0] for spec in spec_of(tensors).values()} == set(DTYPES)
    for chunk in (1, 7, 64, DEFAULT_CHUNK_BYTES):
        out = roundtrip(tensors, chunk)
        assert_same(tensors, out)
    out["f32"].add_(1.0)  # decoded tensors are fresh and writable
    out["u8"][0, 0] = 9
    assert out["scalar"].shape == () and out["empty"].shape == (0, 3)


def test_header_describes_tensors() -> None:
    tensors = sample_tensors()
    header, payloads = encode_tensor_set(tensors, 100)
    assert [s.name for s in header.tensors] == list(tensors)
    assert {s.name: (s.dtype, tuple(s.shape)) for s in header.tensors} == spec_of(tensors)
    assert (
        header.total_bytes
        == tensor_set_bytes(header)
        == sum(t.numel() * t.element_size() for t in tensors.values())
    )
    assert header.num_chunks == len(payloads) == -(-header.total_bytes // 100)
    data = b"".join(payloads)
    assert len(data) == header.total_bytes
    assert header.sha256 == hashlib.sha256(data).digest()
    assert all(len(p) == 100 for p in list(payloads)[:-1]) and 0 < len(payloads[-1]) <= 100


def test_wire_bytes_are_little_endian() -> None:
    _, payloads = encode_tensor_set(
        {
            "a": torch.tensor([1.5], dtype=torch.float32),
            "b": torch.tensor([0x0102030405060708], dtype=torch.int64),
            "c": torch.tensor([1.0], dtype=torch.bfloat16),
            "d": torch.tensor([True, False]),
        }
    )
    assert b"".join(payloads) == struct.pack("<f", 1.5) + struct.pack("<q", 0x0102030405060708) + struct.pack(
        "<H", 0x3F80
    ) + bytes([1, 0])


def test_noncontiguous_grad_and_snapshot() -> None:
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    w = torch.nn.Parameter(torch.randn(4, 4))
    tensors = {"t": base.t(), "w": w, "slice": base[:, 1]}
    header, payloads = encode_tensor_set(tensors, 16)
    expected = {k: v.detach().clone() for k, v in tensors.items()}
    with torch.no_grad():
        base.zero_()  # payloads are a snapshot: later changes to the tensors do not leak in
        w.zero_()
    for _ in range(2):  # and the same payloads can be sent twice (e.g. to several participants)
        out = decode_tensor_set(
            header, iter_chunks(header, payloads), max_total_bytes=BIG, max_chunk_bytes=16
        )
        assert_same(expected, out)
        assert not out["w"].requires_grad


def test_big_model_roundtrips_in_many_bounded_chunks() -> None:
    g = torch.Generator().manual_seed(1)
    model = {"fc1.weight": torch.randn(5_000_000, generator=g), "fc1.bias": torch.randn(17, generator=g)}
    header, payloads = encode_tensor_set(model)
    assert header.total_bytes > 16 << 20
    assert header.num_chunks == len(payloads) > 16
    asm = TensorSetAssembler(
        header, max_total_bytes=32 << 20, max_chunk_bytes=DEFAULT_CHUNK_BYTES, expected=spec_of(model)
    )
    for chunk in iter_chunks(header, payloads):
        assert len(chunk.data) <= DEFAULT_CHUNK_BYTES
        assert chunk.ByteSize() < 4 << 20  # the message limit of gRPC peers with default settings
        asm.add(chunk)
    assert asm.complete and asm.bytes_received == header.total_bytes
    out = asm.finish(require_finite=True)
    assert torch.equal(out["fc1.weight"], model["fc1.weight"])
    assert torch.equal(out["fc1.bias"], model["fc1.bias"])


_DTYPE_NAMES = sorted(DTYPES)
_NAMES = st.text(alphabet="abcdefghij._0123456789", min_size=1, max_size=12)


@st.composite
def tensor_dicts(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    names = draw(st.lists(_NAMES, min_size=1, max_size=5, unique=True))
    out: dict[str, torch.Tensor] = {}
    for name in names:
        dt = DTYPES[draw(st.sampled_from(_DTYPE_NAMES))]
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        n = int(np.prod(shape, dtype=np.int64))
        raw = draw(st.binary(min_size=n * dt.itemsize, max_size=n * dt.itemsize))
        arr = np.frombuffer(raw, dtype=dt.wire).copy()
        if dt.torch_dtype == torch.bool:
            arr = (arr % 2).astype(np.bool_)
        t = torch.from_numpy(arr.astype(arr.dtype.newbyteorder("="))).reshape(shape)
        if dt.torch_dtype == torch.bfloat16:
            t = t.view(torch.bfloat16)
        out[name] = t
    return out


@settings(max_examples=60, deadline=None)
@given(tensors=tensor_dicts(), chunk_bytes=st.integers(1, 300))
def test_property_random_tensor_sets_roundtrip(tensors: dict[str, torch.Tensor], chunk_bytes: int) -> None:
    header, payloads = encode_tensor_set(tensors, chunk_bytes)
    assert all(1 <= len(p) <= chunk_bytes for p in payloads)
    out = decode_tensor_set(
        header,
        iter_chunks(header, payloads),
        max_total_bytes=header.total_bytes,
        max_chunk_bytes=chunk_bytes,
        expected=spec_of(tensors),
    )
    assert_same(tensors, out)


# ----------------------------------------------------------------------------- malformed streams


def _small() -> dict[str, torch.Tensor]:
    return {"w": torch.arange(40, dtype=torch.float32), "b": torch.ones(3, dtype=torch.int64)}


def _run(
    header: fedsv_pb2.TensorSetHeader,
    chunks: list[fedsv_pb2.Chunk],
    *,
    max_total_bytes: int = BIG,
    max_chunk_bytes: int = 64,
    expected: dict[str, tuple[str, tuple[int, ...]]] | None = None,
    require_finite: bool = False,
) -> dict[str, torch.Tensor]:
    return decode_tensor_set(
        header,
        chunks,
        max_total_bytes=max_total_bytes,
        max_chunk_bytes=max_chunk_bytes,
        expected=expected,
        require_finite=require_finite,
    )


def _encoded(
    tensors: dict[str, torch.Tensor] | None = None, chunk: int = 64
) -> tuple[fedsv_pb2.TensorSetHeader, list[fedsv_pb2.Chunk]]:
    header, payloads = encode_tensor_set(tensors if tensors is not None else _small(), chunk)
    return header, list(iter_chunks(header, payloads))


def _edited_header(edit: Callable[[fedsv_pb2.TensorSetHeader], None]) -> Callable[[], object]:
    def case() -> object:
        header, chunks = _encoded()
        edit(header)
        return _run(header, chunks)

    return case


def _dup(h: fedsv_pb2.TensorSetHeader) -> None:
    h.tensors[1].name = h.tensors[0].name


def _clear(h: fedsv_pb2.TensorSetHeader) -> None:
    del h.tensors[:]


def _set(field: str, value: object) -> Callable[[fedsv_pb2.TensorSetHeader], None]:
    def edit(h: fedsv_pb2.TensorSetHeader) -> None:
        setattr(h, field, value)

    return edit


def _set_spec(field: str, value: str | list[int]) -> Callable[[fedsv_pb2.TensorSetHeader], None]:
    def edit(h: fedsv_pb2.TensorSetHeader) -> None:
        if isinstance(value, list):
            del h.tensors[0].shape[:]
            h.tensors[0].shape.extend(value)
        else:
            setattr(h.tensors[0], field, value)

    return edit


def _out_of_order() -> object:
    header, chunks = _encoded()
    chunks[0], chunks[1] = chunks[1], chunks[0]
    return _run(header, chunks)


def _skipped_chunk() -> object:
    header, chunks = _encoded()
    del chunks[1]
    return _run(header, chunks)


def _oversize_chunk() -> object:
    header, chunks = _encoded(chunk=64)
    merged = fedsv_pb2.Chunk(index=0, data=chunks[0].data + chunks[1].data)
    return _run(header, [merged, *chunks[2:]])


def _more_bytes_than_announced() -> object:
    header, chunks = _encoded(chunk=64)
    chunks[-1].data = chunks[-1].data + b"\0" * 8
    return _run(header, chunks)


def _extra_chunk() -> object:
    header, chunks = _encoded(chunk=64)
    return _run(header, [*chunks, fedsv_pb2.Chunk(index=len(chunks), data=b"x")])


def _empty_chunk() -> object:
    header, chunks = _encoded(chunk=64)
    return _run(header, [fedsv_pb2.Chunk(index=0, data=b""), *chunks])


def _truncated() -> object:
    header, chunks = _encoded()
    return _run(header, chunks[:-1])


def _short_last_chunk() -> object:
    header, chunks = _encoded()
    chunks[-1].data = chunks[-1].data[:-1]
    return _run(header, chunks)


def _no_chunks() -> object:
    header, _ = _encoded()
    return _run(header, [])


def _flipped_byte() -> object:
    header, chunks = _encoded()
    data = bytearray(chunks[1].data)
    data[5] ^= 0x01
    chunks[1].data = bytes(data)
    return _run(header, chunks)


def _wrong_digest() -> object:
    header, chunks = _encoded()
    header.sha256 = hashlib.sha256(b"something else").digest()
    return _run(header, chunks)


def _too_large() -> object:
    header, chunks = _encoded()
    return _run(header, chunks, max_total_bytes=header.total_bytes - 1)


def _too_many_tensors() -> object:
    header, _ = _encoded()  # two tensors, one allowed: refused before any size check
    return TensorSetAssembler(header, max_total_bytes=0, max_chunk_bytes=64, max_tensors=1)


def _expected(edit: Callable[[dict[str, tuple[str, tuple[int, ...]]]], object]) -> Callable[[], object]:
    def case() -> object:
        header, chunks = _encoded()
        want = spec_of(_small())
        edit(want)
        return _run(header, chunks, expected=want)

    return case


def _non_finite(value: float, dtype: torch.dtype) -> Callable[[], object]:
    def case() -> object:
        t = torch.zeros(10, dtype=dtype)
        t[7] = value
        header, chunks = _encoded({"ok": torch.ones(2), "bad": t})
        return _run(header, chunks, require_finite=True)

    return case


CASES: list[tuple[str, str, Callable[[], object]]] = [
    ("bad_header", "no tensors", _edited_header(_clear)),
    ("bad_header", "duplicate names", _edited_header(_dup)),
    ("bad_header", "empty name", _edited_header(_set_spec("name", ""))),
    ("bad_header", "unknown dtype", _edited_header(_set_spec("dtype", "complex64"))),
    ("bad_header", "negative dim", _edited_header(_set_spec("shape", [-40]))),
    ("bad_header", "total_bytes off", _edited_header(_set("total_bytes", 999))),
    ("bad_header", "too few chunks", _edited_header(_set("num_chunks", 1))),
    ("bad_header", "too many chunks", _edited_header(_set("num_chunks", 10_000))),
    ("bad_header", "short digest", _edited_header(_set("sha256", b"abc"))),
    ("bad_header", "shape changes size", _edited_header(_set_spec("shape", [41]))),
    ("unexpected_tensors", "missing", _expected(lambda w: w.update(extra=("float32", (1,))))),
    ("unexpected_tensors", "extra", _expected(lambda w: w.pop("b"))),
    ("unexpected_tensors", "dtype", _expected(lambda w: w.update(w=("int32", (40,))))),
    ("unexpected_tensors", "shape", _expected(lambda w: w.update(w=("float32", (4, 10))))),
    ("too_large", "over the limit", _too_large),
    ("too_many_tensors", "over the limit", _too_many_tensors),
    ("bad_chunk", "out of order", _out_of_order),
    ("bad_chunk", "skipped", _skipped_chunk),
    ("too_large", "oversize", _oversize_chunk),
    ("bad_chunk", "more bytes than announced", _more_bytes_than_announced),
    ("bad_chunk", "extra chunk", _extra_chunk),
    ("bad_chunk", "empty chunk", _empty_chunk),
    ("incomplete", "truncated stream", _truncated),
    ("incomplete", "short last chunk", _short_last_chunk),
    ("incomplete", "no chunks", _no_chunks),
    ("checksum_mismatch", "flipped byte", _flipped_byte),
    ("checksum_mismatch", "wrong digest", _wrong_digest),
    ("non_finite", "nan float32", _non_finite(float("nan"), torch.float32)),
    ("non_finite", "inf float16", _non_finite(float("inf"), torch.float16)),
    ("non_finite", "-inf bfloat16", _non_finite(-float("inf"), torch.bfloat16)),
    ("non_finite", "nan float64", _non_finite(float("nan"), torch.float64)),
]


@pytest.mark.parametrize(
    ("reason", "case"), [(r, c) for r, _, c in CASES], ids=[f"{r}-{d}" for r, d, _ in CASES]
)
def test_malformed_stream_raises_wire_error(reason: str, case: Callable[[], object]) -> None:
    with pytest.raises(WireError) as info:
        case()
    assert info.value.reason == reason, str(info.value)
    assert str(info.value).startswith(f"{reason}: ") and info.value.message


def test_every_reason_is_exercised() -> None:
    assert {r for r, _, _ in CASES} == set(WIRE_ERROR_REASONS)


def test_require_finite_off_and_integer_tensors() -> None:
    t = torch.tensor([1.0, float("nan"), float("inf")])
    header, chunks = _encoded({"t": t, "i": torch.tensor([2**62])})
    out = _run(header, chunks)
    assert raw_bits(out["t"]) == raw_bits(t)
    header, chunks = _encoded({"i": torch.tensor([2**62]), "m": torch.tensor([True])})
    assert _run(header, chunks, require_finite=True)["i"].item() == 2**62


def test_assembler_rejects_use_after_finish() -> None:
    header, chunks = _encoded()
    asm = TensorSetAssembler(header, max_total_bytes=BIG, max_chunk_bytes=64)
    assert asm.chunks_received == 0 and not asm.complete
    for c in chunks:
        asm.add(c)
    asm.finish()
    with pytest.raises(WireError, match="finished") as info:
        asm.add(chunks[0])
    assert info.value.reason == "bad_chunk"
    with pytest.raises(WireError, match="finished"):
        asm.finish()


def test_all_empty_tensor_set_has_no_chunks() -> None:
    tensors = {"e": torch.empty(0), "f": torch.empty(3, 0, dtype=torch.uint8)}
    header, payloads = encode_tensor_set(tensors)
    assert header.total_bytes == 0 and header.num_chunks == 0 and len(payloads) == 0
    assert_same(tensors, roundtrip(tensors))
    header.num_chunks = 1
    with pytest.raises(WireError) as info:
        TensorSetAssembler(header, max_total_bytes=BIG, max_chunk_bytes=64)
    assert info.value.reason == "bad_header"


def test_encoder_and_api_misuse() -> None:
    with pytest.raises(ValueError, match="empty"):
        encode_tensor_set({})
    with pytest.raises(ValueError, match="not supported"):
        encode_tensor_set({"c": torch.zeros(2, dtype=torch.complex64)})
    with pytest.raises(ValueError, match="not supported"):
        spec_of({"s": torch.zeros(2, dtype=torch.int16)})
    with pytest.raises(ValueError, match="chunk_bytes"):
        encode_tensor_set(_small(), 0)
    with pytest.raises(ValueError, match="chunk_bytes"):
        encode_tensor_set(_small(), MAX_CHUNK_BYTES + 1)
    with pytest.raises(ValueError, match="non-empty"):
        encode_tensor_set({"": torch.zeros(1)})
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        encode_tensor_set({"x": np.zeros(2)})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="dense"):
        encode_tensor_set({"s": torch.zeros(3, 3).to_sparse()})
    header, payloads = encode_tensor_set(_small(), 64)
    with pytest.raises(ValueError, match="payloads"):
        list(iter_chunks(header, list(payloads)[:-1]))
    with pytest.raises(ValueError, match="payloads"):
        list(iter_chunks(header, [*payloads, b"x"]))
    with pytest.raises(ValueError, match="unknown WireError reason"):
        WireError("nope", "x")
    with pytest.raises(ValueError, match="max_chunk_bytes"):
        TensorSetAssembler(header, max_total_bytes=BIG, max_chunk_bytes=0)
