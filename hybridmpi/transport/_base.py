"""Pieces shared by the transports: channels for the C core, MPI messages, deadlines."""

import os
import time
from collections import namedtuple
from typing import Any

import numpy as np

from .._clib import copy_policy, ffi, lib
from .._waits import wait_requests
from ..profile import mark as prof_mark
from ..profile import mark_end as prof_mark_end

FWD, REV = 0, 1

#: One direction of traffic with one peer: local ids, the two buffers (by
#: epoch parity; the same address twice for a private buffer), and the
#: addresses of the READY and DONE counters (None when something else
#: synchronizes) and of the tag word next to READY (which vector was published).
Chan = namedtuple("Chan", "peer ids buf0 buf1 ready done tag", defaults=(None,))


#: channels whose runs of consecutive ids are shorter than this on average are
#: moved point by point through an index list (no branch per point), the others
#: run by run (one memcpy per run)
RUN_KERNEL_MIN = int(os.environ.get("HYBRIDMPI_RUN_KERNEL_MIN") or 8)


def point_kernel(count, nruns, *arrays):
    """Whether a channel of ``count`` points in ``nruns`` runs goes point by point: its runs
    are short and its ``arrays`` of ids fit int32."""
    return (count > 0 and count < RUN_KERNEL_MIN * nruns
            and all(int(a.max()) < 2**31 and int(a.min()) >= 0 for a in arrays))


def runs(ids):
    """Split sorted-or-not local ids into runs of consecutive ids: (starts, lengths)."""
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    first = np.concatenate(([0], np.flatnonzero(np.diff(ids) != 1) + 1))
    lengths = np.diff(np.append(first, ids.size))
    return np.ascontiguousarray(ids[first], dtype=np.int64), lengths.astype(np.int64)


class Xchg:
    """A C ``hm_xchg`` over channels, keeping alive what it points to."""

    def __init__(self, halo, chans, entered=None):
        self.peers = [c.peer for c in chans]
        self._keep = []
        self._arr = ffi.new("hm_chan[]", max(len(chans), 1))
        for i, c in enumerate(chans):
            start, length = runs(c.ids)
            self._keep += [start, length]
            h = self._arr[i]
            h.peer = c.peer
            h.count = c.ids.size
            h.nruns = start.size
            h.run_start = ffi.cast("int64_t *", start.ctypes.data)
            h.run_len = ffi.cast("int64_t *", length.ctypes.data)
            if point_kernel(c.ids.size, start.size, c.ids):
                idx = np.ascontiguousarray(c.ids, dtype=np.int32)
                self._keep.append(idx)
                h.idx = ffi.cast("int32_t *", idx.ctypes.data)
            h.buf[0] = ffi.cast("char *", c.buf0)
            h.buf[1] = ffi.cast("char *", c.buf1)
            h.ready = ffi.cast("void *", c.ready or 0)
            h.done = ffi.cast("void *", c.done or 0)
            h.tag = ffi.cast("void *", c.tag or 0)
        x = self.x = ffi.new("hm_xchg *")
        x.n = len(chans)
        x.chan = self._arr
        x.esz = halo.esz
        x.dtype = halo.dtype_code
        x.entered = ffi.cast("void *", entered or 0)
        copy_policy(x.policy, halo.hc._st.policy)


def private_chans(specs, esz):
    """Channels over one private byte buffer, in the order of ``specs`` [(peer, ids)].

    Returns the buffer, the channels and a byte view of each peer's part.
    """
    total = sum(ids.size for _, ids in specs) * esz
    buf = np.empty(max(total, 1), dtype=np.uint8)
    chans, views, off = [], [], 0
    for peer, ids in specs:
        nb = ids.size * esz
        addr = buf.ctypes.data + off
        chans.append(Chan(peer, ids, addr, addr, None, None))
        views.append(buf[off:off + nb])
        off += nb
    return buf, chans, views


#: MPI tag of the notice a rank sends every other rank when its HybridComm breaks (payload:
#: the HybridComm's nonce), so that ranks waiting on MPI requests raise instead of waiting
ERROR_TAG = 32700

def complete(halo, reqs, peers, what, e, statuses=None):
    """Complete MPI requests, under the Halo's deadline if it has one; a failure notice from
    a peer ends the wait with PeerError.  ``statuses`` (a list as long as ``reqs``) receive
    the requests' statuses."""
    stop = wait_requests(halo.hc, reqs, halo.timeout, statuses=statuses)
    if stop is None:
        return
    if stop.notice is not None:
        raise halo.peer_failed(stop.notice)
    late = [peers[i] for i in stop.late]
    raise halo.timeout_error(f"{what}: the messages with ranks {late} of call {e} did not "
                             "complete", late[0] if len(late) == 1 else None, "message", e)


def wait_until(halo, poll, value, peer, counter, what, e):
    """Call ``poll()`` until it returns at least ``value``, yielding the CPU, under the deadline."""
    deadline = None if halo.timeout is None else time.monotonic() + halo.timeout
    prof_mark()
    while True:
        seen = poll()
        if seen >= value:
            prof_mark_end()
            return
        if deadline is not None and time.monotonic() > deadline:
            raise halo.timeout_error(f"{what}: rank {peer} did not set {counter} to {value} "
                                     f"(it reads {seen})", peer, counter, e)
        os.sched_yield()


#: requests that were still active when their transport was freed (a call failed in its
#: middle), with the buffers MPI may still write: never released
_PENDING: list[Any] = []


def release(reqs, *buffers):
    """Forget ``reqs`` at free; if one is still active, keep it and ``buffers`` alive for
    good, since MPI may still move data into them."""
    try:
        done = not reqs or reqs[0].__class__.Testall(reqs)
    except Exception:  # an MPI error completes the request
        done = True
    if not done:
        _PENDING.append((list(reqs), buffers))


_EMPTY = bytearray(0)


class Transport:
    """What every method shares: a whole call is its begin then its end."""

    def run(self, d, xbuf, e, op):
        self.begin(d, xbuf, e)
        self.end(d, xbuf, e, op)


class Messages:
    """Point-to-point messages with some peers, packed and unpacked by the C core.

    Persistent requests (``Send_init``/``Recv_init``, started together) or a
    fresh ``Irecv``/``Isend`` per call, as flat MPI codes do.
    """

    def __init__(self, halo, sends, recvs, tag, persistent):
        self.halo = halo
        comm = halo.hc.comm
        self._sbuf, schans, sviews = private_chans(sends, halo.esz)
        self._rbuf, self.recv_chans, rviews = private_chans(recvs, halo.esz)
        self.send = Xchg(halo, schans)
        self.recv = Xchg(halo, self.recv_chans)
        self.peers = [p for p, _ in recvs] + [p for p, _ in sends]
        self._pairs = (list(zip([p for p, _ in recvs], rviews)), list(zip([p for p, _ in sends], sviews)))
        self._comm, self._tag = comm, tag
        self._persistent = persistent
        self._reqs = []
        if persistent:
            self._reqs = ([comm.Recv_init(v, p, tag) for p, v in self._pairs[0]]
                          + [comm.Send_init(v, p, tag) for p, v in self._pairs[1]])
        self.empty = not self.peers
        self._MPI = halo.hc._MPI
        self._statuses = [self._MPI.Status() for _ in self.peers]
        # the receives that carry data (an empty one is an invalid call's mark)
        self._expect = [i for i, (_, v) in enumerate(self._pairs[0]) if v.size]

    def start(self, xbuf, e):
        """Pack the sends and start every message."""
        if self.empty:
            return
        comm, tag = self._comm, self._tag
        if self._persistent:
            self.halo.check(lib.hm_xchg_send(self.send.x, xbuf, e), self.send)
            self.halo.hc._MPI.Prequest.Startall(self._reqs)
            return
        reqs = [comm.Irecv(v, p, tag) for p, v in self._pairs[0]]
        self.halo.check(lib.hm_xchg_send(self.send.x, xbuf, e), self.send)
        reqs += [comm.Isend(v, p, tag) for p, v in self._pairs[1]]
        self._reqs = reqs

    def bad(self, d, e):
        """Call ``e`` (direction ``d``) for a rank whose arguments were invalid: an empty
        message where each receiver expects data (it raises unless its arguments were invalid
        too), and each sender's message or empty message taken and dropped, so that nothing
        of this call is left for the next one (a message and its mark share the data's tag:
        MPI keeps them in order)."""
        if self.empty:
            return
        comm, tag = self._comm, self._tag
        reqs = [comm.Irecv(v, p, tag) for p, v in self._pairs[0]]
        reqs += [comm.Isend(_EMPTY, p, tag) for p, _ in self._pairs[1]]
        complete(self.halo, reqs, self.peers, "reverse" if d else "update", e)

    def wait(self, what, e):
        """Complete the messages started last; an empty message from a peer (its arguments
        were invalid: Messages.bad) raises ValueError once all completed."""
        if self.empty:
            return
        st = self._statuses
        complete(self.halo, self._reqs, self.peers, what, e, st)
        for i in self._expect:
            if st[i].Get_count(self._MPI.BYTE) == 0:
                raise self.halo.mismatch_error(self.peers[i], lib.HM_TAG_BAD)

    def free(self):
        release(self._reqs, self._sbuf, self._rbuf)
        if self._persistent:
            for r in self._reqs:
                r.Free()
        self._reqs = []
