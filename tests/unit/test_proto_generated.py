"""The committed fedsv/wire/v1 code is exactly what fedsv.wire.protogen makes from proto/, and imports."""

from __future__ import annotations

import importlib
from pathlib import Path

from fedsv.wire import protogen

GENERATED_DIR = protogen.REPO_ROOT / "fedsv" / "wire" / "v1"


def _generated_files(root: Path) -> set[Path]:
    return {
        p.relative_to(root)
        for p in (root / "fedsv" / "wire" / "v1").iterdir()
        if p.is_file() and p.name.endswith(protogen.GENERATED_SUFFIXES)
    }


def test_regenerated_code_is_byte_identical(tmp_path: Path) -> None:
    written = protogen.generate(tmp_path)
    assert {Path("fedsv/wire/v1/fedsv_pb2.py"), Path("fedsv/wire/v1/fedsv_pb2_grpc.py")} <= set(written)
    assert _generated_files(tmp_path) == _generated_files(protogen.REPO_ROOT) == set(written)
    for rel in written:
        committed = protogen.REPO_ROOT / rel
        assert committed.is_file(), f"{rel} is not committed"
        assert committed.read_bytes() == (tmp_path / rel).read_bytes(), (
            f"{rel} differs from freshly generated code; run python -m fedsv.wire.protogen"
        )


def test_check_reports_differing_and_stale_files(tmp_path: Path) -> None:
    protogen.generate(tmp_path)
    assert protogen.check(tmp_path) == []
    assert protogen.main(["--check", "--out", str(tmp_path)]) == 0
    pb2 = tmp_path / "fedsv" / "wire" / "v1" / "fedsv_pb2.py"
    pb2.write_bytes(pb2.read_bytes() + b"# edited\n")
    (tmp_path / "fedsv" / "wire" / "v1" / "old_pb2.py").write_text("# stale\n")
    (tmp_path / "fedsv" / "wire" / "v1" / "fedsv_pb2_grpc.py").unlink()
    assert protogen.check(tmp_path) == [
        Path("fedsv/wire/v1/fedsv_pb2.py"),
        Path("fedsv/wire/v1/fedsv_pb2_grpc.py"),
        Path("fedsv/wire/v1/old_pb2.py"),
    ]
    assert protogen.main(["--check", "--out", str(tmp_path)]) == 1


def test_generated_module_has_coordinator_service() -> None:
    from fedsv.wire.v1 import fedsv_pb2

    # Imported by name: the generated gRPC module has no type stubs and is not checked by mypy.
    fedsv_pb2_grpc = importlib.import_module("fedsv.wire.v1.fedsv_pb2_grpc")

    service = fedsv_pb2.DESCRIPTOR.services_by_name["Coordinator"]
    methods = service.methods_by_name
    assert set(methods) == {"Join", "Subscribe", "SubmitUpdate"}
    assert not methods["Join"].client_streaming and not methods["Join"].server_streaming
    assert methods["Subscribe"].server_streaming and not methods["Subscribe"].client_streaming
    assert methods["SubmitUpdate"].client_streaming and not methods["SubmitUpdate"].server_streaming
    assert fedsv_pb2.DESCRIPTOR.package == "fedsv.v1"
    for name in ("CoordinatorStub", "CoordinatorServicer", "add_CoordinatorServicer_to_server"):
        assert hasattr(fedsv_pb2_grpc, name), name
    # The generated imports resolve inside the fedsv package, not to a top-level module.
    assert fedsv_pb2_grpc.fedsv_dot_v1_dot_fedsv__pb2 is fedsv_pb2
