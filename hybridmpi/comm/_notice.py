"""Failure notices: how a rank whose HybridComm broke tells every other rank, and how a rank
waiting on MPI requests learns of it (a leaf: imports numpy only).

A notice is one int64 message on the HybridComm's communicator, tag :data:`ERROR_TAG`,
carrying the comm's nonce (a random number of rank 0's, agreed when the comm is made), so
that a notice left over from a freed comm whose context MPI gave to a new one is told apart
and dropped.  The waits on MPI requests (:mod:`hybridmpi.comm._waits`) poll for notices; the
shared-memory waits see error bits instead.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

#: MPI tag of the notice a rank sends every other rank when its HybridComm breaks (payload:
#: the HybridComm's nonce), so that ranks waiting on MPI requests raise instead of waiting
ERROR_TAG = 32700


def new_nonce() -> int:
    """A random number that names one HybridComm in its notices (rank 0's is agreed)."""
    return int.from_bytes(os.urandom(7), "little")


class Notices:
    """The failure notices of one communicator: this rank's, sent once, and the first peer's
    that came."""

    def __init__(self, comm: Any, nonce: int, MPI: Any) -> None:
        self.comm, self.nonce, self.MPI = comm, nonce, MPI
        self.sent: list[np.ndarray] = []   # kept alive until the HybridComm is freed
        self.first: int | None = None      # the first rank whose notice came
        self.pending: list[Any] = []       # this rank's notices not yet known to have left

    def send(self) -> None:
        """Send this rank's notice to every other rank (the sends are never waited on)."""
        note = np.array([self.nonce], dtype=np.int64)
        self.sent.append(note)
        comm = self.comm
        me = comm.Get_rank()
        self.pending += [comm.Isend(note, r, ERROR_TAG) for r in range(comm.Get_size()) if r != me]
        # drive MPI's progress a little: an eager message may otherwise wait in this rank's
        # queue until it next enters MPI (a peer would poll for it in vain meanwhile)
        self.progress(8)

    def progress(self, tries: int = 1) -> None:
        """Drive this rank's notices out: every later call on the broken comm does (it raises
        at once without entering MPI otherwise, and Open MPI moves a message only when its
        sender enters MPI: the peers waited out their timeouts, fuzz findings 41-44)."""
        for _ in range(tries if self.pending else 0):
            if self.MPI.Request.Testall(self.pending):
                self.pending = []
                break

    def drop(self) -> None:
        """At the comm's free: the notices still in flight complete in MPI's own time."""
        for q in self.pending:
            if q != self.MPI.REQUEST_NULL:
                q.Free()
        self.pending = []

    def poll(self, tries: int = 1) -> int | None:
        """The rank whose failure notice this rank received, else None.  ``tries`` probes at
        most (one probe may only move an arrived message into MPI's queue: a check made once
        before a call that waits inside MPI probes more than once)."""
        if self.first is None:
            MPI = self.MPI
            status = MPI.Status()
            for _ in range(tries - 1):
                if self.comm.Iprobe(MPI.ANY_SOURCE, ERROR_TAG, status):
                    break
            while self.comm.Iprobe(MPI.ANY_SOURCE, ERROR_TAG, status):
                note = np.empty(1, dtype=np.int64)
                self.comm.Recv(note, status.Get_source(), ERROR_TAG)
                if int(note[0]) == self.nonce:  # else left over from a freed HybridComm
                    self.first = status.Get_source()
                    break
        return self.first
