"""Method "atomic": shared buffers synchronized by C11 epoch counters (docs/design.md).

Per directed intranode channel s -> r: s packs into the buffer of the
epoch's parity and release-stores READY = e; r acquire-waits READY >= e,
copies into its ghosts and release-stores DONE = e; s waits DONE >= e - 2
before it packs that buffer again.  No node-wide barrier, and the whole
intranode part of a call is one C call.  Internode channels are persistent
MPI requests, started before the intranode work and completed after it.

Two more ways to move the intranode part belong to this method, over the
same counters (:class:`ZeroCopy`): shared vectors read in place by their
readers, and private arrays read by cross-memory attach.
"""

import functools
import os
from collections import namedtuple

import numpy as np

from ..._native.clib import copy_policy, ffi, lib
from ..._native.errmap import TAG_INVALID, ok
from ..._native.tables import mpi
from ...comm._agree import allgather, alltoall
from ._base import FWD, REV, check, point_kernel
from ._shm import ShmTransport

#: channel size (bytes) from which shared vectors are updated without staging buffers
ZERO_COPY_BYTES = 6 * 1024
#: channel size (bytes) from which blocking updates of private arrays read the owner's array
#: with process_vm_readv (cross-memory attach), when the runs average CMA_MIN_RUN points
CMA_BYTES = 8 * 1024
CMA_MIN_RUN = 64


class Atomic(ShmTransport):
    """The method's policies are its own: which path a call takes (the packed exchange, zero
    copy for a shared vector, cross-memory attach for a private array) follows from the
    Exchange's agreed :class:`~._base.Paths`, the same on every rank."""

    def __init__(self, ex):
        super().__init__(ex, lock_all=True, counters=True, persistent=True)
        self._bad = None
        self._theirs = None

    def prepare(self):
        """Blocking forward updates of private arrays by cross-memory attach: large channels
        of long runs, on a node where process_vm_readv works (the same choice everywhere;
        every rank enters the probe, also one alone on its node)."""
        ex = self.ex
        paths = ex.paths
        if paths.biggest >= paths.cma_bytes:
            pids = cma_pids(ex.ctx)
            if pids:
                runs = paths.cma and self.long_runs(self.node_ids(), CMA_MIN_RUN)
                if ex.ctx.comm.allreduce(int(runs), op=mpi().MIN):
                    self.cross_memory = ZeroCopy(self, lib.HM_TAG_CMA, None, self.node_ids(), pids)

    def node_ids(self):
        """Per direction: each node peer's ids of its channel to this rank (collective on the
        node the first time)."""
        if self._theirs is None:
            ctx = self.ex.ctx
            self._theirs = []
            for d in (FWD, REV):
                sends = dict(self.ex.plans[d][0])
                got = alltoall(ctx, ctx.node_comm, [sends.get(r) for r in ctx.node_ranks], "Halo")
                self._theirs.append({ctx.node_ranks[i]: ids for i, ids in enumerate(got)
                                     if ids is not None})
        return self._theirs

    def packed(self, d):
        """(send, recv) ``hm_xchg`` structures of a whole call of direction ``d`` when every
        peer is on this node (one C call: the Halo's hot path), else None."""
        s = self.dirs[d]
        return (s.send.x, s.recv.x) if s.msgs.empty else None

    def fault(self, d, rc):
        """Raise the Fault of a whole packed call of direction ``d`` that returned ``rc``."""
        s = self.dirs[d]
        check(rc, s.send if s.send.x.err.code else s.recv)

    def shared_vector(self, tag, bases):
        """Updates of one shared vector (``bases``: its address on each node rank) without
        staging, when the largest channel inside a node carries ``zero_copy_bytes`` (zero copy
        needs one more hop, the owner waiting until its readers copied: it pays off from
        there); else None (collective on the node the first time)."""
        if self.ex.paths.biggest < self.ex.paths.zero_copy_bytes:
            return None
        return ZeroCopy(self, tag, bases, self.node_ids())

    def long_runs(self, theirs, min_run):
        """Whether every forward channel inside the node moves runs of at least ``min_run``
        points on average (counted in (my point, peer's point) pairs)."""
        for c in self.dirs[FWD].recv_chans:
            mine, _, _ = _pair_runs(np.asarray(c.ids), np.asarray(theirs[FWD][c.peer]))
            if c.ids.size < min_run * mine.size:
                return False
        return True

    def words(self):
        """The words this rank writes that its node peers wait on (READY of every sending
        channel, DONE of every receiving channel, both directions): where its error bits go."""
        return [c.ready for s in self.dirs for c in s.send_chans] + \
               [c.done for s in self.dirs for c in s.recv_chans]

    def bad_call(self, d, e):
        """Call ``e`` of direction ``d`` for a rank whose arguments were invalid: publish
        the invalid tag instead of data and read the node peers' tags (nothing is copied),
        and the same over messages (Messages.bad).  Returns whether every peer sending to
        this rank was invalid too."""
        if self._bad is None:
            self._bad = [ZeroCopy(self, TAG_INVALID, None, None, None, empty=True, only=d2)
                         for d2 in (FWD, REV)]
        rc, _ = self._bad[d].bad(e)
        good_far = self.dirs[d].msgs.bad(d, e)
        return ok(rc) and good_far == 0

    def run(self, d, xbuf, e, op):
        s = self.dirs[d]
        if not s.msgs.empty:
            super().run(d, xbuf, e, op)
            return
        rc = lib.hm_xchg_both(s.send.x, s.recv.x, xbuf, e, op, d)
        if rc:
            self.fault(d, rc)


def _pair_runs(mine, theirs):
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
                mine, other, lengths = _pair_runs(ids, their_ids)
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
