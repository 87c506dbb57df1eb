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
"""

import os

from ._agree import agree, create_agreed
from ._clib import lib
from ._types import as_int, mpi

_R = lib.HM_REGION
#: where MPI libraries map their shared segments on Linux
SHM_DIR = os.environ.get("HYBRIDMPI_SHM_DIR", "/dev/shm")
#: bytes per rank of a new chunk (larger blocks get a chunk of their own size)
CHUNK_BYTES = 4 * 2**20
#: the largest block a rank may ask for: its bytes, offsets and MPI displacements (MPI_Aint)
#: stay far from 2**63 in every sum made with them
MAX_BYTES = 2**62


def round_up(nbytes):
    """``nbytes`` rounded up to the 128-byte region size."""
    return -(-nbytes // _R) * _R


def shm_room():
    """(bytes free for shared memory on this node or None, how it was found)."""
    try:
        st = os.statvfs(SHM_DIR)
        room, where = st.f_bavail * st.f_frsize, f"{SHM_DIR} has"
    except OSError:
        room, where = None, ""
    limit = os.environ.get("HYBRIDMPI_SHM_LIMIT")
    if limit and (room is None or int(limit) < room):
        room, where = int(limit), "HYBRIDMPI_SHM_LIMIT allows"
    return room, where


def check_room(hc, nbytes, what, hint=""):
    """Refuse, on every rank, shared memory that would not fit in /dev/shm (collective).

    A tmpfs that runs out of room mid-run kills the process with SIGBUS
    instead of failing the allocation, so the room is checked first.  Env
    ``HYBRIDMPI_SHM_LIMIT`` (bytes per node) lowers the room further.

    Args:
        nbytes: this rank's bytes (the node's are summed).

    Returns:
        The bytes every rank of this node asked for, in node rank order.

    Raises:
        MemoryError: on every rank, naming ``what``; ``hint`` is appended.
    """
    node = hc.node_comm.allgather(nbytes)
    need = sum(node)
    room, where = shm_room()
    problem = None
    if room is not None and need > room:
        problem = (f"rank {hc.rank}: {what} needs {need / 2**20:.1f} MiB of shared memory on "
                   f"its node, {where} {room / 2**20:.1f} MiB free")
    agree(hc.comm, problem and (MemoryError, problem + hint), what)  # every node agrees
    return node


class Block:
    """One allocation: every rank's part in one chunk.

    Attributes:
        nbytes: this rank's bytes.
        offsets, sizes: every rank's offset in its segment of the chunk and
            its bytes (indexed by rank of the HybridComm).
    """

    def __init__(self, arena, chunk, offsets, sizes, rank):
        self.arena = arena
        self.chunk = chunk
        self.offsets = offsets
        self.sizes = sizes
        self.nbytes = sizes[rank]
        self.rank = rank

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

    def free(self):
        """Give the block back (collective, in the same order on every rank)."""
        if self.chunk is not None:
            self.arena.release(self)
            self.chunk = None


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


class _Chunk:
    def __init__(self, arena, nbytes):
        hc = arena.ctx
        MPI = mpi()
        win, self.base, _ = create_agreed(
            hc, lambda: allocate_shared(hc, nbytes), failed=f"MPI_Win_allocate_shared of {nbytes} bytes",
            exc=MemoryError, where="shared memory", free=lambda made: made[0].Free())
        rma = None
        self.win = win
        self.size = nbytes
        self.free_list = [(0, nbytes)] if nbytes else []
        self.live = 0
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
        if self.rma is not None:
            self.rma.Unlock_all()
            self.rma.Free()
            self.rma = None
        self.win.Unlock_all()
        self.win.Free()


class Arena:
    """Shared memory of one HybridComm, in chunks (see the module docstring)."""

    def __init__(self, ctx):
        self.ctx = ctx   # the HybridComm's Context
        self.chunks = []

    @property
    def windows(self):
        """MPI windows held now (shared and RMA)."""
        return sum(1 + (c.rma is not None) for c in self.chunks)

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
                /dev/shm (or ``HYBRIDMPI_SHM_LIMIT``) or MPI cannot allocate it.
        """
        hc = self.ctx
        problem = None
        nb = as_int(nbytes)
        if nb is None:
            problem = TypeError, f"rank {hc.rank}: {what} needs an int of bytes, got {type(nbytes).__name__}"
        elif not 0 <= nb <= MAX_BYTES:
            problem = ValueError, f"rank {hc.rank}: {what} asked for {nb} bytes, outside [0, {MAX_BYTES}]"
        nb = round_up(nb) if problem is None else 0
        fits = [c.fit(nb) for c in self.chunks]
        views = hc.comm.allgather((nb, fits, problem))
        bad = [v[2] for v in views if v[2] is not None]
        if bad:
            raise bad[0][0](f"hybridmpi: arena: {bad[0][1]}")
        sizes = [v[0] for v in views]
        chosen = None
        for i in range(len(self.chunks)):
            if all(v[1][i] >= 0 for v in views):
                chosen = i
                break
        if chosen is None:
            chunk = self._new_chunk(nb, what, hint)
            self.chunks.append(chunk)
            offsets = [0] * len(views)
        else:
            chunk = self.chunks[chosen]
            offsets = [v[1][chosen] for v in views]
        chunk.take(offsets[hc.rank], nb)
        chunk.live += 1
        return Block(self, chunk, offsets, sizes, hc.rank)

    def _new_chunk(self, nb, what, hint):
        node = check_room(self.ctx, nb, what, hint)
        room, _ = shm_room()
        size = max(nb, CHUNK_BYTES)
        # A full chunk when it fits, else just what was asked for.
        if room is not None and sum(max(n, CHUNK_BYTES) for n in node) > room:
            size = nb
        return _Chunk(self, size)

    def release(self, block):
        """Give ``block`` back (:meth:`Block.free`); a chunk whose last block goes is freed."""
        chunk = block.chunk
        chunk.give(block.offsets[self.ctx.rank], block.nbytes)
        chunk.live -= 1
        if chunk.live == 0:
            self.chunks.remove(chunk)
            if not mpi().Is_finalized():
                chunk.close()

    def free(self):
        """Free every chunk (collective; at HybridComm.free)."""
        chunks, self.chunks = self.chunks, []
        if mpi().Is_finalized():
            return
        for c in chunks:
            c.close()
