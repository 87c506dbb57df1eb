"""The strongest ghost updates a Python code can call besides this library, on a GhostPattern.

- ``petsc``: PETSc ``VecGhost`` (petsc4py), ``Vec.ghostUpdate(INSERT, FORWARD)``;
- ``dolfinx``: DOLFINx ``la.Vector`` on an ``IndexMap``, ``scatter_forward()``.

Both are built on the pattern's global numbering: owned points first
(global id = this rank's offset + local id), ghosts after them in local
order.  They are available when petsc4py / dolfinx import and run on the
same MPI as mpi4py (Debian's packages and the system Open MPI;
docs/getting-started.md says how).
"""

import numpy as np

PEERS = ("petsc", "dolfinx")


def available():
    """{peer: None if importable, else why not} — same answer on every rank of one job."""
    why = {}
    try:
        import petsc4py

        petsc4py.init(["-no_signal_handler"])
        from petsc4py import PETSc  # noqa: F401

        why["petsc"] = None
    except Exception as e:  # ImportError, or a petsc4py built for another MPI
        why["petsc"] = f"petsc4py: {type(e).__name__}: {e}"
    try:
        import dolfinx.common  # noqa: F401
        import dolfinx.la  # noqa: F401

        why["dolfinx"] = None
    except Exception as e:
        why["dolfinx"] = f"dolfinx: {type(e).__name__}: {e}"
    return why


def ghost_globals(comm, pattern):
    """(global ids, owner ranks) of this rank's ghosts in local order, owned points numbered
    first on every rank.

    Raises:
        ValueError: the pattern is not numbered owned points first, ghosts after (every rank).
    """
    from mpi4py import MPI

    n_owned = pattern.n_owned
    bad = any((ids.size and int(ids.max()) >= n_owned) for ids in pattern.send.values())
    bad = bad or any((ids.size and int(ids.min()) < n_owned) for ids in pattern.recv.values())
    if comm.allreduce(int(bad), op=MPI.MAX):
        raise ValueError("hybridmpi bench ghost --peers: the pattern must number owned points "
                         "first and ghosts after them")
    offset = comm.exscan(n_owned) or 0
    offsets = comm.allgather(offset)
    got = comm.alltoall([pattern.send.get(q) for q in range(comm.size)])
    ghosts = np.empty(pattern.n_ghosts, dtype=np.int64)
    owners = np.empty(pattern.n_ghosts, dtype=np.int32)
    for q, rids in pattern.recv.items():
        at = np.asarray(rids) - n_owned
        ghosts[at] = offsets[q] + np.asarray(got[q], dtype=np.int64)
        owners[at] = q
    return ghosts, owners


class Petsc:
    """PETSc VecGhost: the local form holds owned values then ghosts."""

    name = "petsc"

    def __init__(self, comm, pattern, block, ghosts, owners):
        from petsc4py import PETSc

        self._mode = (PETSc.InsertMode.INSERT_VALUES, PETSc.ScatterMode.FORWARD)
        ghosts = ghosts.astype(PETSc.IntType)
        self.vec = PETSc.Vec().createGhost(ghosts, size=(pattern.n_owned * block, PETSc.DECIDE),
                                           bsize=block, comm=comm)
        self._form = self.vec.localForm()
        self.local = self._form.__enter__()
        self.array = self.local.array.reshape((pattern.size, block) if block > 1 else (pattern.size,))

    def update(self):
        self.vec.ghostUpdate(*self._mode)

    def free(self):
        self.array = None
        self._form.__exit__(None, None, None)
        self.vec.destroy()


class Dolfinx:
    """DOLFINx la.Vector on an IndexMap with the pattern's ghosts and owners."""

    name = "dolfinx"

    def __init__(self, comm, pattern, block, ghosts, owners):
        import dolfinx.common
        import dolfinx.la

        self.map = dolfinx.common.IndexMap(comm, pattern.n_owned, ghosts, owners)
        self.vec = dolfinx.la.vector(self.map, bs=block)
        self.array = self.vec.array.reshape((pattern.size, block) if block > 1 else (pattern.size,))

    def update(self):
        self.vec.scatter_forward()

    def free(self):
        self.array = self.vec = self.map = None


def make(name, comm, pattern, block, numbering):
    """A peer's vector of ``pattern`` (``numbering`` from :func:`ghost_globals`)."""
    return {"petsc": Petsc, "dolfinx": Dolfinx}[name](comm, pattern, block, *numbering)
