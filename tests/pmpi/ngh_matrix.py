"""Neighbourhood collectives, checked against the MPI standard alone: a black-box program for the
PMPI library (tests/test_pmpi.py runs it with the library preloaded) that passes on MPI alone.

Run as ``mpiexec -n N python ngh_matrix.py CASE [CASE ...]`` (``all``: every case but the two
erroneous ones).  Every receive buffer is computed from the standard (the neighbour order of
MPI_Dist_graph_neighbors and of MPI_Cart_shift; the k-th send to d matches the k-th receive from
s) and compared bit for bit, gaps between the blocks included, and every send buffer must come
back unchanged.  The values hash (call, sender, edge, index), so a byte in the wrong place shows.
Per case rank 0 prints ``ngh_matrix CASE ok (T s)`` when every rank agrees (a plain
MPI_Allreduce of the verdicts); a mismatch is named on stderr by the rank that sees it and the
exit code is 1; an unexpected exception aborts the job (exit code 2), so nothing is left waiting.

The data are fresh every run (the seed is printed with a failure; NGH_MATRIX_SEED=S repeats
them); NGH_MATRIX_ITER=K scales the iterations (default 1; 0.3 is a quick run).

Cases:
  adjacent    random graphs from MPI_Dist_graph_create_adjacent (self-loops, repeated edges,
              empty lists, zero counts, gaps and shuffled displacements, four datatypes and two
              pairs of different types of one signature, 400 kB edges): every operation, blocking
              and nonblocking, counts new every call
  general     graphs from MPI_Dist_graph_create (edges given by any rank; the order read back)
              and symmetric ones from MPI_Graph_create: the same arguments and buffers for five
              calls, then new ones
  completion  the I* forms completed by Wait, Waitall (with plain Isend/Irecv in the array),
              Waitany, Waitsome, Test, Testall, Testany, Testsome, Request_get_status, or
              Request_free (erroneous for a collective since MPI-3.0, but MPICH takes it: the next
              call must still be right; where MPI refuses it, the request is waited for)
  cart        Cartesian communicators, 1-D to 3-D, periodic (1 or 2 ranks a dimension: one rank
              its own neighbour twice, or another rank both neighbours) and not (MPI_PROC_NULL:
              the block stays untouched), reorder=True, grids smaller than the job
  interleave  with MPI_Allreduce, blocking MPI_Sendrecv while an Ineighbor call is pending, an
              MPI_ANY_SOURCE/ANY_TAG receive beside one, two pending calls completed in reverse
              order, and random sleeps between the calls
  threads     with MPI_THREAD_MULTIPLE: a thread a communicator, all at once
  legal       free-running sequences: up to 40 calls outstanding (counts near the staging limit,
              400 kB edges), derived types freed once posted and new types made at once, a
              blocking MPI_Sendrecv before any wait, completion in a random order by any call
  asymmetric  (erroneous, run alone) rank 0 lists 1 as destination, 1 does not list 0 as source:
              three calls on every rank; each rank prints on stderr the first error it was told
              ("rank R: call K failed: ...") and which calls failed ("rank R: calls [...] failed"
              or "rank R: no error"); exit code 1 when any rank got an error, 0 when none did
              (MPI need not tell)
  mismatch    (erroneous, run alone) rank 0's receive count on its one edge is one less than the
              sender's (999 doubles of 1,000): the same, and "rank R: call K wrote past the receive
              blocks" when the 64 doubles after them changed
"""

import os
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from math import lcm

import numpy as np
from mpi4py import MPI

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
SCALE = float(os.environ.get("NGH_MATRIX_ITER", "1"))
BIG = 400_000   # bytes of a large edge: past every eager limit and a small staging area
STAGE = 12_288  # bytes a peer's edges are staged up to (HYBRIDMPI_PMPI_NEIGHBOR_STAGE's default)
KEEP = []       # the buffers of freed requests: MPI may still use them


def iterations(n):
    return max(2, round(n * SCALE))


def shared_seed():
    seed = os.environ.get("NGH_MATRIX_SEED")
    seed = int(seed) if seed else int.from_bytes(os.urandom(4), "little")
    return WORLD.bcast(seed, root=0)


SEED = shared_seed()

# -- values ------------------------------------------------------------------------------------

_M = (1 << 64) - 1


def _hash(*keys):
    h = SEED
    for k in keys:
        h = (h * 0x9E3779B97F4A7C15 + (k & _M) + 0x632BE59BD9B4E019) & _M
        h ^= h >> 29
    return h


def _splitmix(base, n):
    with np.errstate(over="ignore"):
        x = np.uint64(base) + np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def values(dtype, n, *keys):
    """``n`` values of ``dtype`` that hash ``keys`` and each index: float64 values are normal
    numbers with every mantissa bit random and exponents over 2**-32..2**31 (no NaN, so that a
    library may even copy them through a float register)."""
    bits = _splitmix(_hash(*keys), n)
    if dtype == np.float64:
        exp = (np.uint64(0x3FF - 32) + ((bits >> np.uint64(52)) & np.uint64(63))) << np.uint64(52)
        frac = bits & np.uint64((1 << 52) - 1)
        return (exp | frac | (bits & np.uint64(1 << 63))).view(np.float64)
    if dtype == np.int32:
        return (bits & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32)
    return (bits & np.uint64(0xFF)).astype(np.uint8)


# -- datatypes ---------------------------------------------------------------------------------

class Variant:
    """Element type of the data, and the MPI types that send and receive it (``sb``/``rb``:
    bytes a unit of each).  Counts and displacements are in units of each side's type; an edge
    holds a whole number of granules of ``g`` bytes, a unit of both sides."""

    def __init__(self, name, dtype, stype, rtype):
        self.name, self.dtype, self.stype, self.rtype = name, np.dtype(dtype), stype, rtype
        self.es = self.dtype.itemsize
        self.sb, self.rb = stype.Get_size(), rtype.Get_size()
        self.g = lcm(self.es, self.sb, self.rb)

    def el(self, granules):
        return granules * self.g // self.es

    def su(self, granules):
        return granules * self.g // self.sb

    def ru(self, granules):
        return granules * self.g // self.rb


DOUBLE2 = MPI.DOUBLE.Create_contiguous(2).Commit()
DOUBLE3 = MPI.DOUBLE.Create_contiguous(3).Commit()
VARIANTS = [
    Variant("float64", np.float64, MPI.DOUBLE, MPI.DOUBLE),
    Variant("int32", np.int32, MPI.INT32_T, MPI.INT32_T),
    Variant("byte", np.uint8, MPI.BYTE, MPI.BYTE),
    Variant("float64 as MPI_BYTE", np.float64, MPI.BYTE, MPI.BYTE),
    # one signature, two types: 2 doubles a unit sent, 1 received; 1 sent, 3 received
    Variant("float64 2x->1", np.float64, DOUBLE2, MPI.DOUBLE),
    Variant("float64 1->3x", np.float64, MPI.DOUBLE, DOUBLE3),
]


def granules(rng, var, n, big, near=False):
    """``n`` counts in granules, drawn from ``rng`` (the same on every rank): a fifth zero, most
    small, some up to a few kB, with ``big`` about a third of BIG bytes, and with ``near`` half
    of them within a few granules of STAGE bytes (the staging limit)."""
    pick = rng.random(n)
    out = np.where(pick < 0.2, 0, np.where(pick < 0.6, rng.integers(1, 5, n), rng.integers(5, 400, n)))
    if big:
        out = np.where(rng.random(n) < 0.3, BIG // var.g, out)
    if near:
        out = np.where(rng.random(n) < 0.5, np.maximum(STAGE // var.g + rng.integers(-3, 4, n), 0), out)
    return [int(c) for c in out]


# -- topologies --------------------------------------------------------------------------------

class Topo:
    """The whole job's neighbour lists in ``comm``'s ranks, and for this rank's every receive
    block the sender's rank and send-block index that the standard says fill it (None: from
    MPI_PROC_NULL)."""

    def __init__(self, comm, sources, dests, match, what):
        self.comm, self.sources, self.dests, self.what = comm, sources, dests, what
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.match = match

    def describe(self):
        r = self.rank
        return f"{self.what}; rank {r}: sources {self.sources[r]}, destinations {self.dests[r]}"


def occurrence_match(rank, sources, dests):
    """Receive block m of ``rank`` from s is s's k-th send block, where d = ``rank`` occurs as
    often in s's destinations before k as s occurs in ``rank``'s sources before m."""
    at = {}
    for s, ds in enumerate(dests):
        seen = Counter()
        for k, d in enumerate(ds):
            at[(s, d, seen[d])] = k
            seen[d] += 1
    seen = Counter()
    match = []
    for s in sources[rank]:
        match.append((s, at[(s, rank, seen[s])]))
        seen[s] += 1
    return match


def random_edges(rng, n):
    """Edges (s, d) of a random graph on ``n`` ranks: sometimes none, else self-loops, repeated
    edges and ranks with no in- or out-edge among them."""
    if rng.random() < 0.1:
        return []
    edges = []
    for _ in range(int(rng.integers(1, 3 * n + 3))):
        u = rng.random()
        if edges and u < 0.2:
            edges.append(edges[int(rng.integers(len(edges)))])
        elif u < 0.35:
            s = int(rng.integers(n))
            edges.append((s, s))
        else:
            edges.append((int(rng.integers(n)), int(rng.integers(n))))
    if n > 2 and rng.random() < 0.5:   # a rank that only receives
        edges = [e for e in edges if e[0] != n - 1]
    return edges


def edge_lists(rng, n, edges):
    sources, dests = [[] for _ in range(n)], [[] for _ in range(n)]
    for s, d in edges:
        dests[s].append(d)
        sources[d].append(s)
    return ([[x[i] for i in rng.permutation(len(x))] for x in sources],
            [[x[i] for i in rng.permutation(len(x))] for x in dests])


def adjacent_graph(rng, local, fails, comm=WORLD):
    """A random graph made by MPI_Dist_graph_create_adjacent (weighted or not; the weights are
    ``local``'s, this rank's own)."""
    n = comm.Get_size()
    sources, dests = edge_lists(rng, n, random_edges(rng, n))
    r = comm.Get_rank()
    weighted = rng.random() < 0.5
    sw = [int(w) for w in local.integers(1, 9, len(sources[r]))] if weighted else None
    dw = [int(w) for w in local.integers(1, 9, len(dests[r]))] if weighted else None
    g = comm.Create_dist_graph_adjacent(sources[r], dests[r], sw, dw, reorder=False)
    got = g.Get_dist_neighbors()
    if list(got[0]) != sources[r] or list(got[1]) != dests[r]:
        fails.append(f"rank {r}: MPI_Dist_graph_neighbors gave sources {got[0]}, destinations "
                     f"{got[1]}; the graph was made with {sources[r]}, {dests[r]}")
        sources[r], dests[r] = list(got[0]), list(got[1])
    return Topo(g, sources, dests, occurrence_match(r, sources, dests),
                f"adjacent graph{' (weighted)' if weighted else ''}")


def general_graph(rng, fails):
    """A random graph made by MPI_Dist_graph_create, each edge given by a random rank; the
    neighbour order is MPI's, read back and shared."""
    edges = random_edges(rng, SIZE)
    owner = rng.integers(SIZE, size=len(edges))
    mine = {}
    for (s, d), o in zip(edges, owner):
        if o == RANK:
            mine.setdefault(s, []).append(d)
    srcs = list(mine)
    g = WORLD.Create_dist_graph(srcs, [len(mine[s]) for s in srcs], [d for s in srcs for d in mine[s]],
                                reorder=False)
    got = g.Get_dist_neighbors()
    everyone = WORLD.allgather((list(got[0]), list(got[1])))
    sources, dests = [e[0] for e in everyone], [e[1] for e in everyone]
    made = Counter(edges)
    if Counter((s, d) for s in range(SIZE) for d in dests[s]) != made or \
            Counter((s, d) for d in range(SIZE) for s in sources[d]) != made:
        fails.append(f"rank {RANK}: MPI_Dist_graph_neighbors of the job: sources {sources}, "
                     f"destinations {dests}; the graph was made of the edges {sorted(edges)}")
        return None
    return Topo(g, sources, dests, occurrence_match(RANK, sources, dests), "general graph")


def graph_topo(rng, fails):
    """A random symmetric graph made by MPI_Graph_create (the standard allows neighbourhood
    collectives on no other): self-loops (listed once) and repeated edges."""
    lists = [[] for _ in range(SIZE)]
    for s, d in random_edges(rng, SIZE):
        lists[s].append(d)
        if d != s:
            lists[d].append(s)
    lists = [[x[i] for i in rng.permutation(len(x))] for x in lists]
    # mpi4py drops a leading 0 of index (offsets as in CSR): give it always, so that a first
    # node with no edge is not read as one node fewer
    index = [0] + [int(i) for i in np.cumsum([len(x) for x in lists])]
    g = WORLD.Create_graph(index, [d for x in lists for d in x], reorder=False)
    got = list(g.Get_neighbors(RANK))
    if got != lists[RANK]:
        fails.append(f"rank {RANK}: MPI_Graph_neighbors gave {got}; the graph was made with {lists[RANK]}")
        return None
    return Topo(g, lists, lists, occurrence_match(RANK, lists, lists), "graph (MPI_Graph_create)")


def cart_topo(cart):
    """Neighbours in the order of the standard: per dimension the -1 then the +1 neighbour.
    Receive block 2d comes from the -1 neighbour, which sent it as its block 2d+1 (to its +1
    neighbour); block 2d+1 from the +1 neighbour's block 2d."""
    n = cart.Get_size()
    dims, periods = cart.Get_dim(), cart.periods

    def shift(r, d, step):
        c = list(cart.Get_coords(r))
        c[d] += step
        if not 0 <= c[d] < cart.dims[d]:
            if not periods[d]:
                return MPI.PROC_NULL
            c[d] %= cart.dims[d]
        return cart.Get_cart_rank(c)

    lists = [[shift(r, d, step) for d in range(dims) for step in (-1, 1)] for r in range(n)]
    r = cart.Get_rank()
    match = [None if s == MPI.PROC_NULL else (s, m ^ 1) for m, s in enumerate(lists[r])]
    return Topo(cart, lists, lists, match, f"cart dims {cart.dims} periods {periods}")


# -- one call ----------------------------------------------------------------------------------

OPS = ["alltoallv", "alltoall", "allgather", "allgatherv"]
FUNCS = {op: (f"Neighbor_{op}", f"Ineighbor_{op}") for op in OPS}


def spread(rng, sizes, gaps):
    """Displacements of blocks of ``sizes`` laid out in a random order, with random gaps."""
    displs, pos = [0] * len(sizes), 0
    for i in rng.permutation(len(sizes)):
        pos += int(rng.integers(0, 3)) if gaps else 0
        displs[i] = pos
        pos += sizes[i]
    return displs, pos + (int(rng.integers(0, 3)) if gaps else 0)


class Call:
    """One neighbourhood call on ``topo``: buffers, arguments and the receive buffer's expected
    contents.  Every rank makes the same Calls in the same order (``rng`` is shared; ``local``
    is this rank's own, for the layout of its buffers)."""

    def __init__(self, topo, op, var, rng, local, *, big=False, near=False):
        self.topo, self.op, self.var = topo, op, var
        n, r = topo.size, topo.rank
        # counts in granules, the job's: cnt[s][k] for send block k of rank s (one block for
        # the allgathers); the same count on every edge for alltoall and allgather
        self.gather = op.startswith("allgather")
        uniform = op in ("alltoall", "allgather")
        if uniform:
            c = granules(rng, var, 1, big, near)[0]
            cnt = [[c] * (1 if self.gather else len(topo.dests[s])) for s in range(n)]
        elif op == "alltoallv":
            cnt = [granules(rng, var, len(topo.dests[s]), big, near) for s in range(n)]
        else:
            cnt = [[c] for c in granules(rng, var, n, big, near)]
        # send blocks: (element offset, elements, block index)
        sizes = cnt[r]
        if op == "alltoallv":
            sd, stotal = spread(local, sizes, True)
        else:
            sd, stotal = [k * c for k in range(len(sizes))] if uniform else [0], sum(sizes)
        self.send_blocks = [(var.el(d), var.el(b), -1 if self.gather else k)
                            for k, (d, b) in enumerate(zip(sd, sizes))]
        self.sendbuf = np.empty(var.el(stotal), var.dtype)
        # receive blocks: (element offset, elements, (sender, its block) or None)
        if uniform:
            rsizes = [c] * len(topo.match)
            rd, rtotal = [m * c for m in range(len(rsizes))], c * len(rsizes)
        else:   # from MPI_PROC_NULL: any count
            rsizes = [int(local.integers(0, 4)) if got is None else cnt[got[0]][0 if self.gather else got[1]]
                      for got in topo.match]
            rd, rtotal = spread(local, rsizes, True)
        self.recv_blocks = [(var.el(d), var.el(b), got) for d, b, got in zip(rd, rsizes, topo.match)]
        self.recvbuf = np.empty(var.el(rtotal), var.dtype)
        st, rt = var.stype, var.rtype
        if op == "alltoallv":
            self.sarg = [self.sendbuf, ([var.su(b) for b in sizes], [var.su(d) for d in sd]), st]
        else:
            self.sarg = [self.sendbuf, var.su(c if uniform else stotal), st]
        if uniform:
            self.rarg = [self.recvbuf, var.ru(c), rt]
        else:
            self.rarg = [self.recvbuf, ([var.ru(b) for b in rsizes], [var.ru(d) for d in rd]), rt]

    def fill(self, key):
        """Fresh data for call ``key``: the send blocks, garbage elsewhere, and the receive
        buffer's expected contents."""
        dt, r = self.var.dtype, self.topo.rank
        self.sendbuf[:] = values(dt, self.sendbuf.size, key, r, 1 << 40)
        for off, n, k in self.send_blocks:
            self.sendbuf[off:off + n] = values(dt, n, key, r, k)
        self.sendcopy = self.sendbuf.copy()
        self.recvbuf[:] = values(dt, self.recvbuf.size, key, r, 1 << 41)
        self.expected = self.recvbuf.copy()
        for off, n, got in self.recv_blocks:
            if got is not None:
                s, k = got
                self.expected[off:off + n] = values(dt, n, key, s, -1 if self.gather else k)
        return self

    def start(self, nonblocking=False):
        return getattr(self.topo.comm, FUNCS[self.op][nonblocking])(self.sarg, self.rarg)

    def name(self, nonblocking=False):
        return f"MPI_{FUNCS[self.op][nonblocking]} ({self.var.name})"

    def check(self, fails, what):
        """Appends to ``fails`` what differs from the standard's result, if anything."""
        got, want = self.recvbuf.view(np.uint8), self.expected.view(np.uint8)
        bad = np.flatnonzero(got != want)
        r = self.topo.rank
        if bad.size:
            i = int(bad[0]) // self.var.es
            where = "outside every block"
            for m, (off, n, src) in enumerate(self.recv_blocks):
                if off <= i < off + n:
                    frm = "MPI_PROC_NULL" if src is None else f"rank {src[0]}'s send block {src[1]}"
                    where = f"receive block {m} (from {frm}) element {i - off} of {n}"
                    break
            fails.append(f"{what}: rank {r}: receive buffer element {i} ({where}): got "
                         f"{self.recvbuf[i].item()!r}, expected {self.expected[i].item()!r} "
                         f"({bad.size} bytes differ); {self.topo.describe()}; seed {SEED}")
        if not np.array_equal(self.sendbuf.view(np.uint8), self.sendcopy.view(np.uint8)):
            fails.append(f"{what}: rank {r}: the send buffer was changed; seed {SEED}")


# -- helpers of the cases ----------------------------------------------------------------------

class Case:
    """State one case shares between its steps: the shared and local generators, a call counter
    and the failures seen on this rank."""

    def __init__(self, name, number):
        self.name, self.number, self.fails, self.calls = name, number, [], 0
        self.rng = np.random.default_rng([SEED, number])
        self.local = np.random.default_rng([SEED, number, 1 + RANK])

    def call(self, topo, op, var, *, big=False, near=False):
        return Call(topo, op, var, self.rng, self.local, big=big, near=near).fill(self.key())

    def key(self):
        """A new call's key: its values differ from every other call's of the run."""
        self.calls += 1
        return (self.number << 32) | self.calls

    def pick(self, seq):
        return seq[int(self.rng.integers(len(seq)))]


def ring_p2p(comm, key, tag, n=37):
    """Isend to the next rank and Irecv from the previous on ``comm``: (requests, check)."""
    nxt, prv = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    sbuf = values(np.float64, n, key, comm.rank, 1 << 42)
    rbuf = np.zeros(n)
    reqs = [comm.Irecv([rbuf, MPI.DOUBLE], prv, tag), comm.Isend([sbuf, MPI.DOUBLE], nxt, tag)]

    def check(fails, what):
        if not np.array_equal(rbuf.view(np.uint64), values(np.float64, n, key, prv, 1 << 42).view(np.uint64)):
            fails.append(f"{what}: rank {comm.rank}: the plain message from rank {prv} is wrong")
    return reqs, check


def complete(mode, reqs, fails, what):
    """Completes every request of ``reqs`` by ``mode``; checks each is reported done once."""
    n = len(reqs)
    if mode == "wait":
        for q in reqs:
            q.Wait()
    elif mode == "waitall":
        MPI.Request.Waitall(reqs)
    elif mode == "test":
        for q in reqs:
            while not q.Test():
                os.sched_yield()
    elif mode == "testall":
        while not MPI.Request.Testall(reqs):
            os.sched_yield()
    elif mode == "get_status":
        for q in reqs:
            while not q.Get_status():
                os.sched_yield()
            if not q.Get_status():
                fails.append(f"{what}: rank {RANK}: MPI_Request_get_status said done, then not")
            q.Wait()
    elif mode in ("waitany", "testany", "waitsome", "testsome"):
        seen = []
        while len(seen) < n + 1:
            if mode == "waitany":
                i = MPI.Request.Waitany(reqs)
                got = None if i == MPI.UNDEFINED else [i]
            elif mode == "testany":
                i, flag = MPI.Request.Testany(reqs)
                if not flag:
                    os.sched_yield()
                    continue
                got = None if i == MPI.UNDEFINED else [i]
            elif mode == "waitsome":
                got = MPI.Request.Waitsome(reqs)
            else:
                got = MPI.Request.Testsome(reqs)
                if got == []:
                    os.sched_yield()
                    continue
            if got is None:
                break
            seen += got
        if sorted(seen) != list(range(n)):
            fails.append(f"{what}: rank {RANK}: MPI_{mode.title()} reported the requests {seen} "
                         f"of {n} as done")
    else:
        raise ValueError(mode)
    if any(q != MPI.REQUEST_NULL for q in reqs):
        fails.append(f"{what}: rank {RANK}: a completed request is not MPI_REQUEST_NULL after {mode}")


# -- the cases ---------------------------------------------------------------------------------

def case_adjacent(c):
    for g in range(3):
        topo = adjacent_graph(c.rng, c.local, c.fails)
        for it in range(iterations(30)):
            op, nb = OPS[it % 4], it % 8 >= 4
            var = VARIANTS[(it // 2 + g) % len(VARIANTS)]
            call = c.call(topo, op, var, big=it % 6 == 5)
            req = call.start(nb)
            if nb:
                req.Wait()
            call.check(c.fails, f"adjacent graph {g} call {it}: {call.name(nb)}")
        topo.comm.Free()


def case_general(c):
    for g in range(6):
        topo = (general_graph, graph_topo)[g % 2](c.rng, c.fails)
        if topo is None:
            continue
        call = None
        for it in range(iterations(20)):
            if it % 5 == 0:   # new arguments: the others repeat them, on the same buffers
                call = c.call(topo, c.pick(OPS), c.pick(VARIANTS), big=it == 10)
            else:
                call.fill(c.key())
            nb = bool(it % 2)
            req = call.start(nb)
            if nb:
                req.Wait()
            call.check(c.fails, f"{topo.what} {g} call {it}: {call.name(nb)}")
        topo.comm.Free()


MODES = ["wait", "waitall", "waitany", "waitsome", "test", "testall", "testany", "testsome",
         "get_status", "free"]


def case_completion(c):
    topo = adjacent_graph(c.rng, c.local, c.fails)
    for it in range(iterations(60)):
        mode = MODES[it % len(MODES)]
        op = OPS[it // len(MODES) % 4]   # each mode with each operation
        call = c.call(topo, op, c.pick(VARIANTS[:3]), big=it % 9 == 8)
        what = f"completion call {it}: {call.name(True)} completed by {mode}"
        req = call.start(True)
        if mode == "free":
            # MPI-3.0 on calls this erroneous for a collective's request (section 5.12): Open MPI
            # refuses it (MPI_ERR_REQUEST; the request stays, and is waited for here), MPICH
            # frees it, and so may a library; then the next call must still be right
            try:
                req.Free()
            except MPI.Exception:
                req.Wait()
                call.check(c.fails, f"{what} (refused)")
                continue
            KEEP.append(call)   # not checked: nothing says when it is done
            if req != MPI.REQUEST_NULL:
                c.fails.append(f"{what}: rank {RANK}: the request is not MPI_REQUEST_NULL after it")
            continue
        reqs, checks = [req], []
        if mode not in ("wait", "test", "get_status") or it % 3 == 0:
            p2p, check = ring_p2p(topo.comm, c.key(), 5 + it)
            reqs += p2p
            checks.append(check)
            order = c.local.permutation(len(reqs))
            reqs = [reqs[i] for i in order]
        complete(mode, reqs, c.fails, what)
        call.check(c.fails, what)
        for check in checks:
            check(c.fails, what)
    topo.comm.Free()


def cart_shapes(n):
    """(dims, periods) for ``n`` ranks: 1-D and 2-D and 3-D, 1 or 2 ranks a periodic dimension,
    open ends, and grids of fewer ranks than the job."""
    shapes = [([n], [True]), ([n], [False]), ([1, n], [True, True]), ([n, 1], [False, True]),
              ([1, 1, n], [True, False, True])]
    if n >= 2:
        shapes.append(([2], [True]))
    if n % 2 == 0 and n >= 4:
        shapes += [([2, n // 2], [True, True]), ([2, n // 2], [True, False])]
    if n == 3:
        shapes.append(([1, 2], [True, False]))
    return shapes


def case_cart(c):
    for shape, (dims, periods) in enumerate(cart_shapes(SIZE)):
        cart = WORLD.Create_cart(dims, periods, reorder=True)
        if cart == MPI.COMM_NULL:   # outside the grid: no call
            continue
        topo = cart_topo(cart)
        for s, (lo, hi) in enumerate(cart.Shift(d, 1) for d in range(len(dims))):
            if (topo.sources[topo.rank][2 * s], topo.sources[topo.rank][2 * s + 1]) != (lo, hi):
                c.fails.append(f"rank {RANK}: MPI_Cart_shift({s}, 1) gave {(lo, hi)}; {topo.describe()}")
        rng = np.random.default_rng([SEED, 77, *dims, *periods])   # the grid's own: shared
        for it in range(iterations(12)):
            nb = it % 8 >= 4   # each operation blocking and not
            var = VARIANTS[int(rng.integers(len(VARIANTS)))]
            # (the ranks outside a grid make no call: the keys are the grid's own too)
            call = Call(topo, OPS[it % 4], var, rng, c.local, big=it == 7)
            call.fill((c.number << 32) | (shape << 16) | it)
            req = call.start(nb)
            if nb:
                req.Wait()
            call.check(c.fails, f"{topo.what} call {it}: {call.name(nb)}")
        cart.Free()


def case_interleave(c):
    topo = adjacent_graph(c.rng, c.local, c.fails)
    comm = topo.comm
    nxt, prv = (RANK + 1) % SIZE, (RANK - 1) % SIZE
    for it in range(iterations(40)):
        kind = it % 5
        if c.local.random() < 0.5:   # free-running: a rank comes late
            time.sleep(c.local.random() * 0.003)
        op = "alltoallv" if kind == 1 else c.pick(OPS)
        call = c.call(topo, op, c.pick(VARIANTS[:3]), big=it % 7 == 6)
        what = f"interleave call {it} (kind {kind}): {call.name(kind != 0)}"
        if kind == 0:   # a blocking call, then an allreduce on the same communicator
            call.start()
            a = np.array([it * 1000 + RANK, 7], np.int64)
            b = np.zeros(2, np.int64)
            comm.Allreduce(a, b, MPI.SUM)
            if list(b) != [it * 1000 * SIZE + SIZE * (SIZE - 1) // 2, 7 * SIZE]:
                c.fails.append(f"{what}: rank {RANK}: MPI_Allreduce after it gave {b}")
        elif kind == 1:   # pending, a blocking Sendrecv (past the eager limit) with a peer, wait
            req = call.start(True)
            n = 25_000
            sbuf, rbuf = values(np.float64, n, it, RANK, 5), np.zeros(n)
            comm.Sendrecv([sbuf, MPI.DOUBLE], nxt, 3, [rbuf, MPI.DOUBLE], prv, 3)
            if not np.array_equal(rbuf.view(np.uint64), values(np.float64, n, it, prv, 5).view(np.uint64)):
                c.fails.append(f"{what}: rank {RANK}: MPI_Sendrecv beside it got a wrong message")
            req.Wait()
        elif kind == 2:   # two pending, completed in reverse order
            other = c.call(topo, c.pick(OPS), c.pick(VARIANTS), big=False)
            r1, r2 = call.start(True), other.start(True)
            MPI.Request.Waitall([r2, r1])
            other.check(c.fails, f"{what}, the second of two")
        elif kind == 3:   # pending, a receive from any source with any tag, an allreduce, wait
            req = call.start(True)
            sbuf, rbuf = values(np.float64, 11, it, RANK, 6), np.zeros(11)
            sreq = comm.Isend([sbuf, MPI.DOUBLE], nxt, 100 + it)
            st = MPI.Status()
            while not comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, st):
                os.sched_yield()
            if (st.Get_source(), st.Get_tag()) != (prv, 100 + it):
                c.fails.append(f"{what}: rank {RANK}: MPI_Iprobe(ANY_SOURCE, ANY_TAG) found a message "
                               f"from {st.Get_source()} tag {st.Get_tag()}, not the program's")
            comm.Recv([rbuf, MPI.DOUBLE], MPI.ANY_SOURCE, MPI.ANY_TAG, st)
            if (st.Get_source(), st.Get_tag()) != (prv, 100 + it) or not np.array_equal(
                    rbuf.view(np.uint64), values(np.float64, 11, it, prv, 6).view(np.uint64)):
                c.fails.append(f"{what}: rank {RANK}: MPI_Recv(ANY_SOURCE, ANY_TAG) got a message "
                               f"from {st.Get_source()} tag {st.Get_tag()}, not the program's")
            b = np.zeros(1)
            comm.Allreduce(np.ones(1), b, MPI.SUM)
            if b[0] != SIZE:
                c.fails.append(f"{what}: rank {RANK}: MPI_Allreduce while it was pending gave {b[0]}")
            MPI.Request.Waitall([sreq, req])
        else:   # pending, sleep, then test until done
            req = call.start(True)
            time.sleep(c.local.random() * 0.002)
            while not req.Test():
                os.sched_yield()
        call.check(c.fails, what)
    comm.Free()


def case_legal(c):
    """Free-running sequences a legal program may make: up to 40 calls outstanding (counts near
    the staging limit, large edges), some with a derived type freed right after posting and a
    new type made at once (it may get the freed handle), a blocking MPI_Sendrecv with a peer
    (past the eager limit, now and then) before any wait, the calls completed in a random order
    by a random completion call, a rank late now and then."""
    topo = adjacent_graph(c.rng, c.local, c.fails)
    comm = topo.comm
    nxt, prv = (RANK + 1) % SIZE, (RANK - 1) % SIZE
    modes = ("wait", "waitall", "test", "testall", "waitany", "testany", "waitsome", "testsome")
    for it in range(iterations(12)):
        k = int(c.rng.integers(17, 41)) if it % 2 else int(c.rng.integers(1, 5))
        calls, reqs, spare = [], [], []
        for _ in range(k):
            t = None
            if c.rng.random() < 0.3:   # a vector of doubles back to back: packed by the library
                t = MPI.DOUBLE.Create_vector(int(c.rng.integers(1, 4)), 1, 1).Commit()
                var = Variant(f"float64 vector of {t.Get_size() // 8}", np.float64, t, t)
            else:
                var = c.pick(VARIANTS[:4])
            call = c.call(topo, c.pick(OPS), var, big=c.rng.random() < 0.1, near=c.rng.random() < 0.5)
            reqs.append(call.start(True))
            calls.append((call, call.name(True)))
            if t is not None:
                t.Free()   # legal once posted: the call completes as if it were not freed
                spare.append(MPI.DOUBLE.Create_contiguous(int(c.rng.integers(1, 9))).Commit())
        if c.local.random() < 0.3:   # free-running: a rank comes late
            time.sleep(c.local.random() * 0.003)
        n = int(c.pick((16, 25_000)))
        sbuf, rbuf = values(np.float64, n, c.key(), RANK, 7), np.zeros(n)
        comm.Sendrecv([sbuf, MPI.DOUBLE], nxt, 9, [rbuf, MPI.DOUBLE], prv, 9)
        mode = c.pick(modes)
        order = [int(i) for i in c.local.permutation(k)]
        what = f"legal sequence {it} ({k} calls, {mode})"
        complete(mode, [reqs[i] for i in order], c.fails, what)
        for j, (call, name) in enumerate(calls):
            call.check(c.fails, f"{what}: call {j}: {name}")
        for t in spare:
            t.Free()
    comm.Free()


def case_threads(c):
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        if RANK == 0:
            print("ngh_matrix threads: skipped (MPI is not at MPI_THREAD_MULTIPLE)", flush=True)
        return
    topos = [adjacent_graph(c.rng, c.local, c.fails) for _ in range(3)]
    # each thread's calls, made here in one order: their shared draws stay the same on every rank
    plans = [[c.call(t, OPS[(i + j) % 4], VARIANTS[(i + 2 * j) % 3], big=i == 4)
              for i in range(iterations(16))] for j, t in enumerate(topos)]
    def work(j):
        try:
            for i, call in enumerate(plans[j]):
                nb = (i // 4 + j) % 2 == 1   # each operation blocking and not
                req = call.start(nb)
                if nb:
                    req.Wait()
                call.check(c.fails, f"thread {j} call {i}: {call.name(nb)}")
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            WORLD.Abort(2)
            os._exit(2)

    threads = [threading.Thread(target=work, args=(j,)) for j in range(len(topos))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for t in topos:
        t.comm.Free()


def case_lifetimes(c):
    """Found by an outside review: (1) a type whose bytes are in another order than its type map
    (hindexed {4, 0} of int32: no gap, not contiguous) sent against two int32; (2) a call still
    pending when its communicator is freed, waited for after the free; (3) two threads of one
    communicator waiting on its two pending calls at once (MPI_THREAD_MULTIPLE)."""
    nxt, prv = (RANK + 1) % SIZE, (RANK - 1) % SIZE
    rev = MPI.INT32_T.Create_hindexed([1, 1], [4, 0]).Commit()
    for it in range(iterations(10)):
        comm = WORLD.Create_dist_graph_adjacent([prv], [nxt], reorder=False)
        send = np.array([10 * RANK + it, 10 * RANK + it + 1], np.int32)
        got = np.full(2, -1, np.int32)
        comm.Neighbor_alltoall([send, 1, rev], [got, 2, MPI.INT32_T])
        want = np.array([10 * prv + it + 1, 10 * prv + it], np.int32)   # in type-map order
        if not np.array_equal(got, want):
            c.fails.append(f"lifetimes: reversed type call {it}: got {got.tolist()}, want {want.tolist()}")
        got[:] = -1
        req = comm.Ineighbor_alltoall([send, 1, MPI.INT64_T], [got, 1, MPI.INT64_T])
        comm.Free()
        req.Wait()
        if not np.array_equal(got, np.array([10 * prv + it, 10 * prv + it + 1], np.int32)):
            c.fails.append(f"lifetimes: waited after the free, call {it}: got {got.tolist()}")
    rev.Free()
    # two calls outstanding between the same ranks, 8 KiB then 16 KiB an edge, completed in
    # reverse: with HYBRIDMPI_PMPI_NEIGHBOR_BYTES=4096 the first finds no room at its sender and its
    # receives are posted in the wait, the second's (past the 12 KiB stage) at its post
    comm = WORLD.Create_dist_graph_adjacent([prv], [nxt], reorder=False)
    for it in range(iterations(6)):
        sends = [values(np.float64, n, it, RANK, 7 + k) for k, n in enumerate((1024, 2048))]
        gots = [np.zeros(n) for n in (1024, 2048)]
        reqs = [comm.Ineighbor_alltoall(sends[k], gots[k]) for k in range(2)]
        MPI.Request.Waitall(reqs[::-1])
        for k, n in enumerate((1024, 2048)):
            want = values(np.float64, n, it, prv, 7 + k)
            if not np.array_equal(gots[k].view(np.uint64), want.view(np.uint64)):
                c.fails.append(f"lifetimes: two calls of 8 and 16 KiB, call {it}.{k}: wrong data")
    comm.Free()
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        return
    comm = WORLD.Create_dist_graph_adjacent([prv], [nxt], reorder=False)
    for it in range(iterations(20)):
        sends = [np.full(300, 1000 * RANK + 2 * it + k, np.float64) for k in range(2)]
        gots = [np.zeros(300) for _ in range(2)]
        reqs = [comm.Ineighbor_alltoall(sends[k], gots[k]) for k in range(2)]
        def wait(k, it=it, reqs=reqs):
            try:
                reqs[k].Wait()
            except MPI.Exception as e:
                c.fails.append(f"lifetimes: two threads' waits, call {it}.{k}: {e.Get_error_string()}")
        threads = [threading.Thread(target=wait, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for k in range(2):
            if not np.all(gots[k] == 1000 * prv + 2 * it + k):
                c.fails.append(f"lifetimes: two threads' waits, call {it}.{k}: got {gots[k][:3]}")
    comm.Free()


def erroneous(name, comm, sendcounts, recvcounts):
    """Neighbor_alltoallv of float64 with these counts (one block an edge, the blocks one after
    the other), three times, every rank all three whatever it was told (a revoked communicator
    fails at once); each rank prints what it was told, and the exit code is 1 when any rank was
    told of an error, else 0 (MPI need not tell: the program is erroneous)."""
    told, n = [], sum(recvcounts)
    for it in range(3):
        sbuf = values(np.float64, sum(sendcounts), it, RANK)
        rbuf = values(np.float64, n + 64, it, RANK, 1)   # the blocks, then 64 that stay
        try:
            comm.Neighbor_alltoallv([sbuf, (sendcounts, None), MPI.DOUBLE],
                                    [rbuf, (recvcounts, None), MPI.DOUBLE])
        except MPI.Exception as e:
            if not told:
                print(f"ngh_matrix {name}: rank {RANK}: call {it} failed: {e.Get_error_string()} "
                      f"(error class {e.Get_error_class()})", file=sys.stderr, flush=True)
            told.append(it)
        after = values(np.float64, n + 64, it, RANK, 1)[n:]
        if not np.array_equal(rbuf[n:].view(np.uint64), after.view(np.uint64)):
            print(f"ngh_matrix {name}: rank {RANK}: call {it} wrote past the receive blocks",
                  file=sys.stderr, flush=True)
    print(f"ngh_matrix {name}: rank {RANK}: " + (f"calls {told} failed" if told else "no error"),
          file=sys.stderr, flush=True)
    # MPI_Allgather, not MPI_Allreduce: a library's allreduce may time out (HYBRIDMPI_PMPI_TIMEOUT)
    # on a rank still in its own call's wait, and abort the job before every rank has told
    total = sum(WORLD.allgather(bool(told)))
    if RANK == 0:
        print(f"ngh_matrix {name}: {total} of {SIZE} ranks got an error", flush=True)
    return 1 if total else 0


def case_asymmetric(c):
    """Self-loops everywhere, and rank 0 also sends to 1, which does not receive from 0."""
    if SIZE < 2:
        raise SystemExit("ngh_matrix asymmetric: needs 2 ranks or more")
    dests = [RANK, 1] if RANK == 0 else [RANK]
    comm = WORLD.Create_dist_graph_adjacent([RANK], dests, reorder=False)
    return erroneous("asymmetric", comm, [5] * len(dests), [5])


def case_mismatch(c):
    """A ring (one rank: a self-loop); rank 0 receives one element less from its source than
    that rank sends it."""
    comm = WORLD.Create_dist_graph_adjacent([(RANK - 1) % SIZE], [(RANK + 1) % SIZE], reorder=False)
    return erroneous("mismatch", comm, [1000], [999 if RANK == 0 else 1000])


def case_killed(c):
    """A ring of non-blocking calls; rank 1 ends by SIGKILL at its 200th call, the others go on
    with the MPI's default error handler (MPI_ERRORS_ARE_FATAL): the job must end, not hang."""
    comm = WORLD.Create_dist_graph_adjacent([(RANK - 1) % SIZE], [(RANK + 1) % SIZE], reorder=False)
    comm.Set_errhandler(MPI.ERRORS_ARE_FATAL)
    sbuf, rbuf = np.ones(512), np.zeros(512)
    for it in range(1_000_000):
        if RANK == 1 and it == 200:
            os.kill(os.getpid(), signal.SIGKILL)
        comm.Ineighbor_alltoall(sbuf, rbuf).Wait()
    print(f"ngh_matrix killed: rank {RANK} went on without rank 1", file=sys.stderr, flush=True)
    return 1


def case_late(c):
    """Rank 0 waits in MPI_Waitany for a call its peer never posts (erroneous): with
    HYBRIDMPI_PMPI_TIMEOUT the wait fails on rank 0, which then lets its peer go."""
    if SIZE != 2:
        raise SystemExit("ngh_matrix late: needs 2 ranks")
    comm = WORLD.Create_dist_graph_adjacent([1 - RANK], [1 - RANK], reorder=False)
    t0 = time.perf_counter()
    told = "no error"
    if RANK == 0:
        req = comm.Ineighbor_alltoall(np.ones(4), np.zeros(4))
        try:
            MPI.Request.Waitany([req])
        except MPI.Exception as e:
            told = f"raised {e.Get_error_class()} after {time.perf_counter() - t0:.1f} s"
    WORLD.Send(b"x", 1 - RANK) if RANK == 0 else WORLD.Recv(bytearray(1), 0)
    print(f"ngh_matrix late: rank {RANK}: {told}", file=sys.stderr, flush=True)
    return 0


CASES = {"adjacent": case_adjacent, "general": case_general, "completion": case_completion,
         "cart": case_cart, "interleave": case_interleave, "threads": case_threads,
         "lifetimes": case_lifetimes, "legal": case_legal}
ERRONEOUS = {"asymmetric": case_asymmetric, "mismatch": case_mismatch, "killed": case_killed,
             "late": case_late}


def main(argv):
    names = [n for a in argv for n in (CASES if a == "all" else [a])]
    unknown = [n for n in names if n not in CASES and n not in ERRONEOUS]
    if not names or unknown or len(names) > 1 and set(names) & set(ERRONEOUS):
        if RANK == 0:
            print(f"usage: ngh_matrix.py CASE ... (all, {', '.join(CASES)}) or ngh_matrix.py "
                  f"{'|'.join(ERRONEOUS)} (alone); unknown: {unknown}", file=sys.stderr)
        return 2
    failed = 0
    for name in names:
        c = Case(name, 1 + list({**CASES, **ERRONEOUS}).index(name))
        if name in ERRONEOUS:
            return ERRONEOUS[name](c)
        t0 = time.perf_counter()
        CASES[name](c)
        for line in c.fails[:5]:
            print(f"ngh_matrix {name}: {line}", file=sys.stderr, flush=True)
        total = np.zeros(1, np.int64)
        WORLD.Allreduce(np.array([len(c.fails)], np.int64), total, MPI.SUM)
        if RANK == 0:
            if total[0]:
                print(f"ngh_matrix {name} FAILED: {total[0]} mismatches (seed {SEED})", flush=True)
            else:
                print(f"ngh_matrix {name} ok ({time.perf_counter() - t0:.2f} s)", flush=True)
        failed |= bool(total[0])
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except SystemExit as e:
        print(e, file=sys.stderr, flush=True)
        code = 2
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        WORLD.Abort(2)
        os._exit(2)   # MPICH's MPI_Abort returns, and the launcher ends the process a moment later
    DOUBLE2.Free()
    DOUBLE3.Free()
    sys.exit(code)
