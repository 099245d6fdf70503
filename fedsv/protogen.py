"""Generate (or check) the committed protobuf and gRPC Python code from proto/ with grpc_tools.protoc."""

from __future__ import annotations

import argparse
import importlib.resources
import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO_ROOT / "proto"
GENERATED_SUFFIXES: tuple[str, ...] = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


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
        out.extend(stem.parent / f"{stem.name}{suffix}" for suffix in GENERATED_SUFFIXES)
    return out


def generate(out_dir: Path, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Run protoc on every .proto under proto_root into out_dir; return the generated files (relative)."""
    from grpc_tools import protoc

    proto_root = proto_root.resolve()
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    bundled = Path(str(importlib.resources.files("grpc_tools") / "_proto"))
    files = proto_files(proto_root)
    args = [
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"-I{bundled}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(proto_root / rel) for rel in files),
    ]
    logger.debug("running %s", " ".join(args))
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit status {rc} on {', '.join(map(str, files))}")
    outputs = expected_outputs(proto_root)
    missing = [str(p) for p in outputs if not (out_dir / p).is_file()]
    if missing:
        raise RuntimeError(f"protoc did not write {', '.join(missing)}")
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
    parser = argparse.ArgumentParser(prog="python -m fedsv.protogen", description=__doc__)
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
                    "generated code is out of date (run python -m fedsv.protogen): "
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
