"""DOLFINx and PETSc patterns: GhostPattern.from_index_map, from_sf, to_sf, flat block arrays.

    python -m mpi4py interop_cases.py [--only CASES]

Needs dolfinx (cases on IndexMaps) and petsc4py (cases on star forests); a case whose package
does not import is skipped (it prints so).  Every comparison is bit for bit.
"""

import sys

import numpy as np
from _harness import main, skip
from mpi4py import MPI

import hybridmpi
from hybridmpi import GhostPattern, Halo, PatternError

try:
    import dolfinx
    import dolfinx.fem
    import dolfinx.la
    import dolfinx.mesh
except ImportError:
    dolfinx = None
try:
    from petsc4py import PETSc
except ImportError:
    PETSc = None


def _spaces(comm):
    """(name, function space) of P1 scalar and vector spaces on 2-D and 3-D meshes."""
    sq = dolfinx.mesh.create_unit_square(comm, 9, 7)
    cube = dolfinx.mesh.create_unit_cube(comm, 4, 3, 5)
    for mesh, dim in ((sq, 2), (cube, 3)):
        yield f"{dim}-D P1 bs=1", dolfinx.fem.FunctionSpace(mesh, ("Lagrange", 1))
        for bs in sorted({2, 3, dim}):
            yield f"{dim}-D P1 bs={bs}", dolfinx.fem.VectorFunctionSpace(mesh, ("Lagrange", 1), dim=bs)


def case_index_map_matches_dolfinx(comm, rng, **cfg):
    """Forward and reverse (add, insert) on u.x.array, flat and as rows: the same bits as
    DOLFINx's scatter_forward / scatter_reverse; ghosts hold their owner's rank after a
    forward update of each rank's rank."""
    if dolfinx is None:
        return skip("dolfinx does not import")
    with hybridmpi.HybridComm(comm, **cfg) as hc:
        for name, V in _spaces(comm):
            imap, bs = V.dofmap.index_map, V.dofmap.index_map_bs
            pat = GhostPattern.from_index_map(hc, imap)
            n = imap.size_local
            assert pat.size == n + imap.num_ghosts and pat.n_owned == n, (name, pat)
            u = dolfinx.fem.Function(V)
            h = Halo(pat, block=bs)
            for layout in ("flat", "rows"):
                # forward
                u.x.array[:] = rng.standard_normal(u.x.array.size)
                ours = u.x.array.copy()
                u.x.scatter_forward()
                h.update(ours if layout == "flat" else ours.reshape(-1, bs))
                assert np.array_equal(ours, u.x.array), (name, layout, "forward")
                # reverse, both modes DOLFINx has
                for op, mode in (("add", dolfinx.la.ScatterMode.add),
                                 ("insert", dolfinx.la.ScatterMode.insert)):
                    u.x.array[:] = rng.standard_normal(u.x.array.size)
                    ours = u.x.array.copy()
                    u.x.scatter_reverse(mode)
                    h.reverse(ours if layout == "flat" else ours.reshape(-1, bs), op)
                    owned = slice(0, n * bs)
                    assert np.array_equal(ours[owned], u.x.array[owned]), (name, layout, op)
            # each rank's rank: ghosts get their owner's
            x = np.full(pat.size * bs, -1.0)
            x[:n * bs] = hc.rank
            h.update_begin(x)
            h.update_end(x)
            owners = np.asarray(imap.owners() if callable(imap.owners) else imap.owners)
            assert np.array_equal(x[n * bs:], np.repeat(owners, bs).astype(float)), name
            h.free()


def case_index_map_bad_input(comm, rng, **cfg):
    """An IndexMap on another communicator, a non-IndexMap, a flat array of the wrong length:
    a clear error on every rank."""
    if dolfinx is None:
        return skip("dolfinx does not import")
    with hybridmpi.HybridComm(comm, **cfg) as hc:
        if hc.size > 1:
            other = dolfinx.common.IndexMap(MPI.COMM_SELF, 5)
            try:
                GhostPattern.from_index_map(hc, other)
            except PatternError as e:
                assert "another communicator" in str(e), e
            else:
                raise AssertionError("an IndexMap on COMM_SELF was taken")
        try:
            GhostPattern.from_index_map(hc, object())
        except PatternError as e:
            assert "needs a DOLFINx IndexMap" in str(e), e
        else:
            raise AssertionError("not an IndexMap, no error")
        V = dolfinx.fem.VectorFunctionSpace(dolfinx.mesh.create_unit_square(comm, 4, 4),
                                            ("Lagrange", 1), dim=2)
        pat = GhostPattern.from_index_map(hc, V.dofmap.index_map)
        with Halo(pat, block=2) as h:
            try:
                h.update(np.zeros(pat.size * 2 + 1))
            except ValueError as e:
                assert f"expected ({pat.size}, 2) or ({pat.size * 2},)" in str(e), e
            else:
                raise AssertionError("a flat array of the wrong length was taken")
            x = np.zeros(pat.size * 2)
            h.update(x)  # still usable: every rank's array was wrong alike


def _point_sf(comm, dim):
    """A distributed DMPlex box mesh and its point SF (roots and leaves: the mesh points)."""
    dm = PETSc.DMPlex().createBoxMesh([4] * dim, simplex=False, comm=comm)
    dm.distribute()
    return dm, dm.getPointSF()


def case_point_sf_matches_petsc(comm, rng, **cfg):
    """Halo.update / reverse on a DMPlex point SF's pattern equal the SF's bcast / reduce;
    to_sf() gives back an SF of the same pattern (round trip)."""
    if PETSc is None:
        return skip("petsc4py does not import")
    with hybridmpi.HybridComm(comm, **cfg) as hc:
        for dim in (2, 3):
            dm, sf = _point_sf(comm, dim)
            start, end = dm.getChart()
            pat = GhostPattern.from_sf(hc, sf, size=end - start)
            nroots = end - start
            assert pat.size == nroots, (pat, nroots)
            with Halo(pat) as h:
                sfs = [(pat.to_sf(), "to_sf()")]
                if comm.size > 1:  # PETSc sets no graph on one rank
                    sfs.append((sf, "point SF"))
                for sfx, name in sfs:
                    data = rng.standard_normal(nroots)
                    ref, ours = data.copy(), data.copy()
                    sfx.bcastBegin(MPI.DOUBLE, data, ref, MPI.REPLACE)
                    sfx.bcastEnd(MPI.DOUBLE, data, ref, MPI.REPLACE)
                    h.update(ours)
                    assert np.array_equal(ours, ref), (dim, name, "bcast")
                    # integer values: a sum is exact in any order
                    data = rng.integers(-1000, 1000, nroots).astype(float)
                    ref, ours = data.copy(), data.copy()
                    sfx.reduceBegin(MPI.DOUBLE, data, ref, MPI.SUM)
                    sfx.reduceEnd(MPI.DOUBLE, data, ref, MPI.SUM)
                    h.reverse(ours, "add")
                    assert np.array_equal(ours, ref), (dim, name, "reduce")
                    if sfx is not sf:
                        sfx.destroy()
            back = GhostPattern.from_sf(hc, pat.to_sf(), size=pat.size)
            assert back.send.keys() == pat.send.keys() and back.recv.keys() == pat.recv.keys()
            for p in pat.send:
                assert np.array_equal(back.send[p], pat.send[p]), p
            for p in pat.recv:
                assert np.array_equal(back.recv[p], pat.recv[p]), p
            dm.destroy()


def case_sf_bad_input(comm, rng, **cfg):
    """A self-leaf that references another entry, a leaf outside the roots, an SF on another
    communicator: PatternError on every rank."""
    if PETSc is None:
        return skip("petsc4py does not import")
    with hybridmpi.HybridComm(comm, **cfg) as hc:
        r = hc.rank
        cases = [("self-leaf", lambda: ([1], [r, 0]), "a self-leaf must be the same entry"),
                 ("outside", lambda: ([7], [(r + 1) % hc.size, 0]), "outside the 4 roots")]
        for what, graph, words in cases:
            sf = PETSc.SF().create(comm=comm)
            local, remote = graph()
            # only rank 0 has the bad leaf; the others none
            if r != 0:
                local, remote = [], []
            sf.setGraph(4, np.array(local, dtype=PETSc.IntType), np.array(remote, dtype=PETSc.IntType))
            sf.setUp()
            try:
                GhostPattern.from_sf(hc, sf)
            except PatternError as e:
                assert words in str(e), (what, e)
            else:
                raise AssertionError(f"{what}: no PatternError")
            sf.destroy()
        if hc.size > 1:
            sf = PETSc.SF().create(comm=MPI.COMM_SELF)
            sf.setGraph(4, np.zeros(0, dtype=PETSc.IntType), np.zeros(0, dtype=PETSc.IntType))
            try:
                GhostPattern.from_sf(hc, sf)
            except PatternError as e:
                assert "another communicator" in str(e), e
            else:
                raise AssertionError("an SF on COMM_SELF was taken")
            sf.destroy()


def case_petsc_ghost_vec_recipe(comm, rng, **cfg):
    """The recipe of docs/guide/interop.md for PETSc ghosted Vecs: from_global on the ownership range and the
    ghosts, a Halo on vec.localForm()'s array: the same bits as ghostUpdate both ways."""
    if PETSc is None:
        return skip("petsc4py does not import")
    with hybridmpi.HybridComm(comm, **cfg) as hc:
        r, p = hc.rank, hc.size
        n = 5 + r
        start = sum(5 + q for q in range(r))
        total = sum(5 + q for q in range(p))
        ghosts = np.array(sorted({(start + n + k) % total for k in range(3)} - set(range(start, start + n))),
                          dtype=PETSc.IntType)
        vec = PETSc.Vec().createGhost(ghosts, size=(n, PETSc.DECIDE), comm=comm)
        rstart, rend = vec.getOwnershipRange()
        pat = GhostPattern.from_global(hc, np.arange(rstart, rend), ghosts)
        with Halo(pat) as h:
            with vec.localForm() as loc:
                loc.array[:] = rng.standard_normal(loc.getSize())
                ours = loc.array.copy()
            vec.ghostUpdate(PETSc.InsertMode.INSERT, PETSc.ScatterMode.FORWARD)
            with vec.localForm() as loc:
                h.update(ours)
                assert np.array_equal(ours, loc.array), "forward"
                loc.array[:] = rng.integers(-99, 99, loc.getSize()).astype(float)
                ours = loc.array.copy()
            vec.ghostUpdate(PETSc.InsertMode.ADD, PETSc.ScatterMode.REVERSE)
            with vec.localForm() as loc:
                h.reverse(ours, "add")
                assert np.array_equal(ours[:n], loc.array[:n]), "reverse"
        vec.destroy()



# ------------------------------------------------------------------ duck-typed inputs (no dolfinx, petsc4py)

N = 4  # points each rank owns in the fakes' ring


class FakeIndexMap:
    """What from_index_map reads of a DOLFINx IndexMap: each rank owns N points; ghosts default
    to the next rank's first point."""

    def __init__(self, hc, ghosts=None, owners=None):
        r, p = hc.rank, hc.size
        self.size_local, self.local_range, self.size_global = N, (r * N, r * N + N), p * N
        self.ghosts = np.array([(r + 1) % p * N], np.int64) if ghosts is None else ghosts
        self.owners = np.array([(r + 1) % p], np.int32) if owners is None else owners


class FakeSF:
    """What from_sf reads of a petsc4py star forest: roots and leaves index one array of
    ``nroots``; by default leaf N is the next rank's root 0."""

    def __init__(self, hc, ilocal=None, iremote=None, nroots=N + 1):
        nxt = (hc.rank + 1) % hc.size
        self.hc, self.nroots = hc, nroots
        self.ilocal = np.array([N], np.int32) if ilocal is None else ilocal
        self.iremote = np.array([nxt, 0], np.int32) if iremote is None else iremote

    def getComm(self):
        hc = self.hc

        class Comm:
            def tompi4py(self):
                return hc.comm
        return Comm()

    def getGraph(self):
        return self.nroots, self.ilocal, self.iremote


def _rejected(make, words):
    """``make()`` raises PatternError naming ``words`` (on every rank: the harness gathers)."""
    try:
        make()
    except PatternError as e:
        assert all(w in str(e) for w in words), (words, str(e))
    else:
        raise AssertionError(f"accepted, expected PatternError with {words}")


def case_fake_ids_as_from_global(comm, rng, **cfg):
    """from_index_map and from_sf reject what from_global rejects, with its messages, on every
    rank when one rank has it: float ids (4.9 was truncated to 4; any float dtype, as from_global),
    a ghost listed twice (was accepted)."""
    if comm.size < 2:
        return skip("needs 2 or more ranks")
    with hybridmpi.HybridComm(comm, **cfg) as hc:
        r, nxt = hc.rank, (hc.rank + 1) % hc.size
        first, off = nxt * N + int(rng.integers(N)), int(rng.integers(N))
        first0, nxt0, off0 = comm.bcast((first, nxt, off))  # rank 0's, which the messages name
        assert GhostPattern.from_index_map(hc, FakeIndexMap(hc)).size == N + 1
        assert GhostPattern.from_sf(hc, FakeSF(hc)).size == N + 1
        bad = r == 0
        for ghosts, owners, words in [
                (np.array([first + 0.9]), None, ["ghosts must be a 1-D integer array", "float64"]),
                (np.array([float(first)]), None, ["ghosts must be a 1-D integer array", "float64"]),
                (None, np.array([nxt + 0.0]), ["owners must be a 1-D integer array", "float64"]),
                (np.array([first, first]), np.array([nxt, nxt]), ["duplicate ghost id"])]:
            _rejected(lambda g=ghosts, o=owners: GhostPattern.from_index_map(
                hc, FakeIndexMap(hc, g, o) if bad else FakeIndexMap(hc)), words)
        # from_global's message, word for word, for the same duplicate
        lone = np.array([first, first])
        _rejected(lambda: GhostPattern.from_index_map(
            hc, FakeIndexMap(hc, lone, np.array([nxt, nxt])) if bad else FakeIndexMap(hc)),
            [f"rank 0: duplicate ghost id {first0}"])
        _rejected(lambda: GhostPattern.from_global(
            hc, np.arange(r * N, r * N + N), lone if bad else np.array([nxt * N])),
            [f"rank 0: duplicate ghost id {first0}"])
        for kw, words in [
                ({"iremote": np.array([nxt, off + 0.9])}, ["iremote must be a 1-D integer array"]),
                ({"ilocal": np.array([N + 0.0])}, ["ilocal must be a 1-D integer array"]),
                ({"ilocal": np.array([N, N + 1], np.int32), "nroots": N + 2,
                  "iremote": np.array([nxt, off, nxt, off], np.int32)},
                 [f"rank 0: duplicate ghost id (rank {nxt0}'s root {off0}"])]:
            _rejected(lambda kw=kw: GhostPattern.from_sf(
                hc, FakeSF(hc, **kw) if bad else FakeSF(hc)), words)
        assert GhostPattern.from_sf(hc, FakeSF(hc)).size == N + 1  # still usable


CASES = [case_index_map_matches_dolfinx, case_index_map_bad_input, case_point_sf_matches_petsc,
         case_sf_bad_input, case_petsc_ghost_vec_recipe, case_fake_ids_as_from_global]

if __name__ == "__main__":
    if "--list" in sys.argv:
        print(dolfinx is not None, PETSc is not None)
        sys.exit(0)
    main(CASES)
