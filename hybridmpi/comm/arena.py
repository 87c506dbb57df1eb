"""The shared arena of a HybridComm: shared windows allocated in chunks and sub-allocated.

Every MPI window costs a communicator id (MPICH has 2,048), so objects that
need shared memory (Halo buffers, GlobalMemory, shared vectors) do not get a
window each: they get a block of a chunk.  A chunk is one
``Win.Allocate_shared`` over the node, and, when the HybridComm spans
several nodes, one ``Win.Create`` over the whole communicator exposing the
same memory to MPI RMA (opened once with ``Lock_all(MODE_NOCHECK)``).

Allocation is collective over the HybridComm, in the same order on every
rank, and so is freeing: every rank then holds the same list of blocks, so
they agree without talking when a chunk's last block goes and its windows
are freed.  Each rank's part of a block may have its own size (0 included).

Arrays over a block own their memory (:meth:`Block.array`): each holds a pin
on its block through its ``base``.  A freed block that some rank still views
(its own part, or a node peer's) is not given back: its bytes stay where they
are, no longer written by the library, until every rank's views of it are
gone, which the ranks tell each other at the next allocation.  When a chunk
is freed (its blocks all freed, or the HybridComm freed), the pages that
arrays of this process still view are detached first: their bytes move to
private memory mapped at the same addresses (``mremap``), which goes when the
last of those arrays does.  So a view kept past ``free()`` holds stale
values, never another object's, and costs nothing once it is gone.  One
empty chunk is kept for the next block.
"""

import ctypes
import os

import numpy as np

from .._native.clib import ffi, lib
from .._native.tables import as_int, mpi
from ._agree import agree, allgather, create_agreed
from .room import HYBRIDCOMM_IDS, PAGE, check_room, commit, hold_ids, page_up, round_up, shm_room

_R = lib.HM_REGION
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
_libc.mmap.restype = ctypes.c_void_p
# mremap as the system call itself: an MPI may interpose its own mremap (Intel MPI's OFI
# layer's memory hooks), which dropped the new address (EINVAL)
_SYS_MREMAP = {"x86_64": 25, "aarch64": 216, "ppc64le": 163}.get(os.uname().machine, 25)
_libc.syscall.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                          ctypes.c_int, ctypes.c_void_p]
_libc.syscall.restype = ctypes.c_void_p
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
# munmap as the system call too: an MPI's memory hooks (UCX's) kept about 190 kB for each of
# thousands of single pages unmapped through libc (outside review of share, finding F6)
_SYS_MUNMAP = {"x86_64": 11, "aarch64": 215, "ppc64le": 91}.get(os.uname().machine, 11)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
_MAP_FAILED = ctypes.c_void_p(-1).value
#: detached pages (private memory under arrays that outlived their chunk): address -> blocks
_DETACHED: dict[int, int] = {}
#: bytes per rank of a new chunk (larger blocks get a chunk of their own size); one chunk whose
#: blocks are all freed is kept for the next block when no rank's is larger
CHUNK_BYTES = 4 * 2**20
#: a freed Halo's own window (fence, pscw, lock) is kept for the next Halo of its method when
#: no node rank's segment is larger: MPICH keeps about 300 B of memory per shared window made
#: and freed (finding 13), which reuse avoids
KEEP_WINDOW_BYTES = 2**20
#: the largest block a rank may ask for: its bytes, offsets and MPI displacements (MPI_Aint)
#: stay far from 2**63 in every sum made with them
MAX_BYTES = 2**62


class Block:
    """One allocation: every rank's part in one chunk.

    Attributes:
        nbytes: this rank's bytes.
        offsets, sizes: every rank's offset in its segment of the chunk and
            its bytes (indexed by rank of the HybridComm).
        serial: its number among the arena's blocks, the same on every rank.
        pins: arrays over it alive in this process (:meth:`array`).
    """

    def __init__(self, arena, chunk, offsets, sizes, rank, serial):
        self.arena = arena
        self.chunk = chunk
        self.home = chunk   # the chunk it was made in, also once freed
        self.offsets = offsets
        self.sizes = sizes
        self.nbytes = sizes[rank]
        self.rank = rank
        self.serial = serial
        self.pins = 0
        #: freed where a node peer may still view it: given back only when no rank does
        self.shared = False
        #: the detached pages under its arrays, once its chunk was freed (see the module)
        self.detached: list[int] = []

    def array(self, dtype, count, rank=None, *, offset=0, readonly=False):
        """A numpy array of ``count`` elements of ``dtype`` over rank ``rank``'s part (this
        rank's by default; a rank of this node), from byte ``offset`` of it, which owns its
        memory: its ``base`` pins this block, whose bytes are neither reused nor unmapped while
        the array or anything made from it lives.  ``readonly``: over a read-only buffer, so
        that numpy refuses to make it (or anything made from it) writeable."""
        rank = self.rank if rank is None else rank
        node_rank = self.arena.ctx.node_index[rank]
        nbytes = count * dtype.itemsize
        if nbytes == 0:
            out = np.zeros(count, dtype=dtype)
            out.flags.writeable = not readonly
            return out
        if offset < 0 or offset + nbytes > self.sizes[rank]:
            raise AssertionError(f"hybridmpi: arena: {nbytes} bytes at {offset} over a part of "
                                 f"{self.sizes[rank]}")
        self.pins += 1
        self.arena.viewed[self.serial] = self
        # the destructor only counts (it may run inside any allocation): the arena sweeps
        ptr = ffi.gc(ffi.cast("char *", self.addr(node_rank, rank) + offset), self._unpin, size=0)
        buf = ffi.buffer(ptr, nbytes)
        return np.frombuffer(memoryview(buf).toreadonly() if readonly else buf, dtype=dtype)

    def _unpin(self, _ptr):
        self.pins -= 1
        if self.pins == 0 and self.detached:
            pages, self.detached = self.detached, []
            _undetach(pages)

    def addr(self, node_rank, rank):
        """Address (in this process) of rank ``rank``'s part; it sits at node rank ``node_rank``."""
        return self.chunk.base[node_rank] + self.offsets[rank]

    @property
    def local(self):
        """Address of this rank's part."""
        return self.chunk.base[self.arena.ctx.node_rank] + self.offsets[self.rank]

    @property
    def rma(self):
        """The MPI window over the chunk (None on one node); displacements are :attr:`offsets`."""
        return self.chunk.rma

    def free(self, shared=False):
        """Give the block back (collective, in the same order on every rank).  ``shared``: node
        peers may hold arrays over this rank's part (global memory's ``local_view``); its
        bytes then wait for the ranks' word at the next allocation, not only for this rank's
        own arrays."""
        if self.chunk is not None:
            self.shared = shared
            self.arena.release(self)
            self.chunk = None


class KeptWindow:
    """A shared window of :func:`allocate_shared` with every node rank's usable bytes."""

    __slots__ = ("win", "bases", "pads", "sizes")

    def __init__(self, win, bases, pads, sizes):
        self.win, self.bases, self.pads, self.sizes = win, bases, pads, sizes

    def free(self):
        """``MPI_Win_free`` (collective on the node) and its context id given back."""
        self.win.Free()
        hold_ids(-1)


def allocate_shared(hc, nbytes):
    """A shared window of ``nbytes`` per rank over the node of ``hc`` (collective on the node),
    each rank's segment starting on a 128-byte boundary: one region more is allocated, and
    since shared mappings are page-aligned in every process, every process finds the same
    aligned offset.

    Returns:
        (window, aligned address of each node rank's segment, its offset from the rank's
        window base).
    """
    MPI = mpi()
    info = MPI.Info.Create()
    info.Set("alloc_shared_noncontig", "true")
    try:
        win = MPI.Win.Allocate_shared(nbytes + _R, 1, info=info, comm=hc.node_comm)
    finally:
        info.Free()
    bases, pads = [], []
    for r in range(hc.node_size):
        buf, _ = win.Shared_query(r)
        aligned = -(-buf.address // _R) * _R
        bases.append(aligned)
        pads.append(aligned - buf.address)
    return win, bases, pads


#: chunks of broken HybridComms, never freed (their MPI_Win_free could wait on a failed peer)
_KEPT: list = []


def _views_of(blocks):
    """(first page, bytes) of every run of pages that the parts of ``blocks`` cover in this
    process (each part on this node), merged."""
    pages = set()
    for b in blocks:
        ctx = b.arena.ctx
        for r, nr in ctx.node_index.items():
            if b.sizes[r] > 0:
                lo = b.home.base[nr] + b.offsets[r]
                pages.update(range(lo // PAGE * PAGE, page_up(lo + b.sizes[r]), PAGE))
    return _page_runs(pages)


def _page_runs(pages):
    """(first page, bytes) of each run of adjacent pages among ``pages``, in address order."""
    runs: list[list[int]] = []
    for p in sorted(pages):
        if runs and runs[-1][0] + runs[-1][1] == p:
            runs[-1][1] += PAGE
        else:
            runs.append([p, PAGE])
    return [(lo, n) for lo, n in runs]


def _shared_mapped(runs):
    """Whether each run lies in a shared file mapping (``/proc/self/maps``): memory that
    MPI_Win_free unmaps, so that the addresses are free for the detached copy.  An MPI that
    gives a window heap or private memory (MPICH does for one rank) keeps its addresses busy:
    such a chunk is not detached."""
    maps = []
    with open("/proc/self/maps") as f:
        for line in f:
            span, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            maps.append((lo, hi, perms[3] == "s"))
    return all(any(lo <= a and a + n <= hi and shared for lo, hi, shared in maps) for a, n in runs)


def _mapped(lo, n):
    """Whether any page of [lo, lo + n) is mapped in this process (mincore fails with ENOMEM on
    a range with unmapped pages: each page is asked alone)."""
    vec = ctypes.create_string_buffer(1)
    return any(_libc.mincore(ctypes.c_void_p(p), PAGE, vec) == 0 for p in range(lo, lo + n, PAGE))


def _close_detaching(chunk, blocks, runs):
    """Free ``chunk`` (collective); the pages under arrays over ``blocks`` (those this process
    still views: ``runs``, :func:`_views_of`, in shared mappings) keep their bytes at their
    addresses, in private memory: copied aside first (so that no allocation can fail once the
    chunk is gone), moved back over the addresses that MPI_Win_free unmapped."""
    aside = []
    for lo, n in runs:
        copy = _libc.mmap(None, n, 3, 0x22, -1, 0)   # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
        if copy in (None, _MAP_FAILED):
            for c, m in aside:
                _libc.munmap(c, m)
            raise MemoryError(f"hybridmpi: arena: no memory to keep {n} bytes under arrays that "
                              "outlive their shared memory")
        ctypes.memmove(copy, lo, n)
        aside.append((copy, n))
    chunk.close()
    for (lo, n), (copy, _) in zip(runs, aside, strict=True):
        if _mapped(lo, n):   # the MPI kept the mapping (a cache): its pages are not ours to take
            _libc.munmap(copy, n)
            raise RuntimeError(f"hybridmpi: arena: the MPI kept {n} bytes at {lo:#x} mapped after "
                               "MPI_Win_free; arrays over them may now see another window")
        # MREMAP_MAYMOVE | MREMAP_FIXED: the copy moves to the views' addresses
        if _libc.syscall(_SYS_MREMAP, copy, n, n, 3, lo) != lo:
            raise RuntimeError(f"hybridmpi: arena: mremap to {lo:#x} failed: "
                               f"{os.strerror(ctypes.get_errno())}")
    for b in blocks:
        b.detached = [p for lo, n in _views_of([b]) for p in range(lo, lo + n, PAGE)]
        for p in b.detached:
            _DETACHED[p] = _DETACHED.get(p, 0) + 1


def _undetach(pages):
    """The last array over a detached block went: unmap the pages no other block needs, each
    run of adjacent pages in one system call."""
    gone = []
    for p in pages:
        left = _DETACHED.get(p, 0) - 1
        if left > 0:
            _DETACHED[p] = left
        else:
            _DETACHED.pop(p, None)
            gone.append(p)
    for lo, n in _page_runs(gone):
        _libc.syscall(_SYS_MUNMAP, lo, n, 0, 0, None)


class _Chunk:
    def __init__(self, arena, nbytes):
        hc = arena.ctx
        MPI = mpi()
        arena.made += 1
        self.serial = arena.made   # the same on every rank: chunks are made collectively
        win, self.base, _ = create_agreed(
            hc, lambda: allocate_shared(hc, nbytes), failed=f"MPI_Win_allocate_shared of {nbytes} bytes",
            exc=MemoryError, where="shared memory", free=lambda made: made[0].Free())
        rma = None
        self.win = win
        self.size = nbytes
        self.free_list = [(0, nbytes)] if nbytes else []
        self.live = 0
        self.closed = False
        win.Lock_all(MPI.MODE_NOCHECK)
        if hc.num_nodes > 1:
            mem = MPI.memory.fromaddress(self.base[hc.node_rank], nbytes)

            def undo():
                win.Unlock_all()
                win.Free()
            rma = create_agreed(hc, lambda: MPI.Win.Create(mem, 1, comm=hc.comm), failed="MPI_Win_create",
                                exc=RuntimeError, where="shared memory", undo=undo)
            rma.Lock_all(MPI.MODE_NOCHECK)
        self.rma = rma
        hold_ids(1 + (rma is not None))

    def fit(self, nbytes):
        """Offset of the first free range of ``nbytes`` (-1 if none)."""
        if nbytes == 0:
            return 0
        for off, size in self.free_list:
            if size >= nbytes:
                return off
        return -1

    def take(self, off, nbytes):
        if nbytes == 0:
            return
        for i, (o, s) in enumerate(self.free_list):
            if o == off:
                if s == nbytes:
                    del self.free_list[i]
                else:
                    self.free_list[i] = (o + nbytes, s - nbytes)
                return
        raise AssertionError(f"hybridmpi: arena: offset {off} is not free")

    def give(self, off, nbytes):
        if nbytes == 0:
            return
        fl = self.free_list
        i = 0
        while i < len(fl) and fl[i][0] < off:
            i += 1
        fl.insert(i, (off, nbytes))
        # merge with the next range, then with the previous one
        if i + 1 < len(fl) and fl[i][0] + fl[i][1] == fl[i + 1][0]:
            fl[i] = (fl[i][0], fl[i][1] + fl[i + 1][1])
            del fl[i + 1]
        if i > 0 and fl[i - 1][0] + fl[i - 1][1] == fl[i][0]:
            fl[i - 1] = (fl[i - 1][0], fl[i - 1][1] + fl[i][1])
            del fl[i]

    def close(self):
        self.closed = True
        hold_ids(-1 - (self.rma is not None))
        if self.rma is not None:
            self.rma.Unlock_all()
            self.rma.Free()
            self.rma = None
        self.win.Unlock_all()
        self.win.Free()

    def keep_memory(self):
        """At the HybridComm's free, for a chunk whose views cannot be detached: every MPI
        object goes but the shared window that holds the memory (collective; its context id
        stays held).  An RMA window left open in its epoch made MPICH's later RMA atomics on
        other windows read and write wrong values (fuzz finding 47)."""
        self.closed = True
        if self.rma is not None:
            hold_ids(-1)
            self.rma.Unlock_all()
            self.rma.Free()
            self.rma = None
        self.win.Unlock_all()
        return self.win


class Arena:
    """Shared memory of one HybridComm, in chunks (see the module docstring)."""

    def __init__(self, ctx):
        self.ctx = ctx   # the HybridComm's Context
        self.chunks = []
        self.made = 0    # chunks made so far
        # the HybridComm's own context ids are counted with its arena, given back at its free
        self._comm_ids = HYBRIDCOMM_IDS
        hold_ids(HYBRIDCOMM_IDS)
        #: per method, the window of a freed Halo kept for the next one (:meth:`keep_window`)
        self.kept: dict[str, KeptWindow] = {}
        self.blocks = 0    # blocks made so far (their serials)
        #: blocks arrays were made over, by serial (pruned at allocations: see :meth:`_sweep`)
        self.viewed: dict[int, Block] = {}
        self._viewed_kept = 64   # its size at the last pruning (:meth:`_pinned`)
        #: freed blocks whose bytes are not given back yet (arrays over them may live)
        self.limbo: list[Block] = []

    @property
    def windows(self):
        """MPI windows held now (shared and RMA, kept ones too)."""
        return sum(1 + (c.rma is not None) for c in self.chunks) + len(self.kept)

    def _pinned(self):
        """(block serial, chunk serial) of every freed block an array of this process still
        views: what the ranks tell each other at an allocation (a live block is nobody's to
        give back, so thousands of live objects cost nothing here)."""
        if len(self.viewed) > 2 * self._viewed_kept:   # pruned once it doubled: amortized O(1)
            self.viewed = {k: b for k, b in self.viewed.items() if b.pins > 0}
            self._viewed_kept = max(len(self.viewed), 64)
        return tuple(sorted((b.serial, b.home.serial) for b in self.limbo if b.pins > 0))

    def _sweep(self, seen=None):
        """Give back the freed blocks no array views any more: those of this rank alone at
        once; those node peers may view (``shared``) only when ``seen``, every rank's
        :meth:`_pinned` of one agreement, does not name them."""
        keep = []
        for b in self.limbo:
            if b.pins > 0 or b.shared and (seen is None or b.serial in seen):
                keep.append(b)
            elif not b.home.closed:
                b.home.give(b.offsets[self.ctx.rank], b.nbytes)
        self.limbo = keep

    def reuse_window(self, kind, node):
        """The kept window of method ``kind`` when each node rank's segment holds its bytes in
        ``node`` (node rank order, as :func:`check_room` returns them), else None; a kept one
        too small is freed.  Every rank of a node decides alike from the same sizes, and its
        Halos are made and freed in the same order (agreed), so the windows stay collective."""
        kept = self.kept.pop(kind, None)
        if kept is not None and all(n <= k for n, k in zip(node, kept.sizes, strict=True)):
            return kept
        if kept is not None:
            kept.free()
        return None

    def keep_window(self, kind, kept):
        """Keep the window of a freed Halo of method ``kind`` (where every rank frees it, agreed)
        instead of freeing it, when no node rank's segment exceeds :data:`KEEP_WINDOW_BYTES`;
        the one kept before is freed.  Returns whether it was kept."""
        if max(kept.sizes) > KEEP_WINDOW_BYTES or mpi().Is_finalized():
            return False
        old = self.kept.pop(kind, None)
        if old is not None:
            old.free()
        self.kept[kind] = kept
        return True

    def rma_windows(self):
        """The RMA windows of the chunks (empty on one node)."""
        return [c.rma for c in self.chunks if c.rma is not None]

    def alloc(self, nbytes, what, hint=""):
        """A block of ``nbytes`` on this rank (collective over the HybridComm).

        Args:
            nbytes: this rank's bytes (ranks may differ; rounded up to 128).
            what: the object, for error messages.
            hint: words added to a MemoryError.

        Raises:
            TypeError, ValueError: on every rank, when a rank's ``nbytes`` is not
                an int in [0, MAX_BYTES] (nothing is allocated).
            MemoryError: on every rank, when a new chunk would not fit in
                /dev/shm (or ``HYBRIDMPI_SHM_LIMIT``), MPI cannot allocate it, or
                the block's pages cannot be committed (/dev/shm full).
        """
        hc = self.ctx
        problem = None
        nb = as_int(nbytes)
        if nb is None:
            problem = TypeError, f"rank {hc.rank}: {what} needs an int of bytes, got {type(nbytes).__name__}"
        elif not 0 <= nb <= MAX_BYTES:
            problem = ValueError, f"rank {hc.rank}: {what} asked for {nb} bytes, outside [0, {MAX_BYTES}]"
        nb = round_up(nb) if problem is None else 0
        self._sweep()
        fits = [c.fit(nb) for c in self.chunks]
        # bounded and notice-aware, like every agreement: a rank here while a peer is in
        # another call raises instead of waiting in a blocking allgather; with it, what each
        # rank still views of freed blocks
        big = tuple(c.serial for c in self.chunks if c.live == 0 and c.size > CHUNK_BYTES)
        views = agree(hc.comm, problem, what, data=(nb, fits, self._pinned(), big))
        seen = {b for v in views for b, _ in v[2]}            # blocks some rank views
        big = {c for v in views for c in v[3]}
        sizes = [v[0] for v in views]
        chosen = None
        for i in range(len(self.chunks)):
            if all(v[1][i] >= 0 for v in views):
                chosen = i
                break
        if chosen is None:
            # the empty chunk kept (too small for this block) goes first: every rank holds the
            # same chunks, and is here
            self._close([c for c in self.chunks if c.live == 0])
            chunk = self._new_chunk(nb, what, hint)
            self.chunks.append(chunk)
            offsets = [0] * len(views)
        else:
            chunk = self.chunks[chosen]
            offsets = [v[1][chosen] for v in views]
        chunk.take(offsets[hc.rank], nb)
        chunk.live += 1
        # what nobody views comes back, for the next allocation; of the empty chunks, one
        # (not larger than CHUNK_BYTES on any rank) is kept
        self._sweep(seen)
        empty = [c for c in self.chunks if c.live == 0]
        spare = next((c for c in empty if c.serial not in big), None)
        self._close([c for c in empty if c is not spare])
        self.blocks += 1
        block = Block(self, chunk, offsets, sizes, hc.rank, self.blocks)
        # its pages committed before its owner zeroes them: a full /dev/shm is a MemoryError
        commit(hc, block.local, nb, what, hint, undo=block.free)
        return block

    def _new_chunk(self, nb, what, hint):
        node = check_room(self.ctx, nb, what, hint, ids=1 + (self.ctx.num_nodes > 1))
        room, _ = shm_room()
        size = max(nb, CHUNK_BYTES)
        # A full chunk when it fits, else just what was asked for.
        if room is not None and sum(max(n, CHUNK_BYTES) for n in node) > room:
            size = nb
        return _Chunk(self, size)

    def _close(self, chunks):
        """Free ``chunks`` (collective: every rank frees the same ones, in one order), detaching
        what arrays of this process still view.  Returns the chunks kept instead: where a view
        cannot be detached (the MPI gave private memory), on any rank."""
        kept = []
        for c in chunks:
            viewed = [b for b in self.viewed.values() if b.home is c and b.pins > 0]
            runs = _views_of(viewed)
            can = not runs or _shared_mapped(runs)
            if self.ctx.size > 1:   # every rank decides alike
                can = all(allgather(self.ctx, self.ctx.comm, can, "free()"))
            if not can:
                kept.append(c)
                continue
            if c in self.chunks:
                self.chunks.remove(c)
            self.limbo = [b for b in self.limbo if b.home is not c]
            _close_detaching(c, viewed, runs)
        return kept

    def release(self, block):
        """Give ``block`` back (:meth:`Block.free`); a chunk whose last block goes is freed,
        unless an array of any rank views it, or it is kept as the one empty chunk."""
        chunk = block.chunk
        if block.pins > 0 or block.shared:
            self.limbo.append(block)
        else:
            chunk.give(block.offsets[self.ctx.rank], block.nbytes)
        chunk.live -= 1
        if chunk.live == 0:
            if mpi().Is_finalized():
                self.chunks.remove(chunk)
                hold_ids(-1 - (chunk.rma is not None))
                return
            small = chunk.size <= CHUNK_BYTES
            viewed = self.ctx.agree_views(f"shared memory chunk {chunk.serial}", small)
            if viewed is None:
                # MPI_Win_free is collective: the comm broke (also found by this agreement),
                # and a peer may never come; kept (its ids stay held)
                self.chunks.remove(chunk)
                _KEPT.append(chunk)
            elif not (all(viewed) and all(c.live for c in self.chunks if c is not chunk)):
                self._close([chunk])
            # else the one empty chunk, kept for the next block: MPICH keeps about 300 B of
            # memory per shared window made and freed (finding 13), which a Halo with a vector,
            # made and freed in a loop, paid at every turn

    def free(self):
        """Free every chunk (collective; at HybridComm.free), detaching what arrays of this
        process still view."""
        chunks = list(self.chunks)
        kept, self.kept = list(self.kept.values()), {}
        if self.ctx.broken() is not None and not mpi().Is_finalized():
            self.chunks, self.limbo = [], []
            _KEPT.extend(w.win for w in kept)
            # as in release: nothing collective; the comm's communicators and window and these
            # chunks are kept, so their context ids stay counted (the budget refuses a new
            # HybridComm before the MPI runs out, after many recoveries)
            _KEPT.extend(chunks)
            return
        hold_ids(-self._comm_ids)
        self._comm_ids = 0
        if mpi().Is_finalized():
            self.chunks, self.limbo = [], []
            hold_ids(-sum(1 + (c.rma is not None) for c in chunks) - len(kept))
            return
        for w in kept:
            w.free()
        # a chunk whose views cannot be detached keeps its memory until the program ends
        _KEPT.extend(c.keep_memory() for c in self._close(chunks))
        self.chunks, self.limbo = [], []
