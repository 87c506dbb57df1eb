"""The Himeno benchmark with coarray puts (or another exchange).

    mpiexec -n 4 python examples/himeno.py [SIZE ITERATIONS EXCHANGE]

SIZE is XS, S, M or L; EXCHANGE one of mpi, mpi-nb, coarray, halo (default coarray).
"""

import hybridmpi  # imports nothing else: the guard below is in place before any import can fail

with hybridmpi.abort_on_error():  # an error on any rank (an import, an argument): end the job
    import sys
    import time

    from mpi4py import MPI

    from hybridmpi.tools.apps import Himeno

    size = sys.argv[1] if len(sys.argv) > 1 else "S"
    iterations = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    exchange = sys.argv[3] if len(sys.argv) > 3 else "coarray"
    with hybridmpi.HybridComm(MPI.COMM_WORLD) as hc, Himeno(hc, size, exchange=exchange) as bench:
        bench.run(2)
        hc.barrier()
        t0 = time.perf_counter()
        gosa = bench.run(iterations)
        seconds = hc.allreduce(time.perf_counter() - t0, "max")
        if hc.rank == 0:
            mflops = bench.flops_per_iteration * iterations / seconds / 1e6
            print(f"Himeno {size} {bench.size}, {hc.size} ranks {bench.grid.dims}, exchange {exchange}")
            print(f"gosa {gosa:.9e}  {mflops:.1f} MFLOPS  {seconds / iterations * 1e3:.3f} ms per iteration")
