"""heat3d and Himeno: every exchange gives the bits of a one-rank run, at any rank count and layout.

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


CASES = [case_heat3d_every_exchange, case_himeno_every_exchange, case_bad_arguments]

if __name__ == "__main__":
    main(CASES)
