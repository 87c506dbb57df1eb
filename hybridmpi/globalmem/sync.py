"""The synchronization of global memory: sync_all, and sync_images' counters and messages."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._native import errmap as _errmap
from .._native.clib import copy_policy, ffi, lib
from .._native.tables import mpi
from ..comm._agree import barrier, safe_repr, unusable
from ..comm._waits import wait_requests

_R = lib.HM_REGION
_TAG_SYNC = 1
_EMPTY = bytearray(0)
_INVALID = bytearray(b"\x01")  # what an invalid call sends each far peer (a valid one: nothing)
def int_arg(value, what, rank):
    """``value`` as an int; TypeError for bools and non-integers."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"hybridmpi: rank {rank}: {what} must be an int, got {type(value).__name__} "
                        f"{safe_repr(value, 40)}")
    return int(value)


def int64_arg(value, what, rank):
    """``value`` as an int that fits an int64; TypeError as :func:`int_arg`, ValueError outside."""
    value = int_arg(value, what, rank)
    if not -2**63 <= value < 2**63:
        raise ValueError(f"hybridmpi: rank {rank}: {what} must fit in an int64, got {value}")
    return value


class Sync:
    """What sync_images needs on one HybridComm (made with its first global memory).

    Per ordered pair of ranks on a node, a 128-byte region holds how many
    times the first has called sync_images naming the second; only the
    first writes it.  Across nodes, each such call sends one zero-byte
    message on a communicator of its own.
    """

    def __init__(self, hc):
        self.hc = hc
        self.block = hc.arena.alloc(hc.node_size * _R, "sync_images counters")
        ffi.memmove(ffi.cast("char *", self.block.local), bytes(hc.node_size * _R), hc.node_size * _R)
        self.comm = hc.comm.Dup() if hc.num_nodes > 1 else None
        self.calls = ffi.new("uint64_t[]", hc.size)  # sync_images calls naming each rank (node peers)
        self.node_rank = hc.node_index
        self.plans = {}
        self.dirty = {}  # RMA windows with non-blocking operations not yet flushed, by id
        self.broken = None
        self.got = bytearray(1)
        #: receives this rank owes each far peer since its own invalid calls: (request, buffer)
        self.owed: dict[int, list[Any]] = {}
        #: the ranks of the last sync_images call, checked and sorted, this rank left out
        self.named: tuple[int, ...] = ()
        barrier(hc.context, hc.node_comm, "sync_images")

    def _ranks(self, ranks, what):
        """The checked, sorted ranks of a sync_images call, this rank left out."""
        hc = self.hc
        if isinstance(ranks, (int, np.integer)) and not isinstance(ranks, (bool, np.bool_)):
            ranks = (int(ranks),)
        try:
            ranks = tuple(int_arg(r, "a rank of sync_images", hc.rank) for r in ranks)
        except TypeError as e:
            if "must be an int" in str(e):
                raise
            raise TypeError(f"hybridmpi: rank {hc.rank}: {what}: ranks must be an int or a sequence "
                            f"of ints, got {type(ranks).__name__}") from None
        for r in ranks:
            if not 0 <= r < hc.size:
                raise ValueError(f"hybridmpi: rank {hc.rank}: {what}: rank {r} is out of range "
                                 f"(the communicator has {hc.size} ranks)")
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"hybridmpi: rank {hc.rank}: {what}: ranks {list(ranks)} name a rank twice")
        return tuple(sorted(r for r in ranks if r != hc.rank))

    def _plan(self, ranks, what):
        """Counters and peers of a sync_images argument, checked and built once per argument."""
        # cached only for an int or a list or tuple of ints (exact types): an iterator is not
        # consumed by the key, and True or 1.0, equal to 1 as keys, are checked (and refused)
        if type(ranks) is int:
            key = ranks
        elif type(ranks) in (list, tuple) and all(type(r) is int for r in ranks):
            key = tuple(ranks)
        else:
            key = None
        plan = None if key is None else self.plans.get(key)
        if plan is not None:
            return plan
        ranks = self._ranks(ranks, what)
        hc = self.hc
        near = [r for r in ranks if r in self.node_rank]
        far = [r for r in ranks if r not in self.node_rank]
        p = ffi.new("hm_pairs *")
        n = max(len(near), 1)
        keep = [ffi.new("void *[]", n), ffi.new("void *[]", n), ffi.new("int64_t[]", near or [0])]
        p.n = len(near)
        p.signal, p.wait, p.peer = keep
        p.calls = self.calls
        me = self.node_rank[hc.rank]
        for i, r in enumerate(near):
            nr = self.node_rank[r]
            p.signal[i] = ffi.cast("void *", self.block.addr(nr, r) + me * _R)
            p.wait[i] = ffi.cast("void *", self.block.local + nr * _R)
        copy_policy(p.policy, hc.context.policy)
        plan = (near, far, p, keep, tuple(ranks))
        if key is not None:
            self.plans[key] = plan
        return plan

    def check(self):
        if self.broken:
            self.hc.context.notices.progress()
            raise unusable(self.hc.rank, "global memory synchronization is unusable after an "
                           f"earlier {self.broken}", self.broken)

    def flush_dirty(self):
        for win in self.dirty.values():
            win.Flush_all()
        self.dirty.clear()

    def sync_all(self):
        self.check()
        self.flush_dirty()
        self.hc.barrier()
        if self.comm is not None:
            for win in self.hc.arena.rma_windows():
                win.Sync()

    def sync_images(self, ranks, what):
        try:
            near, far, p, _, checked = self._plan(ranks, what)
        except Exception:
            if not self.broken:
                self._invalid()
            raise
        self.named = checked   # what the profile records of the call (its ranks, as checked)
        if self.broken:
            self.check()
        if self.dirty:
            self.flush_dirty()
        hc = self.hc
        reqs = None
        if far:
            comm = self.comm
            got = self._got(len(far))
            reqs = [comm.Irecv(got[i:i + 1], r, _TAG_SYNC) for i, r in enumerate(far)]
            reqs += [comm.Isend(_EMPTY, r, _TAG_SYNC) for r in far]
            if self.owed:   # receives owed since an invalid call of this rank: matched first
                reqs += [q for r in far for q, _ in self.owed.pop(r, ())]
        if near and lib.hm_signal_wait(p):
            kind, peer, more = _errmap.sync_images(p.err, near, hc.rank, hc.timeout, what)
            if kind == "invalid":   # every peer came: the counts stay matched
                if reqs:
                    self._complete(reqs, far, what)
                raise self._peer_invalid(peer, what)
            if kind == "peer":
                self.broken = "PeerError"
                raise hc.context.peer_error(what, peer, more)
            self._timed_out()
            raise more
        if reqs:
            self._complete(reqs, far, what)
            for win in hc.arena.rma_windows():
                win.Sync()

    def _got(self, n):
        """One byte per far peer of a call: 1 where its matching call was invalid."""
        if len(self.got) < n:
            self.got = bytearray(n)
        got = self.got
        got[:n] = bytes(n)
        return memoryview(got)

    def _invalid(self):
        """This rank's sync_images had invalid arguments: it counts as a call naming every
        other rank, marked invalid, so that a peer whose call matches it raises
        PeerArgumentError instead of waiting, and the counts stay matched (a later valid
        call pairs as before; when every rank's call was invalid, nothing changes)."""
        hc = self.hc
        others = tuple(r for r in range(hc.size) if r != hc.rank)
        if not others:
            return
        near, far, p, _, _ = self._plan(others, "sync_images")
        if near:
            lib.hm_signal_invalid(p)
        for r in far:
            self.comm.Isend(_INVALID, r, _TAG_SYNC).Free()
            # the peer's call that matches this one sends too: received with this rank's next
            # call naming it (or dropped at free)
            buf = bytearray(1)
            self.owed.setdefault(r, []).append((self.comm.Irecv(buf, r, _TAG_SYNC), buf))

    def _peer_invalid(self, peer, what):
        hc = self.hc
        return _errmap.peer_invalid(hc.rank, what, peer, "its matching sync_images call")

    def _complete(self, reqs, far, what):
        hc = self.hc
        stop = wait_requests(hc.context, reqs, hc.timeout)
        if stop is None:
            bad = [far[i] for i in range(len(far)) if self.got[i]]
            if bad:
                raise self._peer_invalid(bad[0], what)
            return
        if stop.notice is not None:
            self.broken = "PeerError"
            raise hc.context.peer_error("sync_images", stop.notice)
        # the receives come first in reqs, one per rank of far
        late = [far[i] for i in stop.late if i < len(far)] or list(far)
        self._timed_out()
        who = f"rank {late[0]} on another node" if len(late) == 1 else f"ranks {late} on other nodes"
        raise _errmap.timed_out(hc.rank, hc.timeout, f"in {what}",
                                f"{who} did not call sync_images naming rank {hc.rank}",
                                peer=late[0] if len(late) == 1 else None, counter="sync_images")

    def _timed_out(self):
        """A peer did not come within the timeout: the HybridComm breaks, as at any call's
        timeout (error bits, notices), so that a peer that comes later raises too."""
        self.broken = "SyncTimeout"
        self.hc.context.break_comm("SyncTimeout")

    def describe_word(self, addr):
        """What a wait on ``addr`` waits for, if it is a sync_images counter (hang diagnosis)."""
        if self.block.chunk is None:
            return None
        for nr, r in enumerate(self.hc.node_ranks):
            if addr == self.block.local + nr * _R:
                return (f"sync_images, waiting for rank {r} to name rank {self.hc.rank} once more "
                        f"(call {int(self.calls[r])} naming it)")
        return None

    def poison(self, bits):
        """Error bits in the sync_images counters this rank writes (its HybridComm broke); every
        later sync_images raises (it never counts a call over the bits)."""
        if self.broken is None:
            self.broken = "error on its HybridComm"
        if self.block.chunk is None:
            return
        hc, me = self.hc, self.node_rank[self.hc.rank]
        words = [ffi.cast("void *", self.block.addr(nr, r) + me * _R)
                 for nr, r in enumerate(hc.node_ranks) if r != hc.rank]
        if words:
            lib.hm_poison(len(words), words, bits)

    def free(self):
        self.block.free()
        for q, _ in (q for owed in self.owed.values() for q in owed):
            if not mpi().Is_finalized():
                q.Cancel()
                q.Free()
        self.owed = {}
        if self.comm is not None:
            if not mpi().Is_finalized():
                self.hc.context.free_comm(self.comm)
        self.comm = None


def sync_state(hc):
    """The HybridComm's Sync, made with its first global memory."""
    return hc.context.service("sync_images", lambda _ctx: Sync(hc))


