"""The C core's channels: one direction of traffic with each peer (:data:`Chan`), built into
the cffi ``hm_xchg`` the C core moves (:class:`Xchg`); the completion of MPI requests under a
Halo's deadline, and the requests kept past a failed call.
"""

from collections import namedtuple
from typing import Any

import numpy as np

from ... import settings
from ..._native.clib import copy_policy, ffi
from ..._native.errmap import Fault
from ..._native.errmap import check as check_rc
from ...comm._waits import wait_requests


def check(rc, x):
    """Raise the Fault of a C exchange call on ``x`` (an ``Xchg``, or a structure with an
    ``err`` field) that returned ``rc``."""
    if rc:
        check_rc(rc, (x.x if isinstance(x, Xchg) else x).err)

#: One direction of traffic with one peer: local ids, the two buffers (by
#: epoch parity; the same address twice for a private buffer), and the
#: addresses of the READY and DONE counters (None when something else
#: synchronizes) and of the tag word next to READY (which vector was published).
Chan = namedtuple("Chan", "peer ids buf0 buf1 ready done tag", defaults=(None,))


#: channels whose runs of consecutive ids are shorter than this on average are
#: moved point by point through an index list (no branch per point), the others
#: run by run (one memcpy per run)
RUN_KERNEL_MIN = settings.run_kernel_min()


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

    def __init__(self, ex, chans, entered=None):
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
        x.esz = ex.esz
        x.dtype = ex.dtype
        x.entered = ffi.cast("void *", entered or 0)
        copy_policy(x.policy, ex.policy)


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

def complete(ex, reqs, peers, what, e, statuses=None):
    """Complete MPI requests, under the Halo's deadline if it has one; a failure notice from
    a peer ends the wait (Fault "notice").  ``peers``: each request's peer rank, or None for
    a collective over the pattern's neighbors.  ``statuses`` (a list as long as ``reqs``)
    receive the requests' statuses."""
    stop = wait_requests(ex.ctx, reqs, ex.timeout, statuses=statuses)
    if stop is None:
        return
    if stop.notice is not None:
        raise Fault("notice", peer=stop.notice)
    late = [peers[i] for i in stop.late]
    who = (f"the neighborhood collective with ranks {list(ex.neighbors)}" if None in late
           else f"the messages with ranks {late}")
    raise Fault("timeout", detail=f"{what}: {who} of call {e} did not complete",
                peer=late[0] if len(late) == 1 else None, counter="message", epoch=e)



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
