"""The lists of patterns from where users' numberings live: a DOLFINx ``IndexMap`` and a PETSc
star forest; and a pattern as a PETSc star forest.

Both give each ghost its owner and the owner's local id, so one exchange of those ids builds
the send lists (``remote_lists``); nothing imports DOLFINx or petsc4py until it is asked for.
This module sits under :mod:`hybridmpi.ghost.pattern`: it returns checked lists, which
``GhostPattern.from_index_map`` and ``GhostPattern.from_sf`` make into patterns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .._native.tables import as_int, mpi
from ..comm._agree import safe_repr
from ._lists import agree_pattern as _agree
from ._lists import alltoallv as _alltoallv
from ._lists import comm_of

if TYPE_CHECKING:
    from ..comm.hybridcomm import HybridComm
    from .pattern import GhostPattern

#: (send, recv, size, n_owned): a pattern's lists, checked on every rank
Lists = tuple[dict, dict, int, int]


def _attr(obj, name):
    """``obj.name``, called if it is a method (DOLFINx changed some between versions)."""
    value = getattr(obj, name)
    return value() if callable(value) else value


def _not_ids(what, arr, rank):
    """from_global's message when ``arr`` holds anything but integers (any float dtype: a float id
    is not truncated, 4.9 is no id 4), else None."""
    if arr.dtype.kind in "iu" or arr.size == 0:
        return None
    return f"rank {rank}: {what} must be a 1-D integer array, got shape {arr.shape} dtype {arr.dtype}"


def _duplicate(ids):
    """The smallest value that ``ids`` holds twice (from_global's choice), else None."""
    values, counts = np.unique(ids, return_counts=True)
    twice = values[counts > 1]
    return int(twice[0]) if twice.size else None


def remote_lists(hc: HybridComm, size: int, n_owned: int, ghost_local: np.ndarray, owner: np.ndarray,
                 remote: np.ndarray) -> Lists:
    """The lists of the pattern of ghosts at local ids ``ghost_local``, each owned by rank ``owner[i]`` at
    its local id ``remote[i]`` (collective).  Ghosts receive from their owners in the order
    given; each owner sends in the order its peer asked.  A requested id that is out of the
    owner's range or a ghost there raises PatternError on every rank."""
    comm, MPI, rank = hc.comm, mpi(), hc.rank
    by_owner = np.argsort(owner, kind="stable")
    peers, starts = np.unique(owner[by_owner], return_index=True)
    bounds = list(starts) + [owner.size]
    recv = {int(p): ghost_local[by_owner[bounds[i]:bounds[i + 1]]].astype(np.int64)
            for i, p in enumerate(peers)}
    wanted, _, wcounts, _ = _alltoallv(comm, MPI, remote, owner, hc.size)
    problem = None
    askers = np.repeat(np.arange(hc.size), wcounts)
    bad = np.flatnonzero((wanted < 0) | (wanted >= size))
    if bad.size:
        problem = (f"rank {rank}: rank {int(askers[bad[0]])} has a ghost at this rank's local "
                   f"id {int(wanted[bad[0]])}, outside [0, {size})")
    elif ghost_local.size and wanted.size:
        hit = np.flatnonzero(np.isin(wanted, ghost_local))
        if hit.size:
            problem = (f"rank {rank}: rank {int(askers[hit[0]])} has a ghost at this rank's "
                       f"local id {int(wanted[hit[0]])}, which is a ghost here too")
    _agree(comm, problem)
    send, start = {}, 0
    for p in np.flatnonzero(wcounts):
        k = int(wcounts[p])
        send[int(p)] = wanted[start:start + k].astype(np.int64)
        start += k
    return send, recv, size, n_owned


def index_map_lists(hc: HybridComm, index_map: Any) -> Lists:
    """The lists of :meth:`GhostPattern.from_index_map`."""
    comm = comm_of(hc)
    rank = hc.rank
    problem: Any = None
    n, lo, size_global = 0, 0, None
    ghosts: Any = None
    owners: Any = None
    try:
        n = int(_attr(index_map, "size_local"))
        lo, hi = (int(v) for v in _attr(index_map, "local_range"))
        ghosts = np.asarray(_attr(index_map, "ghosts")).reshape(-1)
        owners = np.asarray(_attr(index_map, "owners")).reshape(-1)
        size_global = int(_attr(index_map, "size_global"))
        problem = _not_ids("ghosts", ghosts, rank) or _not_ids("owners", owners, rank)
        if problem is None:
            ghosts, owners = ghosts.astype(np.int64), owners.astype(np.int64)
            dup = _duplicate(ghosts)
            if hi - lo != n:
                problem = (f"rank {rank}: the IndexMap's local_range {lo, hi} does not hold "
                           f"size_local {n}")
            elif owners.size != ghosts.size:
                problem = (f"rank {rank}: the IndexMap has {ghosts.size} ghosts but {owners.size} "
                           "owners")
            elif dup is not None:
                problem = f"rank {rank}: duplicate ghost id {dup}"
    except Exception as e:  # noqa: BLE001 - whatever it raised, every rank must agree
        problem = (f"rank {rank}: from_index_map needs a DOLFINx IndexMap (size_local, "
                   f"local_range, ghosts, owners, size_global), got {type(index_map).__name__}: {e}")
    views = comm.allgather((problem, lo, n, size_global))
    problems = [v[0] for v in views if v[0]]
    if not problems:
        starts = np.array([v[1] for v in views], dtype=np.int64)
        sizes = np.array([v[2] for v in views], dtype=np.int64)
        expect = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        if not np.array_equal(starts, expect) or any(v[3] != sizes.sum() for v in views):
            problems = ["the IndexMap's ranges do not tile this HybridComm's ranks (made on "
                        f"another communicator?): local ranges start at {starts.tolist()} with "
                        f"sizes {sizes.tolist()}, global sizes {sorted({v[3] for v in views})}"]
    if not problems:
        bad = np.flatnonzero((owners < 0) | (owners >= hc.size) | (owners == rank))
        if bad.size:
            problem = (f"rank {rank}: ghost {int(ghosts[bad[0]])} has owner {int(owners[bad[0]])}, "
                       f"not another rank of this HybridComm's {hc.size}")
        else:
            remote = ghosts - starts[owners] if ghosts.size else ghosts
            out: Any = np.flatnonzero((remote < 0) | (remote >= sizes[owners])) if ghosts.size else []
            if len(out):
                i = out[0]
                problem = (f"rank {rank}: ghost {int(ghosts[i])} is outside the range of its "
                           f"owner {int(owners[i])}")
        _agree(comm, problem)
    else:
        _agree(comm, problems[0] if problem is None else problem)
    ghost_local = n + np.arange(ghosts.size, dtype=np.int64)
    return remote_lists(hc, n + ghosts.size, n, ghost_local, owners, remote)


def sf_lists(hc: HybridComm, sf: Any, size: int | None = None) -> Lists:
    """The lists of :meth:`GhostPattern.from_sf`."""
    comm = comm_of(hc)
    rank = hc.rank
    problem: Any = None
    nroots: Any = 0
    local: Any = None
    owner: Any = None
    remote: Any = None
    if size is not None:
        n = as_int(size)
        if n is None or n < 0:
            problem = f"rank {rank}: size must be an int >= 0 or None, got {safe_repr(size)}"
        size = n
    try:
        from mpi4py import MPI

        same = MPI.Comm.Compare(sf.getComm().tompi4py(), comm)
        if same not in (MPI.IDENT, MPI.CONGRUENT):
            problem = f"rank {rank}: the star forest is on another communicator than the HybridComm"
        try:
            nroots, ilocal, iremote = sf.getGraph()
        except ValueError:  # petsc4py on an SF without a graph (nleaves -1)
            nroots = -1
        nroots = int(nroots)
        if nroots < 0:  # no graph set: no leaves (a DMPlex's point SF on one rank)
            nroots, ilocal, iremote = (-1 if size is None else size), None, []
        if problem is None and size is not None and nroots != size:
            problem = f"rank {rank}: size={size} but the star forest has {nroots} roots"
        elif problem is None and nroots < 0:
            problem = (f"rank {rank}: the star forest has no graph (a DMPlex's point SF on one "
                       "rank): pass size=, the length of the local array")
        iremote = np.asarray(iremote)
        ilocal = None if ilocal is None else np.asarray(ilocal).reshape(-1)
        problem = problem or _not_ids("the star forest's iremote", iremote.reshape(-1), rank) or (
            None if ilocal is None else _not_ids("the star forest's ilocal", ilocal, rank))
        iremote = iremote.astype(np.int64).reshape(-1, 2)
        local = (np.arange(len(iremote), dtype=np.int64) if ilocal is None
                 else ilocal.astype(np.int64))
        owner, remote = iremote[:, 0], iremote[:, 1]
    except Exception as e:  # noqa: BLE001 - whatever it raised, every rank must agree
        problem = problem or f"rank {rank}: from_sf needs a petsc4py SF, got {type(sf).__name__}: {e}"
    if problem is None:
        bad = np.flatnonzero((local < 0) | (local >= nroots))
        selfish = np.flatnonzero((owner == rank) & (remote != local))
        if bad.size:
            problem = (f"rank {rank}: leaf {int(local[bad[0]])} is outside the {nroots} roots: "
                       "roots and leaves must index the same local array")
        elif selfish.size:
            i = selfish[0]
            problem = (f"rank {rank}: leaf {int(local[i])} references this rank's own root "
                       f"{int(remote[i])}; a self-leaf must be the same entry")
        elif np.any((owner < 0) | (owner >= hc.size)):
            problem = f"rank {rank}: a leaf references a rank outside this HybridComm"
    _agree(comm, problem)
    far = owner != rank
    ghost_local, owner, remote = local[far], owner[far], remote[far]
    twice = _duplicate(ghost_local)
    # a ghost is an (owner, root) pair: two leaves of one pair are from_global's duplicate id
    pairs, counts = np.unique(np.stack([owner, remote], axis=1), axis=0, return_counts=True)
    pair = pairs[counts > 1]
    _agree(comm, f"rank {rank}: leaf {twice} appears twice" if twice is not None
           else f"rank {rank}: duplicate ghost id (rank {int(pair[0, 0])}'s root {int(pair[0, 1])}, "
           "the root of two leaves)" if pair.size else None)
    return remote_lists(hc, nroots, nroots - ghost_local.size, ghost_local, owner, remote)


def to_sf(pattern: GhostPattern) -> Any:
    """See :meth:`GhostPattern.to_sf`."""
    from petsc4py import PETSc

    hc = pattern.hc
    comm, MPI = hc.comm, mpi()
    peers = np.array([p for p, ids in pattern.send.items() for _ in range(len(ids))], dtype=np.int64)
    ids = (np.concatenate(list(pattern.send.values())) if pattern.send
           else np.zeros(0, dtype=np.int64))
    theirs, _, counts, _ = _alltoallv(comm, MPI, ids, peers, hc.size)
    # theirs: for each owner in rank order, its local ids of this rank's ghosts, in the
    # order of pattern.recv[owner]
    locals_, remotes = [], []
    start = 0
    for p in np.flatnonzero(counts):
        k = int(counts[p])
        locals_.append(pattern.recv[int(p)])
        remotes.append(np.stack([np.full(k, p, dtype=np.int64), theirs[start:start + k]], axis=1))
        start += k
    local = np.concatenate(locals_) if locals_ else np.zeros(0, dtype=np.int64)
    remote = np.concatenate(remotes) if remotes else np.zeros((0, 2), dtype=np.int64)
    sf = PETSc.SF().create(comm=comm)
    sf.setGraph(pattern.size, local.astype(PETSc.IntType), remote.reshape(-1).astype(PETSc.IntType))
    sf.setUp()
    return sf
