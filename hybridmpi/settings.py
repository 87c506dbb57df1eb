"""Every setting the library reads from the environment, in one place.

The library reads the process environment here only.  :func:`variables` loads the table
(``settings.toml``) that ``docs/settings.md`` shows (``tests/test_house.py`` checks that the two
agree and that no other module of ``hybridmpi`` reads ``os.environ``).  Settings that decide
which path a call takes or how long a wait lasts are read once per ``HybridComm``
(:func:`per_comm`) and agreed across its ranks there: ranks with different values raise
``ValueError`` on every rank.  The others are read where they act: at import
(``HYBRIDMPI_RUN_KERNEL_MIN``), per allocation (the room and context-id budgets) or per process
(the launcher's rank and size).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple


class Variable(NamedTuple):
    """One environment variable the library reads."""

    name: str
    default: str
    when: str        # "per comm" (agreed by HybridComm()), "import", "call", "process" or
    #                  "PMPI library" (read by it, in each process, at its first call)
    meaning: str
    #: who reads it: "python" (this package), "pmpi" (the PMPI library, cext/hm_pmpi*.c) or
    #: "both"
    reader: str = "python"


def variables() -> tuple[Variable, ...]:
    """The table of every variable the library reads (``settings.toml`` beside this module)."""
    import tomllib

    with open(Path(__file__).with_name("settings.toml"), "rb") as fh:
        return tuple(Variable(**row) for row in tomllib.load(fh)["variable"])


#: the environment variables in which launchers tell a process its size and rank
LAUNCHER_ENV = (("PMI_SIZE", "PMI_RANK"),                           # MPICH (hydra), Intel MPI, PMI-2
                ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),   # Open MPI
                ("MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK"))     # MVAPICH2
#: variables that already say how many threads numpy's BLAS may use
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

#: seconds one wait lasts before it prints what it waits for (HYBRIDMPI_WARN_AFTER unset)
WARN_AFTER = 60.0


def raw(name: str) -> str:
    """The value of ``name``, stripped ('' when unset)."""
    return os.environ.get(name, "").strip()


def env_float(name: str) -> float | None:
    """``name`` as a number, None when unset or empty; ValueError when it is not a number."""
    value = raw(name)
    if value == "":
        return None
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"hybridmpi: environment variable {name}={value!r} is not a number") from None


def chaos() -> tuple[int, float] | None:
    """HYBRIDMPI_CHAOS as (seed, most µs), None when off; ValueError when malformed."""
    value = raw("HYBRIDMPI_CHAOS")
    if value in ("", "0"):
        return None
    seed, _, most = value.partition(":")
    try:
        return int(seed), float(most or 200)
    except ValueError:
        raise ValueError(f"env HYBRIDMPI_CHAOS={value!r} is not SEED[:MAX_US]") from None


def per_comm() -> dict[str, Any]:
    """The settings a ``HybridComm`` reads once and agrees on across its ranks (ValueError,
    without the 'hybridmpi: ' prefix, when one is malformed)."""
    try:
        spin = env_float("HYBRIDMPI_SPIN")
        warn = env_float("HYBRIDMPI_WARN_AFTER")
        profile = raw("HYBRIDMPI_PROFILE")
        out: dict[str, Any] = {
            "timeout": env_float("HYBRIDMPI_TIMEOUT"),
            "spin": None if spin is None else int(spin),
            "warn_after": WARN_AFTER if warn is None else warn,
            "cma": (raw("HYBRIDMPI_CMA") or "1") != "0",
            "profile": None if profile in ("", "0") else profile,
            "tune": tune_mode(),
            "tune_file": tune_file(),
            "tune_dir": str(tune_dir()),
        }
        for key, name in (("cma_bytes", "HYBRIDMPI_CMA_BYTES"),
                          ("zero_copy_bytes", "HYBRIDMPI_ZERO_COPY_BYTES")):
            v = env_float(name)
            out[key] = None if v is None else int(v)
        chaos()   # checked here; each rank draws its own delays (not agreed)
    except ValueError as e:
        raise ValueError(str(e).replace("hybridmpi: ", "")) from None
    return out


def tune_mode() -> str:
    """HYBRIDMPI_TUNE: ``auto`` (the default), ``table``, ``off`` or ``mpi``; ValueError
    otherwise."""
    value = raw("HYBRIDMPI_TUNE").lower() or "auto"
    if value not in ("auto", "table", "off", "mpi"):
        raise ValueError(f"hybridmpi: environment variable HYBRIDMPI_TUNE={value!r} is not one of "
                         "auto, table, off, mpi")
    return value


def tune_file() -> str | None:
    """HYBRIDMPI_TUNE_FILE, None when unset."""
    return raw("HYBRIDMPI_TUNE_FILE") or None


def tune_dir() -> Path:
    """Where tuning tables are kept: HYBRIDMPI_TUNE_DIR, else XDG_CACHE_HOME/hybridmpi/tune."""
    value = raw("HYBRIDMPI_TUNE_DIR")
    if value:
        return Path(value)
    return Path(raw("XDG_CACHE_HOME") or Path.home() / ".cache") / "hybridmpi" / "tune"


def timeout() -> float | None:
    """HYBRIDMPI_TIMEOUT in seconds where it is a positive number below 1e9, else None (the
    deadline of agreements made before a HybridComm exists)."""
    try:
        value = env_float("HYBRIDMPI_TIMEOUT")
    except ValueError:
        return None   # the HybridComm's own check of the environment says what is wrong
    return value if value is not None and 0 < value < 1e9 else None


def method() -> tuple[str, str]:
    """(the default Halo method, where it came from, for messages)."""
    value = os.environ.get("HYBRIDMPI_METHOD")
    return (value, " (from env HYBRIDMPI_METHOD)") if value else ("atomic", "")


def shm_dir() -> str:
    return os.environ.get("HYBRIDMPI_SHM_DIR", "/dev/shm")


def shm_limit() -> int | None:
    """HYBRIDMPI_SHM_LIMIT in bytes, None when unset; ValueError when not a whole number >= 0."""
    value = raw("HYBRIDMPI_SHM_LIMIT")
    if not value:
        return None
    try:
        limit = int(value)
    except ValueError:
        limit = -1
    if limit < 0:
        raise ValueError(f"hybridmpi: environment variable HYBRIDMPI_SHM_LIMIT={value!r} is not a "
                         "whole number of bytes")
    return limit


def context_ids() -> int | None:
    value = raw("HYBRIDMPI_CONTEXT_IDS")
    return int(value) if value else None


def run_kernel_min() -> int:
    return int(raw("HYBRIDMPI_RUN_KERNEL_MIN") or 8)


def cache_dir() -> Path:
    """Where generated meshes are kept: HYBRIDMPI_CACHE, else XDG_CACHE_HOME/hybridmpi/meshes."""
    value = raw("HYBRIDMPI_CACHE")
    if value:
        return Path(value)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hybridmpi" / "meshes"


def pmpi_cache_dir() -> Path:
    """Where the PMPI library's builds are kept: HYBRIDMPI_PMPI_CACHE, else
    XDG_CACHE_HOME/hybridmpi/pmpi."""
    value = raw("HYBRIDMPI_PMPI_CACHE")
    if value:
        return Path(value)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hybridmpi" / "pmpi"


def mpicc() -> str | None:
    """The C compiler wrapper named by MPICC (the PMPI library's build tries it first)."""
    return raw("MPICC") or None


def blas_threads() -> str | None:
    """The BLAS thread count the environment asks for, if any (benchmark records)."""
    return raw("OPENBLAS_NUM_THREADS") or raw("OMP_NUM_THREADS") or None


def launched() -> tuple[int, int]:
    """This process's rank and the number of processes, as the launcher's environment says
    (``mpiexec`` of MPICH, Open MPI, Intel MPI, MVAPICH2), without starting MPI; ``(0, 1)``
    outside a launcher."""
    for size, rank in LAUNCHER_ENV:
        try:
            return int(os.environ.get(rank, "0")), int(os.environ[size])
        except (KeyError, ValueError):
            continue
    return 0, 1


#: the variables in which launchers tell a process how many processes of the job share its node
LOCAL_SIZE_ENV = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE")


def local_ranks() -> int:
    """How many processes of the job run on this node, as the launcher says (MPICH's and Intel
    MPI's hydra, Open MPI, MVAPICH2), 0 when none says: a communicator's own ranks on a node may
    be fewer than the processes that share its cores."""
    for name in LOCAL_SIZE_ENV:
        try:
            return int(os.environ[name])
        except (KeyError, ValueError):
            continue
    return 0


def threads_set() -> bool:
    """Whether the environment already says how many threads numpy's BLAS may use."""
    return any(os.environ.get(v) for v in THREAD_ENV)

