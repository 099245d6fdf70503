"""A participant that stalls mid-upload: plays one rank honestly, sends its update's header and a few
chunks, writes a marker file, then blocks forever (until the test SIGKILLs it).

    python tests/fault_client.py --coordinator HOST:PORT --rank R --world-size N --chunks K --ready FILE \
        (--insecure | --tls-dir DIR)
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import torch

from fedsv.participant.host import run_alone
from fedsv.participant.worker import Metadata, RankWorker
from fedsv.wire.v1 import fedsv_pb2


class StallingWorker(RankWorker):
    """A RankWorker whose update stream stalls after the header and `chunks` chunks."""

    def __init__(
        self, target: str, rank: int, world_size: int, chunks: int, ready: Path, tls_dir: str = ""
    ) -> None:
        super().__init__(target, rank, world_size, tls_dir=tls_dir)
        self.chunks, self.ready = chunks, ready

    async def _send(
        self, stub: Any, messages: Iterator[fedsv_pb2.UpdateMessage], timeout: float, metadata: Metadata
    ) -> fedsv_pb2.SubmitReply:
        async def stalled() -> AsyncIterator[fedsv_pb2.UpdateMessage]:
            for index, message in enumerate(messages):
                if index > self.chunks:  # gRPC asks for the next message once the last one went out
                    self.ready.write_text(f"{self.chunks}\n")
                    await asyncio.Event().wait()
                yield message

        reply: fedsv_pb2.SubmitReply = await stub.SubmitUpdate(stalled(), timeout=None, metadata=metadata)
        return reply


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--chunks", type=int, required=True, help="delta chunks to send before stalling")
    parser.add_argument("--ready", type=Path, required=True, help="written once the stream stalls")
    parser.add_argument("--tls-dir", default="", help="as for python -m fedsv.participant")
    parser.add_argument("--insecure", action="store_true", help="plaintext gRPC (no TLS)")
    args = parser.parse_args()
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)
    if bool(args.tls_dir) == args.insecure:
        parser.error("choose --tls-dir DIR or --insecure")
    worker = StallingWorker(
        args.coordinator, args.rank, args.world_size, args.chunks, args.ready, tls_dir=args.tls_dir
    )
    print(f"fault client: rank {args.rank} ended: {run_alone(worker)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
