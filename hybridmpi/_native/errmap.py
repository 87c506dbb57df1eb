"""The error map: every return code, error record and error bit of the C core, and what each
becomes in Python (as shmem4py's ``_chkerr``).  No other module of the library but the one that
loads the C core (``clib.py``) names them.

- :func:`collective`: a HybridComm collective's code and its ``hm_error`` (``hm_coll.err``);
- :func:`sync_images`: a ``sync_images`` wait's ``hm_error``;
- :func:`check`: a ghost exchange's code, raised as a transport's :class:`Fault`, which the
  Halo turns into its exception;
- :func:`peer_error`, :func:`halo_peer_error`: the error of a rank that found a peer's error
  bits in a word it waited on (or got its failure notice);
- :func:`timed_out`, :func:`peer_invalid`: the words of every other timeout and of a peer's
  invalid arguments, whichever wait found them (the Halo, sync_images, the agreements, the
  leaders' wait, one-sided requests): no other module words these errors;
- the error bits of a word: :func:`poison_bits`, :func:`is_mismatch`, :func:`broke_before`,
  :func:`describe_word_value`.

A function here builds the exception and says why the comm breaks (the ``why`` that the
caller passes to ``Context.break_comm``); it breaks nothing itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..errors import PeerArgumentError, PeerError, SyncTimeout
from .clib import lib
from .tables import DTYPE_NAMES, OP_NAMES

#: a word's error bits (cext/hm_core.h): its writer failed; the failure is a mismatch
ERRBIT, MISBIT = int(lib.HM_ERRBIT), int(lib.HM_MISBIT)
_FLAGS = ERRBIT | MISBIT
_VALUE = ERRBIT - 1

_OK, _ETIMEOUT, _EMISMATCH = lib.HM_OK, lib.HM_ETIMEOUT, lib.HM_EMISMATCH
_ECMA, _EPEER = lib.HM_ECMA, lib.HM_EPEER
_K_BAD, _PYINT = lib.HM_K_BAD, lib.HM_PYINT
#: the allreduces that name, in err.peer, the rank with the smallest arguments (the tree
#: compares with the node root)
_K_SPREAD = (lib.HM_K_ALLREDUCE_RD, lib.HM_K_ALLREDUCE_DIRECT, lib.HM_K_ALLREDUCE_RSAG)

#: what each collective kind (the C core's HM_K_*) is called in errors
KIND_NAMES = {lib.HM_K_BARRIER_TREE: "barrier(tree)", lib.HM_K_BARRIER_LINEAR: "barrier(linear)",
              lib.HM_K_BARRIER_DISS: "barrier(dissemination)",
              lib.HM_K_ALLREDUCE_TREE: "allreduce (tree)",
              lib.HM_K_ALLREDUCE_RD: "allreduce (recursive doubling)",
              lib.HM_K_ALLREDUCE_DIRECT: "allreduce (direct)",
              lib.HM_K_ALLREDUCE_RSAG: "allreduce (reduce-scatter and allgather)",
              lib.HM_K_BAD: "a collective with invalid arguments"}


# ------------------------------------------------------------------ interrupts

#: the exception a signal raised inside a C wait's progress hook (cffi would drop it), held
#: until the wait has ended and its caller raises it (:func:`interruption`)
_HELD: list[BaseException] = []


def hold(exc: BaseException) -> None:
    """Keep ``exc`` (a signal's exception raised inside a C callback) and end the C waits: each
    returns as at its deadline, and its caller raises :func:`interruption` instead of a
    timeout."""
    if not _HELD:
        _HELD.append(exc)
    lib.hm_interrupt(-1)


def interruption() -> BaseException | None:
    """The exception that ended a wait instead of its deadline (taken: the next wait runs),
    else None: a Python exception the progress hook held (``KeyboardInterrupt`` for SIGINT),
    or, for a signal that the C core's handler caught in a wait (SIGTERM, left at its default
    action by the program), ``SystemExit(128 + signal)``, as the shell reports such a death."""
    sig = lib.hm_interrupted()
    if not sig and not _HELD:
        return None
    lib.hm_interrupt(0)
    if _HELD:
        return _HELD.pop()
    return SystemExit(128 + sig)


# ------------------------------------------------------------------ error bits


def ok(rc: int) -> bool:
    """Whether a C core call returned success."""
    return rc == _OK


def poison_bits(why: str) -> int:
    """The error bits a rank whose comm broke for ``why`` leaves in the words it writes."""
    return ERRBIT | (MISBIT if why == "ValueError" else 0)


def is_mismatch(seen: int) -> bool:
    """Whether a poisoned word says that its writer found an argument mismatch."""
    return bool(seen & MISBIT)



def broke_before(seen: int, value: int) -> bool:
    """Whether a word that reached ``value`` carries error bits set before it did (a writer that
    reached it first did its part of the call; the next call meets the bits)."""
    return bool(seen & _FLAGS) and seen & ~_FLAGS < value


def describe_word_value(seen: int) -> str:
    """A word's value in words, for the hang warning."""
    return f"{seen & _VALUE}{' (error bits set)' if seen >> 62 else ''}"


def breaks(exc: BaseException) -> str:
    """Why a comm breaks on a peer's error ``exc`` (:func:`peer_error`)."""
    return "ValueError" if isinstance(exc, PeerArgumentError) else "PeerError"


def peer_error(rank: int, what: str, peer: int | None, seen: int | None = None,
               also: str = "") -> PeerError:
    """The error of a rank that found a peer's error bits ``seen`` in a word of a collective
    call, or (``seen`` None) got its failure notice; ``also`` ends the message.  The comm
    breaks for :func:`breaks` of it."""
    who = "another rank" if peer is None else f"rank {peer}"
    if seen is not None and seen & MISBIT:
        return PeerArgumentError(f"hybridmpi: rank {rank}: {what}: {who} found that ranks "
                                 "passed different or invalid arguments, or are in different "
                                 "calls (see its error)", rank=rank, peer=peer)
    return PeerError(f"hybridmpi: rank {rank}: {what}: {who} failed in this call "
                     f"(see its error); this rank stops too{also}", rank=rank, peer=peer)


def halo_peer_error(rank: int, what: str, peer: int, seen: int | None) -> PeerError:
    """The error of a rank that found a node peer's error bits ``seen`` in a word of a Halo's
    call, or (``seen`` None) got a message peer's failure notice."""
    if seen is not None and seen & MISBIT:
        return PeerArgumentError(f"hybridmpi: rank {rank}: {what}: rank {peer} found "
                                 "that ranks passed non-corresponding or invalid arguments "
                                 "(see its error)", rank=rank, peer=peer)
    return PeerError(f"hybridmpi: rank {rank}: {what}: rank {peer} failed in this Halo's "
                     "call (see its error); this rank stops too", rank=rank, peer=peer)


def peer_invalid(rank: int, what: str, peer: int | None, call: str = "this call") -> PeerArgumentError:
    """The error of a rank whose peer ``peer`` (None: a rank of another node) passed invalid
    arguments to ``call``, the matching call; that peer raises its own error."""
    who = "a rank of another node" if peer is None else f"rank {peer}"
    return PeerArgumentError(f"hybridmpi: rank {rank}: {what}: {who} passed invalid arguments "
                             f"to {call} (see its error)", rank=rank, peer=peer)


def ranks_differ(where: str, what: str, values: Any, hint: str = "") -> ValueError:
    """Ranks that passed different ``what`` to the collective constructor ``where`` (every rank
    raises it: the agreement gathered ``values``, by rank): each value with the ranks that
    passed it, the value of the fewest ranks first ("rank 2 passed float32, ranks 0-1 float64")."""
    by_value: dict[str, list[int]] = {}
    for rank, value in enumerate(values):
        by_value.setdefault(repr(value), []).append(rank)
    parts = [f"{_ranks_in_words(ranks)} passed {value}"
             for value, ranks in sorted(by_value.items(), key=lambda kv: (len(kv[1]), kv[1][0]))]
    return ValueError(f"hybridmpi: {where}: ranks passed different {what}: {'; '.join(parts)}{hint}")


def _ranks_in_words(ranks: list[int]) -> str:
    """'rank 3', 'ranks 0-2, 5' (sorted ranks)."""
    runs: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(runs)}"


def _each_other(rank: int, views: Any, prefix: str = "") -> str:
    """Each rank whose view differs from this rank's, and this rank's."""
    return ", ".join(f"rank {r} {prefix}{v}" for r, v in enumerate(views) if v != views[rank] or r == rank)


def calls_differ(rank: int, where: str, calls: Any) -> ValueError:
    """Ranks in different collective calls (``calls``: each rank's); every rank raises it."""
    return ValueError(f"hybridmpi: rank {rank}: {where}: ranks are in different calls: "
                      f"{_each_other(rank, calls, 'in ')}; every rank must make the collective "
                      "calls of a HybridComm in the same order")


def frees_differ(rank: int, names: Any) -> RuntimeError:
    """Ranks that free different objects (``names``: each rank's); every rank raises it."""
    return RuntimeError(f"hybridmpi: rank {rank}: ranks free different objects: "
                        f"{_each_other(rank, names)}; free the objects of a HybridComm in the same "
                        "order on every rank")


def other_vector(rank: int, peer: int) -> ValueError:
    """A Halo call where ``peer`` passed another vector than this rank."""
    return ValueError(f"hybridmpi: rank {rank}: Halo: rank {peer} passed another vector than this "
                      "rank (each rank must pass its own Halo.vector() of the same call, or every "
                      "rank a private array)")


def other_node_differs(rank: int, what: str) -> ValueError:
    """A collective whose leaders found that the ranks of another node are in another call."""
    return ValueError(f"hybridmpi: rank {rank}: {what}: the ranks of another node failed or are "
                      "in a different collective call")


def timed_out(rank: int, timeout: float | None, where: str, detail: str = "", *,
              peer: int | None = None, counter: str | None = None, epoch: int | None = None,
              missing: Any = ()) -> SyncTimeout:
    """A wait of ``where`` ("in Halo.update (method 'atomic')", "waiting for MPI_Win_flush")
    that ran past ``timeout``: ``detail`` says what did not come; ``missing``, the ranks of
    this node that have not entered call ``epoch``."""
    msg = f"hybridmpi: rank {rank} timed out after {timeout:g} s {where}"
    if detail:
        msg += f": {detail}"
    missing = list(missing)
    if missing:
        msg += f"; ranks of this node that have not entered call {epoch}: {missing}"
    return SyncTimeout(msg, rank=rank, peer=peer, counter=counter, epoch=epoch, missing=missing)


# ------------------------------------------------------------------ collectives


def sig(count: int, dtype: int, op: int) -> str:
    """A reduction's arguments as the C core records them, in words."""
    if dtype == _PYINT:
        return f"(a Python int, op={OP_NAMES.get(op, op)})"
    return (f"(count={count}, dtype={DTYPE_NAMES.get(dtype, dtype)}, "
            f"op={OP_NAMES.get(op, op)})")


def call_name(kind: int, count: int, dtype: int, op: int) -> str:
    """A collective call as the C core records it, in words."""
    name = KIND_NAMES.get(int(kind), f"collective {kind}")
    if kind in (lib.HM_K_ALLREDUCE_TREE, *_K_SPREAD):
        name += " " + sig(count, dtype, op)
    return name


def _round(value: int) -> str:
    return "no call yet" if value == 0 else f"reached call {value}"


def _counter(value: int) -> str:
    """What a node counter value means (2e-1: arrived at call e, 2e: released it)."""
    if value == 0:
        return "no call yet"
    if value % 2:
        return f"arrived at call {(value + 1) // 2}"
    return f"released call {value // 2}"


def collective(rc: int, err: Any, what: str, *, rank: int, node_ranks: Any, timeout: float | None,
               other_node_invalid: bool, leader_note: Callable[[], str],
               leaders_waited: Callable[[int], str | None],
               missing: Callable[[], list[int]],
               other_leaders: Callable[[], str],
               local: BaseException | None = None,
               mpi_call: bool = False) -> tuple[BaseException, str | None, bool]:
    """The exception of a collective call of the C core that returned ``rc`` with ``err`` (its
    ``hm_error``), and why the comm breaks (None: it stays usable) and whether it notifies.

    A mismatch found by the algorithm itself reaches the same verdict on every rank and leaves
    the comm usable; ranks in different collectives, a failed peer or a timeout leave error bits
    in the node's words, so every rank raises and the comm becomes unusable.  The comm's part:
    ``other_node_invalid`` (at a leader of several nodes, the leaders' signature said that a
    node's call was invalid), ``leader_note()`` (what this node's leader waits on in
    this call, or ''), ``leaders_waited(call)`` (the other nodes' leaders, when this node's
    leader waits on them in ``call``, else None) and ``missing()`` (the node's ranks that have
    not entered the call); and at a leader across nodes, the codes of the calls between the
    nodes (``cext/hm_net.c``), which ``other_leaders()`` (the other nodes' leaders, in words)
    and ``other_node_invalid`` explain (``local``: this rank's own argument error, which it
    raises when another node's call was valid).  ``mpi_call``: the call was MPI's own, over
    every rank (the tuning's path), not the leaders'."""
    if mpi_call:
        return _mpi_call(rc, err, what, rank, timeout)
    if rc in _NET_CODES:
        return _between_nodes(rc, err, what, rank, other_node_invalid, other_leaders, local)
    if rc == _EMISMATCH and err.bad_rank in (lib.HM_BAD_ELSEWHERE, lib.HM_BAD_INVALID_ELSEWHERE):
        # the ranks of this node agree; another node's passed other arguments (every rank
        # raises, the comm stays usable) or invalid ones: that node's comm broke, so this
        # one breaks too, on every rank (the leader's verdict says which: finding 8)
        why = ("ValueError" if err.bad_rank == lib.HM_BAD_INVALID_ELSEWHERE or other_node_invalid
               else None)
        return (PeerArgumentError(f"hybridmpi: {what}: ranks on different nodes are in different "
                                  "collective calls (such as a barrier and an allreduce) or passed "
                                  "different arguments to one (count, dtype or op), or invalid "
                                  "ones",
                                  rank=rank),
                why, False)
    if rc == _EMISMATCH and err.bad_kind != err.root_kind:
        bad, me = node_ranks[err.bad_rank], node_ranks[err.peer]
        if err.bad_kind == _K_BAD:  # the peer raises its own error
            return (PeerArgumentError(f"hybridmpi: rank {rank}: {what}: rank {bad} passed "
                                      "invalid arguments to this call (see its error); this rank "
                                      "stops too", rank=rank, peer=bad), "ValueError", True)
        return (ValueError(f"hybridmpi: {what}: ranks are in different collective calls: rank {bad} "
                           f"called {call_name(err.bad_kind, err.bad_count, err.bad_dtype, err.bad_op)}"
                           f", rank {me} called "
                           f"{call_name(err.root_kind, err.root_count, err.root_dtype, err.root_op)}"),
                "ValueError", True)
    if rc == _EMISMATCH:
        bad = node_ranks[err.bad_rank]
        other = node_ranks[err.peer if err.root_kind in _K_SPREAD else 0]
        return (ValueError(
            f"hybridmpi: {what}: ranks passed different arguments: rank {bad} passed "
            f"{sig(err.bad_count, err.bad_dtype, err.bad_op)}, rank "
            f"{other} passed {sig(err.root_count, err.root_dtype, err.root_op)}"), None, False)
    if rc == _EPEER:
        exc = peer_error(rank, what, None if err.peer < 0 else node_ranks[err.peer],
                         int(err.seen), leader_note())
        return exc, breaks(exc), False
    if rc == _ETIMEOUT:
        if err.counter == lib.HM_CNT_NET:   # this rank leads its node and waited on the others
            return (interruption() or timed_out(
                rank, timeout, f"in {what}", "the leaders of the other nodes did not all join: "
                f"{other_leaders()}", counter="internode", epoch=int(err.epoch)), "SyncTimeout", True)
        return (interruption() or _collective_timeout(err, what, rank, node_ranks, timeout,
                                                      leaders_waited, missing()),
                "SyncTimeout", True)
    return RuntimeError(f"hybridmpi: {what}: C core returned {rc}"), None, False


_NET_CODES = (lib.HM_ENET, lib.HM_EELSEWHERE, lib.HM_EDIFFERS, lib.HM_ENOTICE)


def _mpi_call(rc, err, what, rank, timeout):
    """:func:`collective` of MPI's own call (``hm_net_mpi_*``), which every rank makes."""
    if rc == lib.HM_ENOTICE:
        exc = peer_error(rank, what, int(err.peer), None, "; this rank was in MPI's own call")
        return exc, breaks(exc), False
    if rc == _ETIMEOUT:
        return (interruption() or timed_out(
            rank, timeout, f"in {what}", "not every rank of the communicator joined MPI's call",
            counter="MPI", epoch=int(err.epoch)), "SyncTimeout", True)
    if rc == lib.HM_ENET:
        return (PeerError(f"hybridmpi: rank {rank}: {what}: MPI's call failed", rank=rank),
                "PeerError", True)
    return RuntimeError(f"hybridmpi: {what}: C core returned {rc}"), None, False


def _between_nodes(rc, err, what, rank, other_node_invalid, other_leaders, local):
    """:func:`collective` of a leader whose call between the nodes failed (``HM_ETIMEOUT`` there
    is :func:`collective`'s)."""
    if rc == lib.HM_EDIFFERS:
        return ((local if local is not None else peer_invalid(rank, what, None) if other_node_invalid
                 else other_node_differs(rank, what)), "ValueError", True)
    if rc == lib.HM_EELSEWHERE:
        exc = peer_error(rank, f"{what} (on another node)", None)
        return exc, breaks(exc), False
    if rc == lib.HM_ENOTICE:
        exc = peer_error(rank, what, int(err.peer), None,
                         "; this rank, the node's leader, was waiting on the leaders of the other "
                         f"nodes, which had not all joined: {other_leaders()}")
        return exc, breaks(exc), False
    return (PeerError(f"hybridmpi: rank {rank}: {what}: MPI failed between the nodes (the leaders' "
                      f"communicator; the leaders of the other nodes: {other_leaders()})",
                      rank=rank), "PeerError", True)


def _collective_timeout(err, what, rank, node_ranks, timeout, leaders_waited, missing):
    call = int(err.epoch)
    if err.counter == lib.HM_CNT_LINEAR:
        peer, counter = None, "linear-arrival"
        waited = (f"the arrival counter of node root rank {node_ranks[0]} "
                  f"stayed at {err.seen} of {call} calls' arrivals")
    elif err.counter == lib.HM_CNT_ROUND:
        peer, counter = node_ranks[err.peer], "round"
        waited = (f"rank {peer} did not reach call {call} "
                  f"(its signal says: {_round(int(err.seen))})")
    else:
        peer = node_ranks[err.peer]
        counter = "arrive" if err.counter == lib.HM_CNT_ARRIVE else "release"
        waited = (f"rank {peer} did not {counter} at call {call} "
                  f"(its counter says: {_counter(int(err.seen))})")
    leaders = leaders_waited(call)
    if leaders is not None:
        # the node waits on its leader, and the leader on the other nodes: name those
        waited = (f"this node's leader, rank {node_ranks[0]}, waits since call {call} on "
                  f"the leaders of the other nodes, which did not all join: "
                  f"{leaders} ({waited})")
    return timed_out(rank, timeout, f"in {what}", waited, peer=peer, counter=counter, epoch=call,
                     missing=missing or ())


# ------------------------------------------------------------------ sync_images


def sync_images(err: Any, peers: Any, rank: int, timeout: float | None,
                what: str) -> tuple[str, int, Any]:
    """A ``sync_images`` wait that failed with ``err`` (its ``hm_error``) on the node ``peers``:
    ``("invalid", peer, None)`` (the peer's matching call was invalid: every peer came, the
    counts stay matched), ``("peer", peer, seen)`` (its error bits) or ``("timeout", peer,
    exc)``."""
    peer = peers[err.peer]
    if err.code == _EMISMATCH:
        return "invalid", peer, None
    if err.code == _EPEER:
        return "peer", peer, int(err.seen)
    return "timeout", peer, interruption() or timed_out(
        rank, timeout, f"in {what}", f"rank {peer} has called sync_images naming rank {rank} "
        f"{int(err.seen)} times, this rank {int(err.epoch)}", peer=peer, counter="sync_images",
        epoch=int(err.epoch))


# ------------------------------------------------------------------ ghost exchange


class Fault(Exception):
    """A transport's failure, which the Halo turns into its exception (``Halo._exception``).

    ``kind`` and what comes with it (the other attributes stay None):

    - ``"timeout"``: ``detail``, ``peer``, ``counter``, ``epoch``;
    - ``"notice"``: ``peer``, whose failure notice ended a wait;
    - ``"peer"``: ``peer`` and ``seen``, a word that ``peer`` poisoned (its error bits);
    - ``"mismatch"``: ``peer``, a peer that passed another vector;
    - ``"invalid"``: ``peer``, a peer whose arguments were invalid (it raises its own error);
    - ``"order"``: ``peer``, ``tag``, ``call``, ``direction``, ``detail``, a neighbor
      collective's message from another call;
    - ``"cma"``: ``peer``, ``errnum``, a cross-memory read that failed;
    - ``"core"``: ``rc``, a code of the C core that nothing else names.
    """

    def __init__(self, kind: str, *, peer: Any = None, seen: Any = None, tag: Any = None,
                 call: Any = None, direction: Any = None, detail: str = "",
                 counter: Any = None, epoch: Any = None, errnum: int = 0, rc: int = 0) -> None:
        super().__init__(kind)
        self.kind, self.peer, self.seen, self.tag, self.call = kind, peer, seen, tag, call
        self.direction, self.detail, self.counter, self.epoch = direction, detail, counter, epoch
        self.errnum, self.rc = errnum, rc

    def cma_detail(self) -> str:
        """A failed cross-memory read's reason, in words ('' when the C core gave none)."""
        return f" ({os.strerror(self.errnum)})" if self.errnum else ""


#: the tag word of a call marked invalid (a rank whose arguments were invalid publishes it)
TAG_INVALID = lib.HM_TAG_BAD


def check(rc: int, err: Any) -> None:
    """Raise the :class:`Fault` of a C exchange call that returned ``rc`` (its ``hm_error``:
    ``err``); nothing when it succeeded."""
    if rc == _OK:
        return
    peer = int(err.peer)
    if rc == _EMISMATCH:
        raise Fault("invalid" if int(err.tag) == TAG_INVALID else "mismatch", peer=peer)
    if rc == _EPEER:
        raise Fault("peer", peer=peer, seen=int(err.seen))
    if rc == _ECMA:
        raise Fault("cma", peer=peer, errnum=int(err.errnum))
    if rc == _ETIMEOUT:
        exc = interruption()
        if exc is not None:   # a signal ended the wait: the Halo breaks, and raises it
            raise exc
        e = int(err.epoch)
        if err.counter == lib.HM_CNT_READY:
            counter, why = "READY", f"did not publish call {e} (its READY counter says {err.seen})"
        else:
            counter, why = "DONE", (f"had not finished reading call {e} "
                                    f"(its DONE counter says {err.seen})")
        raise Fault("timeout", detail=f"rank {err.peer} {why}", peer=peer, counter=counter, epoch=e)
    raise Fault("core", rc=rc)
