"""DOLFINx 0.5's ghost scatters (MPI_Ineighbor_alltoallv on a dist-graph communicator, then
MPI_Wait) for scripts/pmpi_thirdparty.py (dolfinx-scatter): run with and without the PMPI
library, the output must be the same bit for bit.

Three parts, each a loop of ``--steps`` steps:

- ``mesh``: a blocked ``la.Vector`` (block size 3) on the dofs of a P1 VectorFunctionSpace of a
  unit cube mesh, no ghost cells, cut into slabs by this file's partitioner (DOLFINx's default
  one lays the mesh out differently from run to run, which changes the hash): owned entries and
  ghosts are set from the global index and the step (ghosts to other values than their owners'),
  then ``scatter_reverse(add)``, ``scatter_forward()`` and ``scatter_reverse(insert)``;
- ``ring``: the same on an IndexMap made here, each rank ghosting blocks of both ring neighbours;
- ``matrix``: DOLFINx 0.5's ``MatrixCSR`` (a P1 mass matrix, scaled per step) assembled with its
  ghost rows and ``finalize()``d (ghost rows added to their owners: one MPI_Ineighbor_alltoallv);
  0.5's MatrixCSR takes no block size, so this part is scalar.

Each rank hashes (sha256) the bytes of its arrays after every call; rank 0 prints, per part, the
sha256 of every rank's digest in rank order and the sum of the local sums taken in rank order (no
floating-point reduction inside MPI, so the output does not depend on how an allreduce combines)::

    mesh   scatters 60 sha256 <hex> sum <%.17e>

At 1 rank the vector scatters make no MPI call (no neighbours); the matrix's finalize still
calls MPI_Ineighbor_alltoallv on a communicator without neighbours.

    mpiexec -n N python tests/pmpi/dolfinx_scatter.py [--steps 20] [--n 8]
"""

import argparse
import hashlib

import numpy as np
import ufl
from dolfinx import fem, la, mesh
from dolfinx.cpp.common import IndexMap
from dolfinx.cpp.graph import AdjacencyList_int32
from dolfinx.fem.assemble import create_matrix  # not in dolfinx.fem's namespace in 0.5
from mpi4py import MPI


def global_dofs(imap, bs):
    """The global index of every local entry (owned, then ghosts) of a vector of block size bs."""
    blocks = imap.local_to_global(np.arange(imap.size_local + imap.num_ghosts, dtype=np.int32))
    return (np.repeat(blocks, bs) * bs + np.tile(np.arange(bs), len(blocks))).astype(np.float64)


def vector_loop(x, imap, bs, steps, h):
    """Scatters of x, hashing x.array after each; returns the number of scatter calls."""
    g = global_dofs(imap, bs)
    owned = imap.size_local * bs
    for step in range(steps):
        a = x.array
        a[:owned] = np.sin(1e-3 * g[:owned] + 0.1 * step) + g[:owned] / 7.0
        a[owned:] = np.cos(1e-3 * g[owned:] - 0.2 * step) - g[owned:] / 11.0
        x.scatter_reverse(la.ScatterMode.add)
        h.update(a.tobytes())
        x.scatter_forward()
        h.update(a.tobytes())
        a[owned:] *= 1.0 + 1.0 / (step + 3)
        x.scatter_reverse(la.ScatterMode.insert)
        h.update(a.tobytes())
    return 3 * steps


def slabs(comm, nparts, graph, ghosting):
    """A graph partitioner that is the same in every run (DOLFINx's default one, SCOTCH or ParMETIS,
    is not: the dofs' layout, and so the hash, would change from run to run): equal blocks of the
    global numbering of the dual graph's nodes (this rank's offset + local index).  Each node's
    destinations are its owner, then the other owners of its neighbours: DOLFINx 0.5 finds the
    vertices ranks share through those ghost cells, even without ghost cells (with the owner
    alone, the ranks' meshes come apart: no vertex is shared)."""
    n = graph.num_nodes
    first = comm.exscan(n) or 0
    total = max(comm.allreduce(n), 1)
    own = ((first + np.arange(n, dtype=np.int64)) * nparts // total).astype(np.int32)
    node = np.repeat(np.arange(n, dtype=np.int64), np.diff(graph.offsets))
    other = (graph.array.astype(np.int64) * nparts // total).astype(np.int32)
    keep = other != own[node]
    pairs = np.unique(node[keep] * nparts + other[keep])   # sorted by node, then part
    extra_node, extra_part = pairs // nparts, (pairs % nparts).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(1 + np.bincount(extra_node, minlength=n))]).astype(np.int32)
    data = np.empty(offsets[-1], dtype=np.int32)
    data[offsets[:-1]] = own
    rank_in_node = np.arange(len(pairs)) - np.searchsorted(extra_node, extra_node)
    data[offsets[extra_node] + 1 + rank_in_node] = extra_part
    return AdjacencyList_int32(data, offsets)


def ring_map(comm, blocks=200, k=17):
    """An IndexMap of `blocks` blocks per rank ghosting the first k blocks of the next rank and
    every 3rd of the last 3k blocks of the previous one."""
    rank, size = comm.rank, comm.size
    if size == 1:
        return IndexMap(comm, blocks)
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    ghosts = np.concatenate([nxt * blocks + np.arange(k),
                             prv * blocks + np.arange(blocks - 3 * k, blocks, 3)])
    owners = np.concatenate([np.full(k, nxt), np.full(k, prv)]).astype(np.int32)
    return IndexMap(comm, blocks, ghosts.astype(np.int64), owners)


def report(comm, name, calls, h, local_sum):
    digests = comm.gather(h.digest(), root=0)
    sums = comm.gather(float(local_sum), root=0)
    if comm.rank == 0:
        total = 0.0
        for s in sums:
            total += s
        print(f"{name:<6} scatters {calls} sha256 {hashlib.sha256(b''.join(digests)).hexdigest()} "
              f"sum {total:.17e}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--n", type=int, default=8, help="cells per side of the unit cube (default 8)")
    a = p.parse_args()
    comm = MPI.COMM_WORLD
    msh = mesh.create_unit_cube(comm, a.n, a.n, a.n, ghost_mode=mesh.GhostMode.none,
                                partitioner=mesh.create_cell_partitioner(slabs))

    V = fem.VectorFunctionSpace(msh, ("Lagrange", 1))
    imap, bs = V.dofmap.index_map, V.dofmap.index_map_bs
    x, h = la.vector(imap, bs), hashlib.sha256()
    calls = vector_loop(x, imap, bs, a.steps, h)
    report(comm, "mesh", calls, h, x.array[:imap.size_local * bs].sum())

    rmap = ring_map(comm)
    x, h = la.vector(rmap, 3), hashlib.sha256()
    calls = vector_loop(x, rmap, 3, a.steps, h)
    report(comm, "ring", calls, h, x.array[:rmap.size_local * 3].sum())

    W = fem.FunctionSpace(msh, ("Lagrange", 1))
    u, v = ufl.TrialFunction(W), ufl.TestFunction(W)
    c = fem.Constant(msh, 1.0)
    form = fem.form(c * ufl.inner(u, v) * ufl.dx)
    A, h = create_matrix(form), hashlib.sha256()
    for step in range(a.steps):
        c.value = 1.0 + step / 7.0
        A.set(0.0)
        fem.assemble_matrix(A, form)
        h.update(A.data.tobytes())
        A.finalize()
        h.update(A.data.tobytes())
    report(comm, "matrix", a.steps, h, A.data.sum())


if __name__ == "__main__":
    main()
