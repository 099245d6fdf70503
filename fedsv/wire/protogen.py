"""Generate (or check) the committed protobuf and gRPC Python code from proto/ with grpc_tools.protoc.

protoc names a generated module after its .proto's path (proto/fedsv/v1/fedsv.proto -> fedsv.v1), but the
Python code lives in the wire package: every output under fedsv/ moves to fedsv/wire/, and only the
Python import paths follow it. Wire names (package fedsv.v1, service /fedsv.v1.Coordinator) stay as the
.proto says.
"""

from __future__ import annotations

import argparse
import importlib.resources
import logging
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
PROTO_ROOT = REPO_ROOT / "proto"
GENERATED_SUFFIXES: tuple[str, ...] = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
# protoc's output folder (from the .proto path) -> the Python package folder it is committed in.
PROTO_PREFIX, PYTHON_PREFIX = "fedsv", "fedsv/wire"


def python_path(rel: Path) -> Path:
    """Where protoc's output `rel` (e.g. fedsv/v1/fedsv_pb2.py) lives in the Python tree."""
    parts = rel.parts
    if not parts or parts[0] != PROTO_PREFIX:
        raise ValueError(f"{rel}: protos must live under proto/{PROTO_PREFIX}/")
    return Path(PYTHON_PREFIX, *parts[1:])


def _relocate_imports(text: str) -> str:
    """Point the generated code's own module paths (imports, the builder's module name) at fedsv.wire.

    Only whole import statements and the module-name string are touched: the serialized descriptor and
    the method paths keep the wire names.
    """
    old, new = PROTO_PREFIX + ".", PYTHON_PREFIX.replace("/", ".") + "."
    text = re.sub(rf"^(from|import) {re.escape(old)}", rf"\1 {new}", text, flags=re.M)
    return re.sub(rf"(BuildTopDescriptorsAndMessages\(DESCRIPTOR, '){re.escape(old)}", rf"\1{new}", text)


def proto_files(proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Every .proto under proto_root, sorted, as paths relative to proto_root."""
    if not proto_root.is_dir():
        raise FileNotFoundError(f"proto directory not found: {proto_root}")
    files = sorted(p.relative_to(proto_root) for p in proto_root.rglob("*.proto"))
    if not files:
        raise FileNotFoundError(f"no .proto files under {proto_root}")
    return files


def expected_outputs(proto_root: Path = PROTO_ROOT) -> list[Path]:
    """The generated files (relative to the output root) that the protos under proto_root produce."""
    out: list[Path] = []
    for rel in proto_files(proto_root):
        stem = rel.with_suffix("")
        out.extend(python_path(stem.parent / f"{stem.name}{suffix}") for suffix in GENERATED_SUFFIXES)
    return out


def generate(out_dir: Path, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Run protoc on every .proto under proto_root into out_dir; return the generated files (relative)."""
    from grpc_tools import protoc

    proto_root = proto_root.resolve()
    out_dir = Path(out_dir).resolve()
    bundled = Path(str(importlib.resources.files("grpc_tools") / "_proto"))
    files = proto_files(proto_root)
    with tempfile.TemporaryDirectory(prefix="fedsv-protoc-") as raw:
        args = [
            "grpc_tools.protoc",
            f"-I{proto_root}",
            f"-I{bundled}",
            f"--python_out={raw}",
            f"--pyi_out={raw}",
            f"--grpc_python_out={raw}",
            *(str(proto_root / rel) for rel in files),
        ]
        logger.debug("running %s", " ".join(args))
        rc = protoc.main(args)
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit status {rc} on {', '.join(map(str, files))}")
        written = sorted(p.relative_to(raw) for p in Path(raw).rglob("*") if p.is_file())
        outputs = expected_outputs(proto_root)
        missing = [str(p) for p in outputs if p not in {python_path(w) for w in written}]
        if missing:
            raise RuntimeError(f"protoc did not write {', '.join(missing)}")
        for rel in written:
            target = out_dir / python_path(rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(_relocate_imports((Path(raw) / rel).read_text()))
    return outputs


def _stale_outputs(out_dir: Path, outputs: Sequence[Path]) -> list[Path]:
    """Generated-looking files next to the expected outputs that no .proto produces any more."""
    wanted = set(outputs)
    stale: set[Path] = set()
    for folder in {p.parent for p in outputs}:
        target = out_dir / folder
        if not target.is_dir():
            continue
        for f in target.iterdir():
            rel = f.relative_to(out_dir)
            if f.is_file() and f.name.endswith(GENERATED_SUFFIXES) and rel not in wanted:
                stale.add(rel)
    return sorted(stale)


def check(out_dir: Path = REPO_ROOT, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Regenerate into a temp dir; return the files under out_dir that differ (empty when in sync)."""
    out_dir = Path(out_dir).resolve()
    with tempfile.TemporaryDirectory(prefix="fedsv-protogen-") as tmp:
        outputs = generate(Path(tmp), proto_root)
        differing = [
            rel
            for rel in outputs
            if not (out_dir / rel).is_file() or (out_dir / rel).read_bytes() != (Path(tmp) / rel).read_bytes()
        ]
    return sorted(differing + _stale_outputs(out_dir, outputs))


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: generate into --out (default the repo root), or --check the committed code."""
    parser = argparse.ArgumentParser(prog="python -m fedsv.wire.protogen", description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="output root (default: the repo root)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="generate into a temp dir and exit 1 if the files under --out differ",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.check:
            differing = check(args.out)
            if differing:
                print(
                    "generated code is out of date (run python -m fedsv.wire.protogen): "
                    + ", ".join(str(p) for p in differing),
                    file=sys.stderr,
                )
                return 1
            logger.info("generated code under %s is up to date", args.out)
            return 0
        written = generate(args.out)
    except (OSError, RuntimeError) as exc:
        print(f"protogen: {exc}", file=sys.stderr)
        return 2
    logger.info("wrote %s", ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
