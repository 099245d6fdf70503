"""Which ranks a process plays: from flags or the launcher's environment (mpirun, Slurm, k8s, torchrun)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from fedsv.fl.ranks import DIGITS, block_of, check_world_size, parse_ranks

logger = logging.getLogger(__name__)

NO_RANK = (
    "no rank: pass --rank/--world-size or --ranks, "
    "or launch under mpirun / a Kubernetes Indexed Job / torchrun"
)


@dataclass(frozen=True)
class RankAssignment:
    """The ranks one process plays, the run's world size, and where they came from."""

    ranks: tuple[int, ...]
    world_size: int
    source: str  # "flags", "openmpi", "mpich", "pmix", "slurm", "kubernetes" or "torchrun"


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
    """The non-negative integer in environ[name]; None when unset or blank; ValueError when not an integer."""
    value = environ.get(name)
    if value is None or not value.strip():
        return None
    if not DIGITS.fullmatch(value.strip()):
        raise ValueError(f"environment variable {name}={value!r} is not a non-negative integer")
    return int(value.strip())


def _first_int(environ: Mapping[str, str], names: tuple[str, ...]) -> tuple[int, str] | None:
    for name in names:
        value = _env_int(environ, name)
        if value is not None:
            return value, name
    return None


# (source, rank variable, world-size variables in order of preference)
_SOURCES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("openmpi", "OMPI_COMM_WORLD_RANK", ("OMPI_COMM_WORLD_SIZE",)),
    # PMIx exports the rank but not always a size; without one this source is skipped.
    ("pmix", "PMIX_RANK", ("OMPI_COMM_WORLD_SIZE", "PMIX_SIZE")),
    # MPICH, Intel MPI and other Hydra-launched MPIs.
    ("mpich", "PMI_RANK", ("PMI_SIZE",)),
    ("slurm", "SLURM_PROCID", ("SLURM_NTASKS", "SLURM_NPROCS")),
    # Kubernetes Indexed Jobs export only the index; the Job's completions must be passed in FEDSV_WORLD_SIZE.
    ("kubernetes", "JOB_COMPLETION_INDEX", ("FEDSV_WORLD_SIZE",)),
    ("torchrun", "RANK", ("WORLD_SIZE",)),
)


def detect_rank_env(environ: Mapping[str, str]) -> tuple[int, int, str] | None:
    """(rank, world size, source) of this process from the launcher's environment variables, or None.

    Sources are tried in order: Open MPI, PMIx, MPICH/Intel MPI/Hydra, Slurm, Kubernetes Indexed Job,
    torchrun.
    A source whose rank variable is set but whose world size is not available is skipped. Values that are not
    integers, or a rank outside 0..world_size-1, raise ValueError.
    """
    for source, rank_name, size_names in _SOURCES:
        rank = _env_int(environ, rank_name)
        if rank is None:
            continue
        found = _first_int(environ, size_names)
        if found is None:
            if source == "kubernetes":
                logger.warning(
                    "JOB_COMPLETION_INDEX=%d is set but FEDSV_WORLD_SIZE is not: Kubernetes does not "
                    "export the Job's size, so set FEDSV_WORLD_SIZE to the Job's .spec.completions",
                    rank,
                )
            else:
                sizes = "/".join(size_names)
                logger.debug("%s is set but none of %s: not using %s ranks", rank_name, sizes, source)
            continue
        world_size, size_name = found
        if world_size < 1:
            raise ValueError(f"environment variable {size_name}={world_size} must be at least 1")
        if rank >= world_size:
            raise ValueError(
                f"environment rank {rank_name}={rank} is out of range for world size {size_name}={world_size}"
            )
        logger.debug("rank %d of %d from %s (%s/%s)", rank, world_size, source, rank_name, size_name)
        return rank, world_size, source
    return None


def resolve_ranks(
    rank: int | None,
    world_size: int | None,
    ranks: str | None,
    environ: Mapping[str, str] = os.environ,
    ranks_per_process: int | None = None,
) -> RankAssignment:
    """The ranks this process plays.

    Explicit flags win: `--rank R --world-size N` gives (R,), `--ranks SPEC --world-size N` the parsed list.
    Otherwise the launcher's environment gives process p of P. With `--world-size N` larger than P, or with
    `ranks_per_process` K (N = K*P), 0..N-1 is split into P contiguous near-equal blocks and process p plays
    block p; e.g. `mpirun -n 4 python -m fedsv.participant --world-size 20` plays 5 ranks in each process.
    """
    if rank is not None or ranks is not None:
        if rank is not None and ranks is not None:
            raise ValueError("pass either --rank or --ranks, not both")
        if ranks_per_process is not None:
            raise ValueError("--ranks-per-process applies only under a launcher, not with --rank/--ranks")
        if world_size is None:
            raise ValueError("--rank/--ranks needs --world-size")
        check_world_size(world_size)
        if rank is None:
            return RankAssignment(parse_ranks(ranks or "", world_size), world_size, "flags")
        if not 0 <= rank < world_size:
            raise ValueError(
                f"--rank {rank} is out of range for --world-size {world_size} (0..{world_size - 1})"
            )
        return RankAssignment((rank,), world_size, "flags")

    if world_size is not None:
        check_world_size(world_size)
    if ranks_per_process is not None:
        check_world_size(ranks_per_process, "--ranks-per-process")
    detected = detect_rank_env(environ)
    if detected is None:
        raise ValueError(NO_RANK)
    process, processes, source = detected
    total = processes if ranks_per_process is None else processes * ranks_per_process
    if world_size is not None:
        if ranks_per_process is not None and world_size != total:
            raise ValueError(
                f"--ranks-per-process {ranks_per_process} with {processes} {source} processes gives {total} "
                f"ranks, but --world-size is {world_size}"
            )
        if world_size < processes:
            raise ValueError(
                f"--world-size {world_size} is smaller than the {processes} {source} processes: "
                "some processes would have no rank"
            )
        total = world_size
    return RankAssignment(block_of(process, processes, total), total, source)
