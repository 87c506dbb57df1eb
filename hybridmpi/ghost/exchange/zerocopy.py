"""Updates inside a node without staging: a shared vector read in place by its readers, and
private arrays read by cross-memory attach (``process_vm_readv``).
"""

import functools
import os
from collections import namedtuple

import numpy as np

from ..._native.clib import copy_policy, ffi, lib
from ..._native.tables import mpi
from ...comm._agree import allgather
from .channels import check, point_kernel
from .method import FWD, REV


def pair_runs(mine, theirs):
    """Runs of (my point, peer's point) pairs that both advance by one: (mine, theirs, lengths)."""
    if mine.size == 0:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z
    breaks = np.flatnonzero((np.diff(mine) != 1) | (np.diff(theirs) != 1)) + 1
    first = np.concatenate(([0], breaks))
    lengths = np.diff(np.append(first, mine.size))
    return (np.ascontiguousarray(mine[first], dtype=np.int64),
            np.ascontiguousarray(theirs[first], dtype=np.int64), lengths.astype(np.int64))


def _probe_cma(ctx):
    """The process ids of this node's ranks (by node rank) if every rank can read every
    other node rank's memory with process_vm_readv (cross-memory attach), else False.
    Collective over the whole communicator."""
    hc = ctx
    word = np.array([os.getpid(), hc.rank], dtype=np.int64)
    peers = allgather(hc, hc.node_comm, (os.getpid(), word.ctypes.data, hc.rank), "Halo")
    ok = hc.node_size > 1
    got = np.zeros(2, dtype=np.int64)
    for pid, addr, rank in peers:
        if ok and rank != hc.rank:
            ok = bool(lib.hm_cma_probe(pid, ffi.cast("void *", addr),
                                       ffi.cast("void *", got.ctypes.data), 16))
            ok = ok and got.tolist() == [pid, rank]
    ok = hc.comm.allreduce(int(ok), op=mpi().MIN)  # word stays alive until here
    return [pid for pid, _, _ in peers] if ok else False


def cma_pids(ctx):
    """The process ids of this node's ranks when cross-memory attach works between them,
    else None: probed once per HybridComm (``ctx``: its Context; collective the first time)."""
    return ctx.service("cma", _probe_cma) or None


#: one direction of a ZeroCopy: the hm_pulls of this rank's reads and of its readers, the
#: READY and tag words it publishes to, and what those C structures point into
_Pulls = namedtuple("_Pulls", "pulls readers ready tags keep")


class ZeroCopy:
    """Updates of one shared vector (Halo.vector()) inside a node without staging buffers;
    with ``pids``, forward updates of private arrays copied by cross-memory attach
    (process_vm_readv from the owner's array, published at each call).

    Direction d, channel s -> r: s release-stores the vector's tag and READY = e
    in r's segment once its values are in place; r copies (forward) or
    combines (reverse) straight from s's vector and release-stores DONE = e in
    s's segment; s's ``*_end`` waits until every reader's DONE >= e.  The
    counters are the ones of the packed path, so both kinds of call can follow
    each other on one Halo.
    """

    def __init__(self, transport, tag, bases, theirs, pids=None, *, empty=False, only=None):
        ex = transport.ex
        self.tag, self.t = tag, transport
        self.cma = pids is not None
        pol = ex.policy
        node_rank = transport.shm.node_rank
        self.dirs = []
        for d in (FWD, REV):
            s = transport.dirs[d]
            keep = []
            pulls = ffi.new("hm_pulls *")
            arr = ffi.new("hm_pull[]", max(len(s.recv_chans), 1))
            for i, c in enumerate(s.recv_chans):
                if empty:  # signals only (bad_call): no points move
                    ids = their_ids = np.zeros(0, dtype=np.int64)
                else:
                    ids, their_ids = np.asarray(c.ids), np.asarray(theirs[d][c.peer])
                mine, other, lengths = pair_runs(ids, their_ids)
                keep += [mine, other, lengths]
                h = arr[i]
                h.peer = c.peer
                h.count = ids.size
                if pids is None and point_kernel(ids.size, mine.size, ids, their_ids):
                    im = np.ascontiguousarray(ids, dtype=np.int32)
                    it = np.ascontiguousarray(their_ids, dtype=np.int32)
                    keep += [im, it]
                    h.imine = ffi.cast("int32_t *", im.ctypes.data)
                    h.itheirs = ffi.cast("int32_t *", it.ctypes.data)
                h.nruns = mine.size
                h.mine = ffi.cast("int64_t *", mine.ctypes.data)
                h.theirs = ffi.cast("int64_t *", other.ctypes.data)
                h.len = ffi.cast("int64_t *", lengths.ctypes.data)
                if pids is not None:
                    h.pid = pids[node_rank[c.peer]]
                elif bases is not None:
                    h.src = ffi.cast("char *", bases[node_rank[c.peer]])
                h.ready = ffi.cast("void *", c.ready)
                h.tag = ffi.cast("void *", c.tag)
                h.done = ffi.cast("void *", c.done)
            pulls.n, pulls.chan, pulls.esz, pulls.dtype = len(s.recv_chans), arr, ex.esz, ex.dtype
            pulls.cma = int(self.cma)
            readers = ffi.new("hm_pulls *")
            rarr = ffi.new("hm_pull[]", max(len(s.send_chans), 1))
            for i, c in enumerate(s.send_chans):
                rarr[i].peer = c.peer
                rarr[i].done = ffi.cast("void *", c.done)
            readers.n, readers.chan = len(s.send_chans), rarr
            readers.entered = ffi.cast("void *", transport.shm.entered(d))
            copy_policy(pulls.policy, pol)
            copy_policy(readers.policy, pol)
            n = max(len(s.send_chans), 1)
            ready = ffi.new("void *[]", [ffi.cast("void *", c.ready) for c in s.send_chans] or [ffi.NULL] * n)
            tags = ffi.new("void *[]", [ffi.cast("void *", c.tag) for c in s.send_chans] or [ffi.NULL] * n)
            self.dirs.append(_Pulls(pulls, readers, ready, tags, (keep, arr, rarr)))
        # the arguments of hm_zc_update, or None when messages go to other nodes
        self._whole = self.dirs[FWD][:4] if transport.dirs[FWD].msgs.empty else None
        self._only = only

    def bad(self, e):
        """A whole call of direction ``only`` with this object's tag and no points (bad_call)."""
        pulls, readers, ready, tags, _ = self.dirs[self._only]
        return lib.hm_zc_update(pulls, readers, ready, tags, self.tag, ffi.NULL, e), pulls.err

    def update(self, xbuf, e):
        """A whole forward update: one C call when every peer is on this node."""
        if self._whole is None:
            self.begin(FWD, xbuf, e)
            self.end(FWD, xbuf, e, lib.HM_INSERT)
            return
        pulls, readers, ready, tags = self._whole
        rc = lib.hm_zc_update(pulls, readers, ready, tags, self.tag, xbuf, e)
        if rc:
            check(rc, pulls)

    def whole_call(self):
        """The C call of a whole forward update as f(xbuf, e), or None when messages go to
        other nodes (Halo.update's hot path)."""
        if self._whole is None:
            return None
        return functools.partial(lib.hm_zc_update, *self._whole, self.tag)

    def whole_args(self):
        """The structures of hm_zc_update's first four arguments (pulls, readers, ready, tags),
        or None as for whole_call."""
        return self._whole

    def check(self, rc):
        """Raise the Fault of a whole forward update that returned ``rc``."""
        check(rc, self._whole[0])

    def begin(self, d, xbuf, e):
        """Start the messages (packed, across nodes), then publish this vector inside the node."""
        s = self.t.dirs[d]
        s.msgs.start(xbuf, e)
        _, readers, ready, tags, _ = self.dirs[d]
        check(lib.hm_zc_publish(readers, ready, tags, self.tag, xbuf, e), readers)

    def end(self, d, xbuf, e, op):
        """Copy from the node's owners (forward, whichever is ready first) or combine from
        every peer in rank order (reverse), then wait until this rank's readers are done."""
        s = self.t.dirs[d]
        pulls, readers, *_ = self.dirs[d]
        if d == FWD:
            check(lib.hm_pull_recv(pulls, xbuf, self.tag, e, op, 0), pulls)
            if not s.msgs.empty:
                s.msgs.wait("update", e)
                check(lib.hm_xchg_recv(s.msgs.recv.x, xbuf, e, op, 0), s.msgs.recv)
        else:
            check(lib.hm_pull_recv(pulls, xbuf, self.tag, e, op, 1), pulls)
        check(lib.hm_wait_done(readers, e), readers)
