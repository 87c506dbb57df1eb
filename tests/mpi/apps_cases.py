"""heat3d and Himeno: every exchange gives the bits of a one-rank run, at any rank count and layout,
and the default exchange agrees with a whole-grid numpy stencil written apart from the apps.

Usage: python -m mpi4py apps_cases.py [--node-size K] [--only ...]
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _harness import agree, main

from hybridmpi import HybridComm
from hybridmpi.tools.apps import Heat3D, Himeno, heat3d, himeno


def serial(comm, make, steps, result):
    """The one-rank run (on rank 0 alone), broadcast."""
    sub = comm.Split(0 if comm.rank == 0 else 1, comm.rank)
    value = None
    if comm.rank == 0:
        with HybridComm(sub) as hc, make(hc) as app:
            value = result(app, steps)
    sub.Free()
    return comm.bcast(value, root=0)


def case_heat3d_every_exchange(comm, rng, **cfg):
    """Every exchange: the same final grid (bit for bit) and checksum as one rank."""
    grid, steps = (9, 7, 8), 12

    def whole(app, n):
        app.run(n)
        return app.grid.gather(app.temperature), app.checksum(), app.change

    ref_grid, ref_sum, ref_change = serial(comm, lambda hc: Heat3D(hc, grid, exchange="sendrecv",
                                                                   check_every=5), steps, whole)
    assert ref_sum > 0 and ref_change > 0
    with HybridComm(comm, node_size=cfg["node_size"]) as hc:
        for name in heat3d.EXCHANGES:
            with Heat3D(hc, grid, exchange=name, check_every=5) as app:
                app.run(steps)
                got = app.grid.gather(app.temperature)
                total = app.checksum()
                assert total == ref_sum, (name, total, ref_sum)
                assert app.change == ref_change, (name, app.change, ref_change)
                if comm.rank == 0:
                    assert got.tobytes() == ref_grid.tobytes(), name
                agree(comm, total)


def case_himeno_every_exchange(comm, rng, **cfg):
    """Every exchange gives the same p (bits) as one rank; gosa equal to float32 summation rounding."""
    size, iters = (12, 11, 10), 6

    def whole(app, n):
        app.run(n)
        return app.gather(), app.gosa

    ref_p, ref_gosa = serial(comm, lambda hc: Himeno(hc, size, exchange="mpi"), iters, whole)
    assert ref_gosa > 0
    with HybridComm(comm, node_size=cfg["node_size"]) as hc:
        gosas = []
        for name in himeno.EXCHANGES:
            with Himeno(hc, size, exchange=name) as app:
                gosa = app.run(iters)
                p = app.gather()
                if comm.rank == 0:
                    assert p.tobytes() == ref_p.tobytes(), name
                assert abs(gosa - ref_gosa) <= 1e-5 * ref_gosa, (name, gosa, ref_gosa)
                gosas.append(gosa)
                agree(comm, gosa)
        assert len(set(gosas)) == 1, gosas  # the same partial sums whatever the exchange


def heat3d_numpy(shape, steps, check_every, k0=1.0, beta=0.5):
    """Heat3D as its docstring defines it, written apart from the app: a whole-grid numpy
    stencil.  Returns the final cells and the largest change at the last check."""
    t = np.zeros(tuple(n + 2 for n in shape))
    t[0, 1:-1, 1:-1] = 1.0                    # the x = 0 face at 1, the other faces at 0
    h = 1.0 / max(shape)
    dt = 0.9 * h * h / (6 * k0 * (1 + beta))
    inner = (slice(1, -1),) * 3
    change = None
    for step in range(1, steps + 1):
        k = k0 * (1 + beta * t)
        c = t[inner]
        flux = np.zeros(shape)
        for axis in range(3):
            for d in (-1, 1):
                nb = tuple(slice(1 + d, t.shape[a] - 1 + d) if a == axis else slice(1, -1)
                           for a in range(3))
                flux += 0.5 * (k[inner] + k[nb]) * (t[nb] - c)
        new = c + dt / (h * h) * flux
        if step % check_every == 0:
            change = float(np.max(np.abs(new - c)))
        t[inner] = new
    return t[inner], change


def himeno_numpy(size, iterations):
    """Himeno's Jacobi as himenobmtxpa.c computes it with its constants (a = c = 1, a3 = 1/6,
    b = 0, bnd = 1, wrk1 = 0, omega = 0.8), whole-grid float32 numpy.  Returns the interior
    in i and j (all of k) and gosa of the last iteration."""
    mi, mj, mk = size
    f = np.float32
    p = np.broadcast_to((np.arange(mi, dtype=f) ** 2 / f((mi - 1) ** 2))[:, None, None], size).copy()
    inner = (slice(1, -1),) * 3
    gosa = None
    for _ in range(iterations):
        s0 = (p[2:, 1:-1, 1:-1] + p[1:-1, 2:, 1:-1] + p[1:-1, 1:-1, 2:]
              + p[:-2, 1:-1, 1:-1] + p[1:-1, :-2, 1:-1] + p[1:-1, 1:-1, :-2])
        ss = s0 * f(1.0 / 6.0) - p[inner]
        gosa = float(np.sum(ss.astype(np.float64) ** 2))
        p[inner] = p[inner] + f(0.8) * ss
    return p[1:-1, 1:-1, :], gosa


def case_heat3d_against_numpy(comm, rng, **cfg):
    """The default exchange's final grid and change against the numpy stencil (an independent
    check: the other cases compare the app with itself)."""
    grid, steps, every = (9, 7, 8), 12, 5
    with HybridComm(comm, node_size=cfg["node_size"]) as hc, Heat3D(hc, grid, check_every=every) as app:
        app.run(steps)
        got, change = app.grid.gather(app.temperature), app.change
    if comm.rank == 0:
        want, want_change = heat3d_numpy(grid, steps, every)
        assert got.shape == want.shape and want.max() > 0.1, (got.shape, want.max())
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
        assert abs(change - want_change) <= 1e-12 * want_change, (change, want_change)


def case_himeno_against_numpy(comm, rng, **cfg):
    """The default exchange's p and gosa against himeno_numpy (float32: rounding differs)."""
    size, iters = (12, 11, 10), 6
    with HybridComm(comm, node_size=cfg["node_size"]) as hc, Himeno(hc, size) as app:
        gosa = app.run(iters)
        got = app.gather()
    if comm.rank == 0:
        want, want_gosa = himeno_numpy(size, iters)
        assert got.shape == want.shape, (got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
        assert abs(gosa - want_gosa) <= 1e-4 * want_gosa, (gosa, want_gosa)


def case_bad_arguments(comm, rng, **cfg):
    with HybridComm(comm, node_size=cfg["node_size"]) as hc:
        for call in (lambda: Heat3D(hc, (8, 8, 8), exchange="pigeon"),
                     lambda: Himeno(hc, "XXL"), lambda: Himeno(hc, "XS", exchange="fax"),
                     lambda: Heat3D(hc, (8, 8, comm.size * 0), exchange="halo")):
            try:
                call()
            except ValueError as e:
                assert str(e).startswith("hybridmpi"), e
            else:
                raise AssertionError("accepted")
        np.testing.assert_equal(Himeno(hc, "XS").flops_per_iteration, 29 * 29 * 61 * 34)


CASES = [case_heat3d_every_exchange, case_himeno_every_exchange, case_heat3d_against_numpy,
         case_himeno_against_numpy, case_bad_arguments]

if __name__ == "__main__":
    main(CASES)
