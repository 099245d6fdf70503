"""Rank assignment: rank-list specs, every launcher's environment, precedence, blocks, and a real mpirun."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsv.participant.ranks import RankAssignment, block_of, detect_rank_env, parse_ranks, resolve_ranks

REPO = Path(__file__).resolve().parents[2]


# --- parse_ranks ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("3", (3,)),
        ("0-24", tuple(range(25))),
        ("0-4,10,12-13", (0, 1, 2, 3, 4, 10, 12, 13)),
        (" 12-13 , 0-1 ,4", (0, 1, 4, 12, 13)),
        ("5,5,4-6", (4, 5, 6)),
        ("7-7", (7,)),
    ],
)
def test_parse_ranks(spec: str, expected: tuple[int, ...]) -> None:
    assert parse_ranks(spec, 25) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("5-2", "bad rank range '5-2' in '5-2': start 5 is after end 2"),
        ("a", "bad rank range 'a'"),
        ("30", "rank 30 in '30' is out of range for world size 20"),
        ("0-20", "rank 20 in '0-20' is out of range for world size 20"),
        ("", "empty rank list"),
        ("1,,2", "bad rank range ''"),
        ("-1", "bad rank range '-1'"),
        ("1-", "bad rank range '1-'"),
        ("1-2-3", "bad rank range '1-2-3'"),
        ("+3", "bad rank range '+3'"),
        ("1.5", "bad rank range '1.5'"),
    ],
)
def test_parse_ranks_rejects(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        parse_ranks(spec, 20)


def test_parse_ranks_rejects_bad_world_size() -> None:
    with pytest.raises(ValueError, match="world size must be a positive integer"):
        parse_ranks("0", 0)


def _world_and_ranks(n: int) -> st.SearchStrategy[tuple[int, set[int]]]:
    return st.tuples(st.just(n), st.sets(st.integers(0, n - 1), min_size=1))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 200).flatmap(_world_and_ranks))
def test_parse_ranks_round_trips(case: tuple[int, set[int]]) -> None:
    world_size, chosen = case
    spec = ",".join(str(r) for r in sorted(chosen, reverse=True))
    assert parse_ranks(spec, world_size) == tuple(sorted(chosen))


# --- detect_rank_env: every launcher --------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"}, (2, 4, "openmpi")),
        ({"PMIX_RANK": "1", "PMIX_SIZE": "3"}, (1, 3, "pmix")),
        ({"PMIX_RANK": "1", "OMPI_COMM_WORLD_SIZE": "5"}, (1, 5, "pmix")),
        ({"PMI_RANK": "0", "PMI_SIZE": "2"}, (0, 2, "mpich")),
        ({"SLURM_PROCID": "7", "SLURM_NTASKS": "8"}, (7, 8, "slurm")),
        ({"JOB_COMPLETION_INDEX": "4", "FEDSV_WORLD_SIZE": "10"}, (4, 10, "kubernetes")),
        ({"RANK": "3", "WORLD_SIZE": "6"}, (3, 6, "torchrun")),
        ({"RANK": " 3 ", "WORLD_SIZE": "6\n"}, (3, 6, "torchrun")),
    ],
)
def test_detect_each_launcher(environ: dict[str, str], expected: tuple[int, int, str]) -> None:
    assert detect_rank_env(environ) == expected


def test_detect_nothing() -> None:
    assert detect_rank_env({}) is None
    assert detect_rank_env({"PATH": "/usr/bin", "RANK": ""}) is None


def test_detect_order_openmpi_first() -> None:
    environ = {
        "RANK": "0", "WORLD_SIZE": "2",
        "SLURM_PROCID": "5", "SLURM_NTASKS": "9",
        "PMI_RANK": "4", "PMI_SIZE": "9",
        "PMIX_RANK": "3", "PMIX_SIZE": "9",
        "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4",
    }  # fmt: skip
    assert detect_rank_env(environ) == (1, 4, "openmpi")
    del environ["OMPI_COMM_WORLD_RANK"]
    assert detect_rank_env(environ) == (3, 4, "pmix")  # Open MPI's size is preferred for PMIx
    del environ["OMPI_COMM_WORLD_SIZE"]
    assert detect_rank_env(environ) == (3, 9, "pmix")
    del environ["PMIX_RANK"]
    assert detect_rank_env(environ) == (4, 9, "mpich")
    del environ["PMI_RANK"]
    assert detect_rank_env(environ) == (5, 9, "slurm")
    del environ["SLURM_PROCID"]
    assert detect_rank_env(environ) == (0, 2, "torchrun")


def test_detect_pmix_without_size_is_skipped() -> None:
    assert detect_rank_env({"PMIX_RANK": "2"}) is None
    assert detect_rank_env({"PMIX_RANK": "2", "SLURM_PROCID": "2", "SLURM_NTASKS": "4"}) == (2, 4, "slurm")


def test_detect_kubernetes_without_world_size_hints(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="fedsv.participant.ranks"):
        assert detect_rank_env({"JOB_COMPLETION_INDEX": "3"}) is None
    assert "FEDSV_WORLD_SIZE" in caplog.text and "completions" in caplog.text
    environ = {"JOB_COMPLETION_INDEX": "3", "RANK": "1", "WORLD_SIZE": "2"}
    assert detect_rank_env(environ) == (1, 2, "torchrun")


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"OMPI_COMM_WORLD_RANK": "4", "OMPI_COMM_WORLD_SIZE": "4"}, "OMPI_COMM_WORLD_RANK=4 is out"),
        ({"RANK": "9", "WORLD_SIZE": "3"}, "RANK=9 is out of range for world size WORLD_SIZE=3"),
        ({"JOB_COMPLETION_INDEX": "10", "FEDSV_WORLD_SIZE": "10"}, "JOB_COMPLETION_INDEX=10 is out of range"),
        ({"RANK": "abc", "WORLD_SIZE": "3"}, "RANK='abc' is not a non-negative integer"),
        ({"RANK": "-1", "WORLD_SIZE": "3"}, "RANK='-1' is not a non-negative integer"),
        ({"PMI_RANK": "0", "PMI_SIZE": "2.0"}, "PMI_SIZE='2.0' is not a non-negative integer"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "0"}, "SLURM_NTASKS=0 must be at least 1"),
        ({"JOB_COMPLETION_INDEX": "0", "FEDSV_WORLD_SIZE": "ten"}, "FEDSV_WORLD_SIZE='ten' is not"),
    ],
)
def test_detect_rejects(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        detect_rank_env(environ)


# --- resolve_ranks --------------------------------------------------------------------------------

OMPI_1_OF_4 = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}


def test_resolve_flags() -> None:
    assert resolve_ranks(3, 10, None, environ={}) == RankAssignment((3,), 10, "flags")
    assert resolve_ranks(None, 20, "0-4,10", environ={}) == RankAssignment((0, 1, 2, 3, 4, 10), 20, "flags")


def test_resolve_flags_win_over_environment() -> None:
    environ = {**OMPI_1_OF_4, "RANK": "0", "WORLD_SIZE": "2"}
    assert resolve_ranks(7, 8, None, environ=environ) == RankAssignment((7,), 8, "flags")
    assert resolve_ranks(None, 8, "2-3", environ=environ) == RankAssignment((2, 3), 8, "flags")


def test_resolve_openmpi_over_torchrun() -> None:
    environ = {**OMPI_1_OF_4, "RANK": "0", "WORLD_SIZE": "2"}
    assert resolve_ranks(None, None, None, environ=environ) == RankAssignment((1,), 4, "openmpi")


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"PMIX_RANK": "2", "PMIX_SIZE": "3"}, RankAssignment((2,), 3, "pmix")),
        ({"PMI_RANK": "1", "PMI_SIZE": "2"}, RankAssignment((1,), 2, "mpich")),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, RankAssignment((0,), 1, "slurm")),
        ({"JOB_COMPLETION_INDEX": "5", "FEDSV_WORLD_SIZE": "6"}, RankAssignment((5,), 6, "kubernetes")),
        ({"RANK": "3", "WORLD_SIZE": "4"}, RankAssignment((3,), 4, "torchrun")),
    ],
)
def test_resolve_from_environment(environ: dict[str, str], expected: RankAssignment) -> None:
    assert resolve_ranks(None, None, None, environ=environ) == expected
    assert resolve_ranks(None, expected.world_size, None, environ=environ) == expected


def test_resolve_blocks_under_mpirun() -> None:
    # mpirun -n 4 python -m fedsv.participant --world-size 20: five ranks in each process
    for p in range(4):
        environ = {"OMPI_COMM_WORLD_RANK": str(p), "OMPI_COMM_WORLD_SIZE": "4"}
        got = resolve_ranks(None, 20, None, environ=environ)
        assert got == RankAssignment(tuple(range(5 * p, 5 * p + 5)), 20, "openmpi")
        assert resolve_ranks(None, None, None, environ=environ, ranks_per_process=5) == got
        assert resolve_ranks(None, 20, None, environ=environ, ranks_per_process=5) == got


def test_resolve_blocks_uneven() -> None:
    blocks = [
        resolve_ranks(None, 10, None, environ={"RANK": str(p), "WORLD_SIZE": "3"}).ranks for p in range(3)
    ]
    assert blocks == [(0, 1, 2, 3), (4, 5, 6), (7, 8, 9)]


Flags = tuple[int | None, int | None, str | None]


@pytest.mark.parametrize(
    ("flags", "environ", "per_process", "message"),
    [
        ((None, None, None), {}, None, "no rank: pass --rank/--world-size"),
        ((None, 20, None), {}, None, "no rank: pass --rank/--world-size"),
        ((3, None, None), {}, None, "--rank/--ranks needs --world-size"),
        ((None, None, "0-3"), {}, None, "--rank/--ranks needs --world-size"),
        ((3, 3, None), {}, None, "--rank 3 is out of range for --world-size 3"),
        ((-1, 3, None), {}, None, "--rank -1 is out of range"),
        ((1, 3, "1"), {}, None, "either --rank or --ranks"),
        ((None, 0, "0"), {}, None, "world size must be a positive integer"),
        ((None, 20, "30"), {}, None, "rank 30 in '30' is out of range"),
        ((1, 3, None), {}, 2, "--ranks-per-process applies only under a launcher"),
        ((None, 3, None), OMPI_1_OF_4, None, "--world-size 3 is smaller than the 4 openmpi processes"),
        ((None, 21, None), OMPI_1_OF_4, 5, "--ranks-per-process 5 with 4 openmpi processes gives 20 ranks"),
        ((None, None, None), OMPI_1_OF_4, 0, "--ranks-per-process must be a positive integer"),
        ((None, None, None), {"RANK": "x", "WORLD_SIZE": "2"}, None, "RANK='x' is not a non-negative"),
    ],
)
def test_resolve_rejects(
    flags: Flags, environ: dict[str, str], per_process: int | None, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        resolve_ranks(*flags, environ=environ, ranks_per_process=per_process)


def test_resolve_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_")) or name in {"JOB_COMPLETION_INDEX", "RANK"}:
            monkeypatch.delenv(name)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert resolve_ranks(None, None, None) == RankAssignment((1,), 2, "torchrun")


# --- block_of -------------------------------------------------------------------------------------


def assert_partition(blocks: list[tuple[int, ...]], world_size: int) -> None:
    assert [r for block in blocks for r in block] == list(range(world_size))  # each once, in order
    for block in blocks:
        assert block and block == tuple(range(block[0], block[-1] + 1))  # non-empty and contiguous


def test_blocks_20_over_4() -> None:
    blocks = [block_of(p, 4, 20) for p in range(4)]
    assert blocks == [tuple(range(5 * p, 5 * p + 5)) for p in range(4)]
    assert_partition(blocks, 20)


def test_blocks_10_over_3() -> None:
    blocks = [block_of(p, 3, 10) for p in range(3)]
    assert blocks == [(0, 1, 2, 3), (4, 5, 6), (7, 8, 9)]
    assert_partition(blocks, 10)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 300).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, n))))
def test_blocks_partition_property(case: tuple[int, int]) -> None:
    world_size, processes = case
    blocks = [block_of(p, processes, world_size) for p in range(processes)]
    assert_partition(blocks, world_size)
    sizes = [len(b) for b in blocks]
    extra = world_size % processes
    assert sizes == [world_size // processes + 1] * extra + [world_size // processes] * (processes - extra)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((4, 4, 20), "process index 4 is out of range for 4 processes"),
        ((-1, 4, 20), "process index -1 is out of range"),
        ((0, 5, 4), "5 processes for only 4 ranks"),
        ((0, 0, 4), "process count must be a positive integer"),
    ],
)
def test_block_of_rejects(args: tuple[int, int, int], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        block_of(*args)


# --- a real mpirun --------------------------------------------------------------------------------

# Each process writes its own file: mpirun forwards the processes' stdout, and their lines can interleave.
PROBE = (
    "import json, os, sys; from fedsv.participant.ranks import resolve_ranks; "
    "a = resolve_ranks(None, 9, None); "
    "report = {'ranks': list(a.ranks), 'world_size': a.world_size, 'source': a.source}; "
    "open(os.path.join(sys.argv[1], f'{os.getpid()}.json'), 'w').write(json.dumps(report))"
)
