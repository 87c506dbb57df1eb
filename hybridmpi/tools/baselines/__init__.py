"""The paper's baseline methods of the Halo (seed 003's Table 2), outside the library: importing
this package registers them (:func:`hybridmpi.ghost.exchange.register`), so that
``Halo(pattern, method=...)`` takes them besides the library's "atomic" and "flat":

- ``"neighbor"``: ``MPI_Ineighbor_alltoallv`` on a distributed-graph communicator;
- ``"fence"``: shared buffers, synchronized by ``MPI_Win_fence`` (Algorithm 6);
- ``"pscw"``: shared buffers, synchronized by post/start/complete/wait (Algorithm 7);
- ``"lock"``: shared buffers, synchronized by passive-target RMA (Algorithm 8).

The benchmarks, the demo and the tests import it; a program that only updates ghosts never
loads them.  Every rank must import it before a Halo of these methods is made (a method that
a rank does not know is an invalid argument there, raised on every rank).
"""

from ...ghost.exchange import METHODS, register
from .fence import Fence
from .lock import Lock
from .neighbor import Neighbor
from .pscw import PSCW

for _name, _transport in (("neighbor", Neighbor), ("fence", Fence), ("pscw", PSCW), ("lock", Lock)):
    register(_name, _transport)

__all__ = ["METHODS", "Fence", "Lock", "Neighbor", "PSCW"]
