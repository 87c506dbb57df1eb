"""Global memory: arrays in the shared arena with locality-aware one-sided access.

A peer on this rank's node is reached with loads and stores (a copy into or
out of its shared segment, no MPI call; the release/acquire of the
synchronizations order it); a peer on another node with MPI-3 RMA on the
window that exposes the same memory (DART-MPI's design).  ``sync_all`` and
``sync_images`` are XcalableMP's synchronization; ``Coarray`` is its
facade.

Modules, each importing only those before it: ``sync`` (the sync_images
state of a HybridComm), ``requests`` (non-blocking operations), ``memory``
(:class:`GlobalMemory`, whose one put/get path decides locality), ``coarray``; beside them
``shared`` (:func:`share`: read-only arrays with one copy per node).
"""

from .coarray import Coarray
from .memory import GlobalMemory
from .requests import Request, waitall
from .shared import Shared, share

__all__ = ["Coarray", "GlobalMemory", "Request", "Shared", "share", "waitall"]
