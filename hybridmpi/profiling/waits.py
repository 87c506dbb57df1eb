"""The profile's clocks across nodes and its split of a wait into imbalance and transfer, for
any sequence of synchronizing regions (:func:`split_waits`: the apps' exchanges, plain mpi4py
too) and for the profile's own calls (:func:`clock_offset`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._native.marks import now as _now
from .._native.tables import mpi

if TYPE_CHECKING:
    from ..comm.hybridcomm import HybridComm


def split_waits(hc: HybridComm, entries: Any, exits: Any,
                peers: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
    """The imbalance of a sequence of synchronizing regions of an application, measured the
    way the profile measures a call (collective over ``hc``): call ``i`` on every rank is
    region ``i``; ``entries`` and ``exits`` are this rank's monotonic times (ns) of entering
    and leaving each region, ``peers`` the ranks each region waits for.  Works for any
    exchange (plain mpi4py too), so that baselines are split the same way.

    Returns:
        (imbalance, late): per region, the ns spent before the last peer had entered
        (at most the region's time) and that peer (-1 when none was late).
    """
    raw = np.asarray(entries, dtype=np.int64)
    entries = raw + clock_offset(hc)
    span = np.asarray(exits, dtype=np.int64) - raw
    peers = [p for p in peers if p != hc.rank]
    sends = [None] * hc.size
    for p in peers:
        sends[p] = entries
    got = hc.comm.alltoall(sends)
    latest = np.full(entries.size, np.iinfo(np.int64).min, dtype=np.int64)
    late = np.full(entries.size, -1, dtype=np.int64)
    for p in peers:
        theirs = got[p]
        if theirs is None or theirs.size != entries.size:
            have = None if theirs is None else theirs.size
            raise ValueError(f"hybridmpi: split_waits: rank {p} has {have} regions, rank {hc.rank} "
                             f"{entries.size}, or does not name it")
        newer = theirs > latest
        latest = np.where(newer, theirs, latest)
        late = np.where(newer, p, late)
    imb = np.where(late >= 0, np.clip(np.where(late >= 0, latest, 0) - entries, 0, span), 0)
    return imb, np.where(imb > 0, late, -1)


def clock_offset(hc: HybridComm) -> int:
    """This rank's clock minus rank 0's (ns): 0 on rank 0's shared-memory node; elsewhere
    the node leader's, measured by ping-pong with rank 0 (the round trip of least delay)."""
    cached = hc.context.clock_offset
    if cached is not None:
        return cached
    MPI = mpi()
    comm = hc.comm
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, hc.rank)
    try:
        leader = node.bcast(hc.rank if node.Get_rank() == 0 else None, root=0)
        leaders = sorted(set(comm.allgather(leader)))
        mine = 0
        buf = np.zeros(1, dtype=np.int64)
        for other in leaders:
            if other == 0:
                continue
            if hc.rank == 0:
                best = (np.iinfo(np.int64).max, 0)   # (round trip, offset) of least delay
                for _ in range(16):
                    t_send = _now()
                    comm.Send(buf, other, 32701)
                    comm.Recv(buf, other, 32701)
                    t_back = _now()
                    if t_back - t_send < best[0]:
                        best = (t_back - t_send, int(buf[0]) - (t_send + t_back) // 2)
                comm.Send(np.array([best[1]], dtype=np.int64), other, 32701)
            elif hc.rank == other:
                for _ in range(16):
                    comm.Recv(buf, 0, 32701)
                    buf[0] = _now()
                    comm.Send(buf, 0, 32701)
                comm.Recv(buf, 0, 32701)
                mine = int(buf[0])
        # times are sent on rank 0's clock: subtract this node's offset
        hc.context.clock_offset = -int(node.bcast(mine, root=0))
        return hc.context.clock_offset
    finally:
        node.Free()
