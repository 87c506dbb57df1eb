"""The Himeno benchmark as its C reference (himenobmtxpa.c) defines it, decomposed over the
two slowest indices: the application of the XcalableMP coarray paper (its Section 4.3).

float32 arrays of ``mimax × mjmax × mkmax`` points in C order; ``p[i,j,k] = i²/(mimax−1)²``,
``a0 = a1 = a2 = 1``, ``a3 = 1/6``, ``b0 = b1 = b2 = 0``, ``c0 = c1 = c2 = 1``, ``bnd = 1``,
``wrk1 = 0``, ``omega = 0.8``; each iteration computes the 19-point sum on the interior,
``ss = (s0·a3 − p)·bnd``, ``gosa += ss²`` and the new ``p = p + omega·ss``.  The two arrays
take turns (the reference's ``wrk2`` and the copy back), ``gosa`` of the last iteration is
summed over the ranks.  ``b0..b2 = 0`` make the diagonal terms vanish, so only faces travel
(as in the MPI reference).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ...comm._resource import Freed
from ._stepper import Stepper, check_names, start_arrays
from .grid import Grid, make_exchange

if TYPE_CHECKING:
    from ...comm.hybridcomm import HybridComm

#: problem sizes (mimax, mjmax, mkmax)
SIZES: dict[str, tuple[int, int, int]] = {"XS": (32, 32, 64), "S": (64, 64, 128), "M": (128, 128, 256),
                                          "L": (256, 256, 512)}
#: the ways of filling the halos (``--exchange``)
EXCHANGES = ("mpi", "mpi-nb", "coarray", "halo")

_F = np.float32
A0 = A1 = A2 = _F(1.0)
A3 = _F(1.0 / 6.0)
B0 = B1 = B2 = _F(0.0)
C0 = C1 = C2 = _F(1.0)
OMEGA = _F(0.8)


class Himeno(Freed):
    """One run of the Himeno benchmark (collective).

    Args:
        hc: the HybridComm.
        size: ``"XS"``, ``"S"``, ``"M"`` or ``"L"``, or a (mimax, mjmax, mkmax) tuple.
        exchange: ``"mpi"`` (the reference: one direction after the other, ``Isend``/
            ``Irecv`` and a wait each), ``"mpi-nb"`` (all messages at once), ``"coarray"``
            (non-blocking coarray puts into the neighbours' halos + ``sync_images``),
            ``"halo"`` (a Halo with ``update_begin``/``update_end`` around the inner points).
        dims: ranks along i and j (default ``MPI.Compute_dims``).

    Raises:
        ValueError: unknown size or exchange, fewer points than ranks.
    """

    def __init__(self, hc: HybridComm, size: str | tuple[int, int, int] = "S", *, exchange: str = "mpi",
                 dims: tuple[int, int, int] | None = None) -> None:
        check_names(exchange, EXCHANGES, "Himeno")
        if isinstance(size, str):
            if size not in SIZES:
                raise ValueError(f"hybridmpi: Himeno: unknown size {size!r}; use one of {list(SIZES)}")
            size = SIZES[size]
        self.hc = hc
        self.exchange = exchange
        self.size = tuple(int(n) for n in size)
        mimax, mjmax, mkmax = self.size
        self.grid = Grid(hc, (mimax - 2, mjmax - 2), full=(mkmax,), dims=dims)
        self.ex = make_exchange(exchange, self.grid, _F)
        lo = self.grid.lo[0]
        n_i = self.grid.shape[0]

        def init(x):
            gi = np.arange(lo, lo + n_i, dtype=_F)  # global i of local planes 0..n_i-1
            x[...] = (gi * gi / _F((mimax - 1) ** 2))[:, None, None]

        self.stepper = Stepper(self.ex, start_arrays(self.ex, init), self.grid.owned, (mkmax,))
        if exchange == "coarray":
            self.ex.after(self.stepper.current)
        self.gosa: float | None = None
        self._gosa_local = _F(0)
        self._bufs: dict[Any, Any] = {}

    def _update(self, y, x, box):
        i, j, k = box

        def at(di, dj, dk):
            return x[i.start + di:i.stop + di, j.start + dj:j.stop + dj, k.start + dk:k.stop + dk]

        key = (i.start, i.stop, j.start, j.stop)
        bufs = self._bufs.get(key)
        if bufs is None:  # made once: fresh temporaries each iteration cost page faults
            shape = at(0, 0, 0).shape
            bufs = self._bufs[key] = (np.empty(shape, _F), np.empty(shape, _F))
        s0, t = bufs
        # the reference's 19-point sum, term by term in its order
        np.multiply(A0, at(1, 0, 0), out=s0)
        s0 += np.multiply(A1, at(0, 1, 0), out=t)
        s0 += np.multiply(A2, at(0, 0, 1), out=t)
        for coef, (p1, p2, p3, p4) in ((B0, ((1, 1, 0), (1, -1, 0), (-1, 1, 0), (-1, -1, 0))),
                                       (B1, ((0, 1, 1), (0, -1, 1), (0, 1, -1), (0, -1, -1))),
                                       (B2, ((1, 0, 1), (-1, 0, 1), (1, 0, -1), (-1, 0, -1)))):
            np.subtract(at(*p1), at(*p2), out=t)
            t -= at(*p3)
            t += at(*p4)
            t *= coef
            s0 += t
        s0 += np.multiply(C0, at(-1, 0, 0), out=t)
        s0 += np.multiply(C1, at(0, -1, 0), out=t)
        s0 += np.multiply(C2, at(0, 0, -1), out=t)
        s0 += _F(0.0)  # wrk1
        p = at(0, 0, 0)
        s0 *= A3  # ss = (s0 * a3 - p) * bnd
        s0 -= p
        s0 *= _F(1.0)
        np.multiply(s0, s0, out=t)
        self._gosa_local += np.sum(t, dtype=_F)
        s0 *= OMEGA
        s0 += p
        y[box] = s0

    def run(self, iterations: int) -> float | None:
        """Run ``iterations`` Jacobi iterations; returns ``gosa`` of the last one (summed over ranks)."""
        st = self.stepper
        for _ in range(iterations):
            self._gosa_local = _F(0)
            st.step(self._update)
            self.gosa = st.reduce(lambda: self.hc.allreduce(float(self._gosa_local)))
        return self.gosa

    @property
    def flops_per_iteration(self) -> int:
        """Floating-point operations per iteration as the reference counts them."""
        imax, jmax, kmax = (n - 1 for n in self.size)
        return (imax - 2) * (jmax - 2) * (kmax - 2) * 34

    @property
    def pressure(self) -> np.ndarray:
        """This rank's current ``p`` (halos included)."""
        return self.stepper.current

    def gather(self) -> np.ndarray | None:
        """The global interior of ``p`` in i and j (all of k) on rank 0, None elsewhere."""
        return self.grid.gather(self.pressure)

    def free(self) -> None:
        """Free the exchange's MPI and shared-memory resources (collective)."""
        self.ex.free()

