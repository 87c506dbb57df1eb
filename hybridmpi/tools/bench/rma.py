"""One-sided communication: latency, bandwidth and overlap (the RMA micro-benchmarks of the
Cray XT3 study) and the coarray ping-pong of XcalableMP, against mpi4py RMA and Send/Recv.

Rank 0 is the origin and rank 1 the target (on the same node, or on another
one with ``--node-size 1`` or MPICH cliques); the other ranks only take part
in the synchronizations.  The target waits in ``MPI_Barrier`` while the
origin is timed, so MPI can progress the operations aimed at it.
"""

import time

import numpy as np

from ...globalmem import Coarray, GlobalMemory, waitall
from ._common import Progress, add, document

PARTS = ("latency", "bandwidth", "overlap", "coarray")


def arguments(p):
    p.add_argument("--sizes", default="8,64,512,4096,32768,262144,1048576,4194304",
                   help="message sizes in bytes")
    p.add_argument("--iters", type=int, default=1000, help="calls per repetition at 8 bytes "
                   "(fewer for larger sizes)")
    p.add_argument("--reps", type=int, default=10, help="repetitions")
    p.add_argument("--window", type=int, default=16, help="operations in flight for bandwidth")
    p.add_argument("--parts", default=",".join(PARTS), help=f"any of {','.join(PARTS)}")


def _iters(a, n):
    return max(5, min(a.iters, a.iters * 4096 // max(n, 1)))


def _origin(hc, comm, call, iters, reps):
    """Time ``call`` on rank 0 alone (µs per call); everyone else waits in MPI_Barrier."""
    samples = []
    for _ in range(reps):
        for _ in range(10):
            hc.barrier()
        dt = 0.0
        if comm.rank == 0:
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            dt = (time.perf_counter() - t0) / iters * 1e6
        comm.Barrier()
        samples.append(comm.bcast(dt, root=0))
    return samples


def _pingpong(hc, comm, first, second, iters, reps):
    """Half a round trip (µs): rank 0 calls ``first`` then ``second``, rank 1 the other way."""
    samples = []
    for _ in range(reps):
        for _ in range(10):
            hc.barrier()
        t0 = time.perf_counter()
        if comm.rank in (0, 1):
            a, b = (first, second) if comm.rank == 0 else (second, first)
            for _ in range(iters):
                a()
                b()
        dt = (time.perf_counter() - t0) / iters / 2 * 1e6
        comm.Barrier()
        samples.append(comm.bcast(dt, root=0))
    return samples


def _spin(us):
    """Busy computation for ``us`` microseconds (no MPI call)."""
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def _overlap(hc, comm, start, iters, reps):
    """(samples of the communication time, max overlap %): computation inserted between
    start and wait, growing until the total time grows (the overlap test of the RMA study)."""
    samples = _origin(hc, comm, lambda: start().wait(), iters, reps)
    base = float(np.median(samples))
    best = 0.0
    for frac in (0.1, 0.25, 0.5, 0.75, 1.0, 1.5):
        work = base * frac

        def call(work=work):
            req = start()
            _spin(work)
            req.wait()

        total = float(np.median(_origin(hc, comm, call, iters, reps)))
        best = max(best, min(1.0, (base + work - total) / base))
    return samples, 100 * max(best, 0.0)


class _Req:
    """An mpi4py request with the wait() of hybridmpi's, for the overlap test."""

    def __init__(self, req):
        self.req = req

    def wait(self):
        self.req.Wait()


def run(hc, comm, a):
    """Put/Get latency and bandwidth, overlap and coarray ping-pong; hybridmpi vs mpi4py."""
    from mpi4py import MPI

    parts = _parts(comm, a)
    sizes = [int(s) for s in a.sizes.split(",")]
    top = max(sizes)
    where = comm.bcast("intranode" if 1 in hc.node_ranks else "internode", root=0)
    doc = document("rma", f"one-sided put/get rank 0 -> rank 1 ({where}), time per call (us)",
                   "bytes", hc, a.node_size, reps=a.reps, iters=a.iters, window=a.window,
                   locality=where, parts=parts)
    mem = GlobalMemory(hc, top * max(a.window, 1) if "bandwidth" in parts else top, np.uint8)
    win = MPI.Win.Allocate(mem.counts[comm.rank], 1, comm=comm)
    win.Lock_all()
    # room for every operation in flight (bandwidth) and the eight coarray messages
    room = top * max(a.window, 8)
    src = np.frombuffer(np.random.default_rng(comm.rank).bytes(room), dtype=np.uint8).copy()
    out = np.empty_like(src)
    view = mem.local_view(1)  # rank 0's view of rank 1's part (every rank decides as rank 0)
    near = where == "intranode"
    bar = Progress(comm, len(sizes) * len(parts), "rma")
    notes = []
    try:
        for n in sizes:
            it = _iters(a, n)
            s, o = src[:n], out[:n]
            if "latency" in parts:
                _latency(hc, comm, doc, mem, win, n, it, a.reps, s, o, near, view)
            if "bandwidth" in parts:
                _bandwidth(hc, comm, doc, mem, win, n, it, a, src, out)
            if "overlap" in parts and n >= 4096:
                _overlap_rget(hc, comm, doc, mem, win, n, it, a.reps, o)
            if "coarray" in parts:
                _coarray(hc, comm, doc, n, it, a.reps, src, out)
            bar.step(f"{n} B")
        if near:
            notes.append("intranode: Rput/Rget copy at once (load/store), so nothing is left to "
                         "overlap")
        doc["notes"] = notes
    finally:
        win.Unlock_all()
        win.Free()
        mem.free()
    return doc


def _parts(comm, a):
    """The parts asked for; SystemExit with fewer than 2 ranks or an unknown part."""
    if comm.size < 2:
        raise SystemExit("hybridmpi bench rma: needs at least 2 ranks (origin 0, target 1)")
    parts = [p for p in a.parts.split(",") if p]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        raise SystemExit(f"hybridmpi bench rma: unknown parts {bad}; use {','.join(PARTS)}")
    return parts


def _latency(hc, comm, doc, mem, win, n, it, reps, s, o, near, view):
    """Blocking and request-based Put/Get of ``n`` bytes against mpi4py RMA and Send/Recv;
    ``near`` (rank 1 on rank 0's node) also a copy into ``view``, rank 0's view of rank 1's part."""
    from mpi4py import MPI

    def mpi_put(s=s, n=n):
        win.Put((s, n, MPI.BYTE), 1, (0, n, MPI.BYTE))
        win.Flush(1)

    def mpi_get(o=o, n=n):
        win.Get((o, n, MPI.BYTE), 1, (0, n, MPI.BYTE))
        win.Flush(1)

    def pp_first(s=s):
        comm.Send(s, dest=1 - comm.rank)

    def pp_second(o=o):
        comm.Recv(o, source=1 - comm.rank)

    add(doc, "mpi4py Put+Flush", n, _origin(hc, comm, mpi_put, it, reps), baseline=True)
    add(doc, "mpi4py Get+Flush", n, _origin(hc, comm, mpi_get, it, reps), baseline=True)
    add(doc, "Send/Recv", n, _pingpong(hc, comm, pp_first, pp_second, it, reps),
        baseline=True)
    add(doc, "Put", n, _origin(hc, comm, lambda s=s: mem.Put(s, 1), it, reps),
        versus="mpi4py Put+Flush")
    add(doc, "Get", n, _origin(hc, comm, lambda o=o: mem.Get(o, 1), it, reps),
        versus="mpi4py Get+Flush")
    add(doc, "Rput+wait", n, _origin(hc, comm, lambda s=s: mem.Rput(s, 1).wait(), it, reps),
        versus="mpi4py Put+Flush")
    add(doc, "Rget+wait", n, _origin(hc, comm, lambda o=o: mem.Rget(o, 1).wait(), it, reps),
        versus="mpi4py Get+Flush")
    if near:
        def copy(s=s, n=n):
            view[:n] = s

        add(doc, "copy into peer", n, _origin(hc, comm, copy, it, reps),
            versus="mpi4py Put+Flush")


def _bandwidth(hc, comm, doc, mem, win, n, it, a, src, out):
    """``a.window`` operations of ``n`` bytes in flight, Rput/Rget against mpi4py Put/Get (time
    per operation and MB/s)."""
    from mpi4py import MPI

    w = a.window

    def bw_put(n=n, w=w):
        waitall([mem.Rput(src[:n], 1, k * n) for k in range(w)])

    def bw_get(n=n, w=w):
        waitall([mem.Rget(out[k * n:(k + 1) * n], 1, k * n) for k in range(w)])

    def bw_mpi_put(n=n, w=w):
        for k in range(w):
            win.Put((src[k * n:], n, MPI.BYTE), 1, (k * n, n, MPI.BYTE))
        win.Flush(1)

    def bw_mpi_get(n=n, w=w):
        for k in range(w):
            win.Get((out[k * n:], n, MPI.BYTE), 1, (k * n, n, MPI.BYTE))
        win.Flush(1)

    bit = max(2, it // w)
    for series, call, versus in (("bw mpi4py Put", bw_mpi_put, None),
                                 ("bw mpi4py Get", bw_mpi_get, None),
                                 ("bw Rput", bw_put, "bw mpi4py Put"),
                                 ("bw Rget", bw_get, "bw mpi4py Get")):
        samples = [t / w for t in _origin(hc, comm, call, bit, a.reps)]
        extra = {"versus": versus} if versus else {}
        row = add(doc, series, n, samples, baseline=versus is None, **extra)
        row["mb_per_s"] = n / row["mean"]


def _overlap_rget(hc, comm, doc, mem, win, n, it, reps, o):
    """The overlap test of Rget of ``n`` bytes, against mpi4py's Rget."""
    from mpi4py import MPI

    t_hm, pct_hm = _overlap(hc, comm, lambda o=o: mem.Rget(o, 1), it, reps)
    t_mpi, pct_mpi = _overlap(
        hc, comm, lambda o=o, n=n: _Req(win.Rget((o, n, MPI.BYTE), 1, (0, n, MPI.BYTE))),
        it, reps)
    add(doc, "overlap mpi4py Rget", n, t_mpi, baseline=True, overlap_pct=pct_mpi)
    add(doc, "overlap Rget", n, t_hm, versus="overlap mpi4py Rget", overlap_pct=pct_hm)


def _coarray(hc, comm, doc, n, it, reps, src, out):
    """Ping-pong through coarrays (XcalableMP Section 4.2): one variable, and eight in a row,
    blocking and non-blocking PUT, against Send/Recv of the same messages."""
    from mpi4py import MPI

    arrays = [Coarray(hc, n, np.uint8) for _ in range(8)]
    other = 1 - comm.rank if comm.rank < 2 else None
    try:
        def put1():
            arrays[0][other][:] = src[:n]
            arrays[0].sync_images(other)

        def put8():
            for c in arrays:
                c[other][:] = src[:n]
            arrays[0].sync_images(other)

        def put8_nb():
            waitall([c.Rput(other, slice(None), src[:n]) for c in arrays])
            arrays[0].sync_images(other)

        def wait_peer():
            arrays[0].sync_images(other)

        def send8():
            MPI.Request.Waitall([comm.Isend(src[:n], other, k) for k in range(8)])

        def recv8():
            MPI.Request.Waitall([comm.Irecv(out[k * n:(k + 1) * n], other, k) for k in range(8)])

        it = max(5, it // 4)
        add(doc, "Send/Recv 1 var", n, _pingpong(
            hc, comm, lambda: comm.Send(src[:n], other), lambda: comm.Recv(out[:n], other), it, reps),
            baseline=True)
        add(doc, "coarray put 1 var", n, _pingpong(hc, comm, put1, wait_peer, it, reps),
            versus="Send/Recv 1 var")
        add(doc, "Send/Recv 8 vars", n, _pingpong(hc, comm, send8, recv8, it, reps), baseline=True)
        add(doc, "coarray put 8 vars", n, _pingpong(hc, comm, put8, wait_peer, it, reps),
            versus="Send/Recv 8 vars")
        add(doc, "coarray put 8 vars nb", n, _pingpong(hc, comm, put8_nb, wait_peer, it, reps),
            versus="Send/Recv 8 vars")
    finally:
        for c in arrays:
            c.free()
