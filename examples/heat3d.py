"""3D heat conduction with the library's halo exchanges.

    mpiexec -n 4 python examples/heat3d.py [NX NY NZ STEPS EXCHANGE]

EXCHANGE is one of sendrecv, rma, get, get-nb, put, halo (default halo).
"""

import hybridmpi  # imports nothing else: the guard below is in place before any import can fail

with hybridmpi.abort_on_error():  # an error on any rank (an import, an argument): end the job
    import sys

    from mpi4py import MPI

    from hybridmpi.tools.apps import Heat3D

    nx, ny, nz, steps = (int(v) for v in (sys.argv[1:5] or (32, 32, 32, 100)))
    exchange = sys.argv[5] if len(sys.argv) > 5 else "halo"
    with hybridmpi.HybridComm(MPI.COMM_WORLD) as hc, Heat3D(hc, (nx, ny, nz), exchange=exchange) as app:
        for _ in range(steps // 10):
            change = app.run(10)  # an allreduce of the largest change every 10 steps
            if hc.rank == 0:
                print(f"step {app.stepper.step_count:5d}: largest change {change:.3e}")
        total = app.checksum()
        t = app.stepper.times
        if hc.rank == 0:
            print(f"checksum {total!r} ({hc.size} ranks, grid {app.grid.dims}, exchange {exchange})")
            print("seconds: halo %.3f, compute %.3f, reduce %.3f" % (t["halo"], t["compute"], t["reduce"]))
