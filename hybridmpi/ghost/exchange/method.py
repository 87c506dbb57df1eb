"""What a Halo method is: the :class:`Spec` it is made from, the :class:`Transport` interface it
implements, and the directions and size thresholds every method shares.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

FWD, REV = 0, 1
#: channel size (bytes) from which shared vectors are updated without staging buffers
ZERO_COPY_BYTES = 6 * 1024
#: channel size (bytes) from which blocking updates of private arrays read the owner's array
#: with process_vm_readv (cross-memory attach), when the runs average CMA_MIN_RUN points
CMA_BYTES = 8 * 1024
CMA_MIN_RUN = 64


@dataclass(frozen=True)
class Paths:
    """The settings from which an exchange chooses its paths, agreed by every rank when the
    Halo is made (so every rank takes the same path)."""

    #: the largest channel inside a node, over all ranks (bytes)
    biggest: int
    #: channel size from which shared vectors are updated without staging (atomic)
    zero_copy_bytes: int
    #: channel size from which private arrays are read by cross-memory attach (atomic)
    cma_bytes: int
    #: whether cross-memory attach is allowed (env HYBRIDMPI_CMA)
    cma: bool


@dataclass(frozen=True)
class Spec:
    """Everything a method needs of its Halo, fixed when the Halo is made (``Halo.spec``).

    A method reads this and nothing else of the Halo; it reports failures by raising
    :class:`Fault`, which the Halo turns into the exception users see.
    """

    #: the HybridComm's :class:`~hybridmpi.comm._context.Context`: its communicators, node layout,
    #: shared arena, wait policy and failure notices (a method sees nothing else of it)
    ctx: Any
    #: mpi4py's MPI module
    MPI: Any
    #: per direction (FWD, REV): (sends, recvs), each a list of (peer, local ids), peers in
    #: rank order
    plans: tuple
    #: bytes per point (the dtype's itemsize times the block)
    esz: int
    #: the C core's type code of the dtype
    dtype: int
    #: the Halo's MPI tag; direction d's messages use tag + d
    tag: int
    #: seconds a wait may last (None: no limit)
    timeout: float | None
    #: the wait policy (a cffi ``hm_wait_policy``) that the C core's waits copy
    policy: Any
    #: the pattern's neighbors, in rank order
    neighbors: tuple
    #: the pattern itself, as a key only: the Halos of one pattern may share its MPI objects
    pattern: Any
    #: the agreed settings from which the method chooses its paths
    paths: Paths


class Transport(ABC):
    """A Halo method, made from a :class:`Spec`: :class:`Exchange` ("atomic", "flat") and the
    paper's baselines.

    ``d`` is FWD (owners to ghosts) or REV (ghosts into owners), ``xbuf`` a cffi view of
    the vector, ``e`` the call's epoch (1, 2, ... per direction), ``op`` the C core's code
    of the combining operation.  Failures raise :class:`Fault`.
    """

    @abstractmethod
    def begin(self, d, xbuf, e):
        """Start call ``e`` of direction ``d``: what is sent is copied (or published) now."""

    @abstractmethod
    def end(self, d, xbuf, e, op):
        """Finish call ``e``: what was received is in ``xbuf``."""

    #: every rank of the node takes part in every call, neighbor or not (fence)
    node_collective = False
    #: the method holds an MPI window of its own, freed collectively with the Halo (fence,
    #: pscw, lock); the library's methods take blocks of the HybridComm's arena
    own_window = False

    @abstractmethod
    def free(self):
        """Release what the method holds (collective with the Halo's free)."""

    @abstractmethod
    def bad_call(self, d, e):
        """Call ``e`` of direction ``d`` for a rank whose arguments were invalid: take part in
        its synchronization with the call marked invalid, moving nothing, so that the peers
        raise instead of waiting or reading.  Returns whether every peer sending to this rank
        was invalid too (then the Halo stays usable)."""

    def run(self, d, xbuf, e, op):
        """A whole call: its begin, then its end."""
        self.begin(d, xbuf, e)
        self.end(d, xbuf, e, op)

    def prepare(self):
        """Collective set-up once the transports of every rank are made, outside the Halo's
        method fallback ("auto"); it chooses the method's own paths (atomic: cross-memory
        attach).  Nothing by default."""
        return None

    #: whole forward updates of private arrays by a path of the method's own (atomic:
    #: cross-memory attach, a :class:`ZeroCopy`), or None
    cross_memory: Any = None

    def packed(self, d):
        """The C structures (send, recv) of a whole call of direction ``d`` as one C call (the
        Halo's hot path), or None where the method has none."""
        return None

    def fault(self, d, rc):
        """Raise the Fault of a whole :meth:`packed` call of direction ``d`` that returned
        ``rc`` (only methods whose ``packed`` is not None are asked)."""
        raise RuntimeError(f"hybridmpi: C core returned {rc}")

    def shared_vector(self, tag, bases):
        """Updates of one shared vector (Halo.vector(); ``bases``: its address on each node
        rank) by a path of the method's own, or None: the vector is updated as any array.
        Collective on the node."""
        return None

    def words(self):
        """The words this rank writes that its node peers wait on (where its error bits go)."""
        return []

    def missing(self, d, epoch):
        """Ranks of this node that have not entered call ``epoch`` of direction ``d``, where
        the method can tell (after a timeout)."""
        return []

    def describe_word(self, addr):
        """(counter name, peer) when a wait on the word at ``addr`` is one of this method's."""
        return None
