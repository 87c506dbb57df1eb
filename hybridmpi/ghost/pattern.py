"""GhostPattern: who sends which local points to whom in a ghost update.

Built from explicit per-peer lists, or collectively from global ids by a
rendezvous: every global id has a directory rank (a hash of the id), owners
register their ids there and ranks ask it for the owners of their ghosts,
so no rank ever holds an array of the global size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .._native.tables import as_int, mpi
from ..comm._agree import complete, context_of, safe_repr
from ._lists import agree_pattern as _agree
from ._lists import alltoallv as _alltoallv
from ._lists import comm_of

if TYPE_CHECKING:
    from ..comm.hybridcomm import HybridComm

_HASH = np.uint64(0x9E3779B97F4A7C15)
_MAX_ID = np.iinfo(np.int64).max


def _ids(value, what, rank):
    """A 1-D int64 copy of an integer array-like, or a PatternError message.  Whatever the
    conversion raises becomes the message: the rank still has to reach the agreement."""
    try:
        arr = np.asarray(value)
    except Exception as e:  # noqa: BLE001 - a ragged list, a failing __array__...
        return None, (f"rank {rank}: {what} must be a 1-D integer array, and numpy cannot "
                      f"convert it: {type(e).__name__}: {e}")
    if arr.ndim != 1 or not (arr.dtype.kind in "iu" or arr.size == 0):
        return None, (f"rank {rank}: {what} must be a 1-D integer array, got "
                      f"shape {arr.shape} dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and arr.max() > _MAX_ID:
        return None, f"rank {rank}: {what} holds {int(arr.max())}, which does not fit in int64"
    return arr.astype(np.int64), None


def _problem(e, rank):
    """The message of an unexpected exception while a rank checked its own arguments (it
    is agreed on like any other problem, so no rank is left waiting)."""
    return f"rank {rank}: invalid arguments ({type(e).__name__}: {e})"


def _first_duplicate(ids):
    """The first repeated value of ``ids`` (None if all differ)."""
    if ids.size < 2:
        return None
    s = np.sort(ids)
    dup = np.flatnonzero(s[1:] == s[:-1])
    return int(s[dup[0]]) if dup.size else None


def _directory(ids, nranks):
    """The rank that keeps the owner of each global id."""
    mixed = (ids.astype(np.uint64) * _HASH) >> np.uint64(33)
    return (mixed % np.uint64(nranks)).astype(np.int64)


class GhostPattern:
    """The send and receive lists of a ghost update on one rank.

    Collective over ``hc``; every inconsistency raises :class:`PatternError`
    on every rank, naming the rank, peer and id.

    Args:
        hc: the :class:`~hybridmpi.HybridComm`.
        send: ``{peer rank: local ids}`` of the owned points this rank sends
            to each peer.
        recv: ``{peer rank: local ids}`` of the ghost points that receive
            from each peer, in the order the peer sends them.
        size: length of the local vector (owned and ghost points).

    Attributes:
        hc, size, n_owned (points that are not ghosts), n_ghosts,
        neighbors (sorted peer ranks), send, recv (dicts of read-only int64
        arrays), intranode, internode (sorted peers on this rank's node and
        on other nodes).

    Raises:
        PatternError: a peer out of range or equal to this rank, a local id
            out of ``[0, size)``, a repeated id in one list, a ghost that
            receives from two peers or is also sent, or send and receive
            counts that disagree between two peers.
    """

    def __init__(self, hc: HybridComm, *, send: Mapping[int, Any], recv: Mapping[int, Any],
                 size: int) -> None:
        comm = self._comm_of(hc)
        rank = hc.rank
        lists: dict[str, dict[int, Any]] = {"send": {}, "recv": {}}
        try:
            problem = self._check_lists(rank, hc.size, send, recv, size, lists)
        except Exception as e:  # noqa: BLE001 - agreed on like any other problem
            problem = _problem(e, rank)
        _agree(comm, problem)
        self._set(hc, lists["send"], lists["recv"], as_int(size))
        self._check_counts(comm)

    @classmethod
    def _check_lists(cls, rank, nranks, send, recv, size, lists):
        """This rank's problem with the arguments of the constructor (None if none); fills
        ``lists`` with the int64 id arrays."""
        n = as_int(size)
        if n is None or not 0 <= n <= _MAX_ID:
            return f"rank {rank}: size must be an int >= 0, got {safe_repr(size)}"
        size = n
        problem = None
        for name, table in (("send", send), ("recv", recv)):
            if problem:
                break
            if not isinstance(table, dict):
                problem = (f"rank {rank}: {name} must be a dict {{peer: local ids}}, "
                           f"got {type(table).__name__}")
                break
            clean = {}
            for key, ids in table.items():
                peer = as_int(key)
                if peer is None:
                    problem = f"rank {rank}: {name} peer {safe_repr(key)} is not an int"
                elif not 0 <= peer < nranks:
                    problem = f"rank {rank}: {name} peer {peer} out of range [0, {nranks})"
                elif peer == rank:
                    problem = f"rank {rank}: {name} lists this rank itself as a peer"
                if problem:
                    break
                arr, problem = _ids(ids, f"{name}[{peer}]", rank)
                if problem:
                    break
                bad = arr[(arr < 0) | (arr >= size)]
                if bad.size:
                    problem = (f"rank {rank}: {name} to/from peer {peer}: local index {int(bad[0])} "
                               f"out of range [0, {size})")
                    break
                dup = _first_duplicate(arr)
                if dup is not None:
                    problem = f"rank {rank}: {name} to/from peer {peer} lists local id {dup} twice"
                    break
                if arr.size:
                    clean[peer] = arr
            lists[name] = clean
        return problem or cls._check_ghosts(rank, lists["send"], lists["recv"])

    _comm_of = staticmethod(comm_of)

    @classmethod
    def _from_lists(cls, hc: HybridComm, send: dict, recv: dict, size: int,
                    n_owned: int | None = None) -> GhostPattern:
        """The pattern of lists already checked on every rank (the internal constructor of
        from_global, from_index_map and from_sf)."""
        pattern: GhostPattern = cls.__new__(cls)
        pattern._set(hc, send, recv, size, n_owned)
        return pattern

    @staticmethod
    def _check_ghosts(rank, send, recv):
        """A ghost receives from one peer only and is never sent."""
        if not recv:
            return None
        ghosts = np.concatenate(list(recv.values()))
        peers = np.concatenate([np.full(len(v), p) for p, v in recv.items()])
        order = np.argsort(ghosts, kind="stable")
        g, p = ghosts[order], peers[order]
        twice = np.flatnonzero(g[1:] == g[:-1])
        if twice.size:
            i = twice[0]
            return (f"rank {rank}: local id {int(g[i])} receives from peers {int(p[i])} "
                    f"and {int(p[i + 1])}")
        for peer, ids in send.items():
            hit = np.isin(ids, g)
            if hit.any():
                gid = int(ids[hit][0])
                src = int(p[np.searchsorted(g, gid)])
                return (f"rank {rank}: local id {gid} is a ghost (receives from peer {src}) "
                        f"but is sent to peer {peer}")
        return None

    def _set(self, hc, send, recv, size, n_owned=None):
        self.hc = hc
        self.size = size
        for arr in (*send.values(), *recv.values()):
            arr.flags.writeable = False
        self.send = dict(sorted(send.items()))
        self.recv = dict(sorted(recv.items()))
        self.n_ghosts = sum(len(v) for v in recv.values())
        self.n_owned = size - self.n_ghosts if n_owned is None else n_owned
        self.neighbors = tuple(sorted(set(send) | set(recv)))
        node = set(hc.node_ranks)
        self.intranode = tuple(p for p in self.neighbors if p in node)
        self.internode = tuple(p for p in self.neighbors if p not in node)

    def _check_counts(self, comm):
        """Both sides of every pair agree on how many points move."""
        n = self.hc.size
        sends = np.zeros(n, dtype=np.int64)
        for p, ids in self.send.items():
            sends[p] = len(ids)
        incoming = np.empty(n, dtype=np.int64)
        complete(context_of(comm), comm, comm.Ialltoall(sends, incoming), "GhostPattern")
        problem = None
        for p in range(n):
            expect = len(self.recv.get(p, ()))
            if incoming[p] != expect:
                problem = (f"rank {self.hc.rank} expects {expect} values from peer {p}, "
                           f"which sends it {int(incoming[p])}")
                break
        _agree(comm, problem)

    @classmethod
    def from_global(cls, hc: HybridComm, owned: Any, ghosts: Any) -> GhostPattern:
        """Build the pattern from global ids (collective).

        Args:
            hc: the :class:`~hybridmpi.HybridComm`.
            owned: int64 global ids of the points this rank owns; they get
                local ids ``0 .. len(owned)-1`` in this order.
            ghosts: int64 global ids of this rank's ghost points; they get
                local ids ``len(owned) ..`` in this order.

        Returns:
            GhostPattern: ``recv[p]`` lists this rank's ghosts owned by ``p``
            in ghost order; ``send[p]`` the owned points ``p`` asked for, in
            ``p``'s order.

        Raises:
            PatternError: a ghost owned by no rank or by this rank, a ghost
                listed twice, an id owned twice (by one or two ranks), a
                negative id, or ids that are not 1-D integer arrays (every
                rank, also when one rank's ids are not even an array).
        """
        comm = cls._comm_of(hc)
        MPI = mpi()
        rank, nranks = hc.rank, hc.size
        try:
            own, gh, problem = cls._check_global(rank, owned, ghosts)
        except Exception as e:  # noqa: BLE001 - agreed on like any other problem
            problem = _problem(e, rank)
        _agree(comm, problem)

        # 1. Owners register their ids at the directory ranks.
        reg, reg_owner = cls._register_owned(comm, MPI, own, nranks)

        # 2. Ranks ask the directory for the owners of their ghosts.
        owner = cls._ask_owners(comm, MPI, rank, nranks, gh, reg, reg_owner)

        # 3. Each rank tells the owners which of their points it needs.
        n_owned = own.size
        by_owner = np.argsort(owner, kind="stable")
        peers, starts = np.unique(owner[by_owner], return_index=True)
        bounds = list(starts) + [gh.size]
        recv = {int(p): (n_owned + by_owner[bounds[i]:bounds[i + 1]]).astype(np.int64)
                for i, p in enumerate(peers)}
        wanted, _, wcounts, _ = _alltoallv(comm, MPI, gh, owner, nranks)
        own_order = np.argsort(own, kind="stable")
        local = own_order[np.searchsorted(own, wanted, sorter=own_order)]
        send = {}
        start = 0
        for p in np.flatnonzero(wcounts):
            k = int(wcounts[p])
            send[int(p)] = local[start:start + k].astype(np.int64)
            start += k
        return cls._from_lists(hc, send, recv, n_owned + gh.size, n_owned)

    @staticmethod
    def _register_owned(comm, MPI, own, nranks):
        """from_global's step 1 (collective): the directory ranks receive the owned ids
        ``own`` of every rank.  Returns (the ids this rank keeps, sorted; their owners);
        PatternError on every rank when an id is owned twice."""
        reg, _, rcounts, _ = _alltoallv(comm, MPI, own, _directory(own, nranks), nranks)
        reg_owner = np.repeat(np.arange(nranks, dtype=np.int64), rcounts)
        order = np.argsort(reg, kind="stable")
        reg, reg_owner = reg[order], reg_owner[order]
        twice = np.flatnonzero(reg[1:] == reg[:-1])
        problem = None
        if twice.size:
            i = twice[0]
            problem = (f"global id {int(reg[i])} is owned by rank {int(reg_owner[i])} and by "
                       f"rank {int(reg_owner[i + 1])}")
        _agree(comm, problem)
        return reg, reg_owner

    @staticmethod
    def _ask_owners(comm, MPI, rank, nranks, gh, reg, reg_owner):
        """from_global's step 2 (collective): the owner of each ghost id ``gh``, asked of the
        directory ranks (which keep ``reg`` and ``reg_owner``); PatternError on every rank when
        a ghost is owned by no rank."""
        asked, counts, qcounts, qorder = _alltoallv(comm, MPI, gh, _directory(gh, nranks), nranks)
        answer = np.full(asked.size, -1, dtype=np.int64)
        if reg.size:
            pos = np.minimum(np.searchsorted(reg, asked), reg.size - 1)
            hit = reg[pos] == asked
            answer[hit] = reg_owner[pos[hit]]
        back = np.empty(gh.size, dtype=np.int64)
        sdispl = np.concatenate(([0], np.cumsum(qcounts)[:-1]))
        rdispl = np.concatenate(([0], np.cumsum(counts)[:-1]))
        complete(context_of(comm), comm, comm.Ialltoallv([answer, (qcounts, sdispl), MPI.INT64_T],
                                                         [back, (counts, rdispl), MPI.INT64_T]),
                 "GhostPattern.from_global")
        owner = np.empty(gh.size, dtype=np.int64)
        owner[qorder] = back
        problem = None
        nobody = np.flatnonzero(owner < 0)
        if nobody.size:
            problem = f"rank {rank}: ghost id {int(gh[nobody[0]])} is owned by no rank"
        _agree(comm, problem)
        return owner

    @staticmethod
    def _check_global(rank, owned, ghosts):
        """(owned ids, ghost ids, this rank's problem with them or None) for from_global."""
        own, problem = _ids(owned, "owned", rank)
        gh = None
        if not problem:
            gh, problem = _ids(ghosts, "ghosts", rank)
        if problem:
            return own, gh, problem
        for ids, what in ((own, "owned"), (gh, "ghost")):
            if ids.size and ids.min() < 0:
                return own, gh, f"rank {rank}: {what} global id {int(ids.min())} is negative"
        dup = _first_duplicate(own)
        if dup is not None:
            return own, gh, f"rank {rank} lists owned global id {dup} twice"
        dup = _first_duplicate(gh)
        if dup is not None:
            return own, gh, f"rank {rank}: duplicate ghost id {dup}"
        mine = gh[np.isin(gh, own)]
        if mine.size:
            return own, gh, f"rank {rank}: ghost id {int(mine[0])} is owned by the same rank {rank}"
        return own, gh, None

    @classmethod
    def from_index_map(cls, hc: HybridComm, index_map: Any) -> GhostPattern:
        """The pattern of a DOLFINx ``IndexMap`` (collective; DOLFINx 0.5 and newer).

        Local ids are DOLFINx's: owned ``0 .. size_local-1``, then the ghosts in the map's
        order, so a Halo of this pattern (with ``block=bs``) updates ``u.x.array`` as it is,
        with the same bits as ``scatter_forward``/``scatter_reverse``.

        Raises:
            PatternError: not an IndexMap, or one whose ranges do not tile this HybridComm's
                ranks (made on another communicator), or ghosts outside their owner's range
                (every rank).
        """
        from .interop import index_map_lists  # loaded by DOLFINx users only

        return cls._from_lists(hc, *index_map_lists(hc, index_map))

    @classmethod
    def from_sf(cls, hc: HybridComm, sf: Any, size: int | None = None) -> GhostPattern:
        """The pattern of a petsc4py star forest whose roots and leaves index one local array
        (collective): a DMPlex point SF (``dm.getPointSF()``), a Firedrake halo.

        A leaf that references another rank's root is a ghost of that root; a leaf that
        references this rank's own root must be that same entry.  ``size`` is the number
        of roots; :meth:`Halo.update` then does the SF's broadcast, :meth:`Halo.reverse` its
        reduction.  ``size`` (optional) is the local array's length; it is needed when the SF
        has no graph (PETSc leaves a DMPlex's point SF without one on a single rank).

        Raises:
            PatternError: not an SF, an SF on another communicator, a leaf outside the roots,
                a self-leaf that references another entry, or a leaf whose root is a ghost on
                its owner (every rank).
        """
        from .interop import sf_lists  # loaded by PETSc users only

        return cls._from_lists(hc, *sf_lists(hc, sf, size))

    def to_sf(self) -> Any:
        """This pattern as a petsc4py ``PETSc.SF`` (collective): roots and leaves index the
        local vector; each ghost is a leaf of its owner's point.  ``bcast`` with
        ``MPI.REPLACE`` does what :meth:`Halo.update` does, ``reduce`` what
        :meth:`Halo.reverse` does, so PETSc and Firedrake tools can use a pattern made here.
        Needs petsc4py built on the same MPI as mpi4py."""
        from .interop import to_sf

        return to_sf(self)

    def __repr__(self):
        return (f"<GhostPattern rank {self.hc.rank}: {self.n_owned} owned, {self.n_ghosts} ghosts, "
                f"{len(self.intranode)} intranode + {len(self.internode)} internode neighbors>")
