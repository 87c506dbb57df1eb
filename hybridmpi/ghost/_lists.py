"""Pieces that build a pattern's lists, shared by :mod:`hybridmpi.ghost.pattern` and the lists taken
from DOLFINx and PETSc (:mod:`hybridmpi.ghost.interop`, which sits under the pattern)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..comm._agree import agree, complete, context_of
from ..comm.hybridcomm import HybridComm
from ..errors import FreedError, PatternError


def agree_pattern(comm: Any, problem: str | None) -> None:
    """Raise PatternError on every rank if any rank found a problem."""
    agree(comm, problem and (PatternError, problem), "GhostPattern", more=True)


def alltoallv(comm: Any, MPI: Any, data: np.ndarray, dest: np.ndarray, nranks: int) -> tuple:
    """Send data[i] to rank dest[i]; returns (received values, counts per destination, counts
    per source, order used)."""
    order = np.argsort(dest, kind="stable")
    counts = np.bincount(dest, minlength=nranks).astype(np.int64)
    rcounts = np.empty(nranks, dtype=np.int64)
    ctx = context_of(comm)   # waited as every wait: a failed or interrupted peer ends it
    complete(ctx, comm, comm.Ialltoall(counts, rcounts), "GhostPattern")
    out = np.empty(int(rcounts.sum()), dtype=np.int64)
    sdispl = np.concatenate(([0], np.cumsum(counts)[:-1]))
    rdispl = np.concatenate(([0], np.cumsum(rcounts)[:-1]))
    send = np.ascontiguousarray(data[order])
    complete(ctx, comm, comm.Ialltoallv([send, (counts, sdispl), MPI.INT64_T],
                                        [out, (rcounts, rdispl), MPI.INT64_T]), "GhostPattern")
    return out, counts, rcounts, order


def comm_of(hc: Any) -> Any:
    """The MPI communicator of ``hc``, a live HybridComm (TypeError, FreedError otherwise)."""
    if not isinstance(hc, HybridComm):
        raise TypeError(f"hybridmpi: GhostPattern needs a HybridComm, got {type(hc).__name__}")
    if hc.closed:
        raise FreedError(f"hybridmpi: rank {hc.rank}: GhostPattern on a freed HybridComm")
    return hc.comm
