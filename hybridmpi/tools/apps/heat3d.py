"""Unsteady 3D heat conduction: the application of DART-MPI's paper (its Sections 2.2, 5.3).

``nx × ny × nz`` float64 cells of the unit cube's grid, explicit 7-point finite differences
with the diffusivity ``k(T) = k0 (1 + beta T)`` (face values averaged), constant temperatures
on the boundaries (1 on the x = 0 face, 0 on the others), a checkerboard decomposition over
an ``MPI.Compute_dims`` Cartesian grid with a one-cell halo, and an allreduce of the largest
change every ``check_every`` steps.  Every cell's arithmetic is the same whatever the
decomposition, so every exchange and rank count gives the same bits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ...comm._resource import Freed
from ._stepper import Stepper, check_names, interior, start_arrays
from .grid import Grid, make_exchange

if TYPE_CHECKING:
    from ...comm.hybridcomm import HybridComm

#: the ways of filling the halos (``--exchange``)
EXCHANGES = ("sendrecv", "rma", "get", "get-nb", "put", "halo")


class Heat3D(Freed):
    """One run of the heat-conduction code (collective).

    Args:
        hc: the HybridComm.
        grid: (nx, ny, nz) cells.
        exchange: ``"sendrecv"`` (flat MPI ``Sendrecv`` of each face), ``"rma"`` (flat MPI
            ``Rget`` + ``Wait`` of each face on windows, no locality), ``"get"`` /
            ``"get-nb"`` (coarray section gets, blocking / ``Rget`` + ``waitall``, after
            ``sync_images``), ``"put"`` (coarray puts into the neighbours' halos +
            ``sync_images``), ``"halo"`` (a Halo with ``update_begin``/``update_end`` around
            the inner cells).
        k0, beta: the diffusivity ``k0 (1 + beta T)``.
        check_every: steps between two convergence checks (the allreduce).
        dims: ranks per axis (default ``MPI.Compute_dims``).

    Raises:
        ValueError: unknown exchange, fewer cells than ranks along an axis.
    """

    def __init__(self, hc: HybridComm, grid: tuple[int, int, int] = (32, 32, 32), *,
                 exchange: str = "halo", k0: float = 1.0, beta: float = 0.5, check_every: int = 10,
                 dims: tuple[int, int, int] | None = None) -> None:
        check_names(exchange, EXCHANGES, "Heat3D")
        self.hc = hc
        self.exchange = exchange
        self.shape = tuple(int(n) for n in grid)
        self.grid = Grid(hc, self.shape, dims=dims)
        self.ex = make_exchange(exchange, self.grid, np.float64)
        h = 1.0 / max(self.shape)
        self.k0, self.kb = k0, k0 * beta
        dt = 0.9 * h * h / (6 * k0 * (1 + beta))  # stable for 0 <= T <= 1
        self.coef = 0.5 * dt / (h * h)
        self.check_every = check_every
        self.change = None
        hot = self.grid.coords[0] == 0

        def init(x):
            x[...] = 0.0
            if hot:
                x[0, 1:-1, 1:-1] = 1.0

        self.stepper = Stepper(self.ex, start_arrays(self.ex, init), self.grid.owned)
        if exchange == "put":
            # the first step reads halos that the previous step's push would have filled
            self.ex.after(self.stepper.current)
        self._inner = interior(3)
        self._bufs: dict[Any, Any] = {}

    def _scratch(self, box, shape):
        """Work arrays of a box, made once (fresh temporaries each step cost page faults)."""
        key = tuple((b.start, b.stop) for b in box)
        bufs = self._bufs.get(key)
        if bufs is None:
            grown = tuple(n + 2 for n in shape)
            bufs = self._bufs[key] = (np.empty(grown), np.empty(shape), np.empty(shape), np.empty(shape))
        return bufs

    def _update(self, y, x, box):
        # k(T) of the box and the cells around it, once per cell: every cell's arithmetic
        # is the same whatever the box, so the bits do not depend on the decomposition
        grown = tuple(slice(s.start - 1, s.stop + 1) for s in box)
        c = x[box]
        k, flux, term, diff = self._scratch(box, c.shape)
        np.multiply(x[grown], self.kb, out=k)
        k += self.k0
        kc = k[(slice(1, -1),) * 3]
        flux[...] = 0.0
        for axis in range(3):
            for d in (-1, 1):
                shifted = tuple(slice(s.start + d, s.stop + d) if a == axis else s
                                for a, s in enumerate(box))
                kshift = tuple(slice(1 + d, -1 + d or None) if a == axis else slice(1, -1)
                               for a in range(3))
                np.add(kc, k[kshift], out=term)
                np.subtract(x[shifted], c, out=diff)
                term *= diff
                flux += term
        flux *= self.coef
        flux += c
        y[box] = flux

    def run(self, steps: int) -> float | None:
        """Advance ``steps`` steps; returns the largest change of the last check (or None)."""
        st = self.stepper
        for _ in range(steps):
            x, y = st.step(self._update)
            if st.step_count % self.check_every == 0:
                local = float(np.max(np.abs(y[self._inner] - x[self._inner]))) if y[self._inner].size else 0.0
                self.change = st.reduce(lambda v=local: self.hc.allreduce(v, "max"))
        return self.change

    @property
    def temperature(self) -> np.ndarray:
        """This rank's current array (halos included)."""
        return self.stepper.current

    def checksum(self) -> float:
        """The sum of the final grid in global cell order: the same number at every rank
        count and with every exchange (collective; every rank gets it)."""
        whole = self.grid.gather(self.temperature)
        return self.hc.comm.bcast(None if whole is None else float(np.sum(whole)), root=0)

    def free(self) -> None:
        """Free the exchange's MPI and shared-memory resources (collective)."""
        self.ex.free()

