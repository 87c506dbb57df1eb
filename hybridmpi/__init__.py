"""hybridmpi: ghost updates, barriers and reductions over MPI-3 shared memory.

Importing this package does not initialize MPI; the first HybridComm does.
"""

from .comm import HybridComm
from .dropin import allreduce, barrier, hybrid
from .errors import FreedError, PatternError, PeerError, SyncTimeout, abort_on_error
from .globalmem import Coarray, GlobalMemory, Request, waitall
from .halo import Halo
from .pattern import GhostPattern
from .profile import profile

__version__ = "0.1.0"

__all__ = [
           "Coarray",
           "GlobalMemory",
           "Request",
           "FreedError",
           "GhostPattern",
           "Halo",
           "HybridComm",
           "PatternError",
           "PeerError",
           "SyncTimeout",
           "__version__",
           "abort_on_error",
           "allreduce",
           "barrier",
           "hybrid",
           "profile",
           "waitall",
]
