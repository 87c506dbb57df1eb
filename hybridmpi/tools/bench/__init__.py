"""The benchmarks of the paper (Section 4), run by ``hybridmpi bench KIND`` under mpiexec.

Every kind prints an OSU-style table with the MPI baseline of the same run
and the ratio to it, and writes a JSON document (schema in bench/README.md,
checked by :func:`validate`).
"""

from . import apps, cg, collectives, dolfinx_heat, dot, ghost, mesh, profile, rma, share
from ._common import SCHEMA, print_table, set_ratios, validate, write_json

#: kind -> (add its arguments to a parser, run it: (hc, comm, args) -> document,
#: extra table columns, one-line help)
KINDS = {
    "barrier": (collectives.barrier_arguments, collectives.run_barrier, (),
                "tree and linear shared-memory barrier vs MPI_Barrier (paper 4.3)"),
    "allreduce": (collectives.allreduce_arguments, collectives.run_allreduce, (),
                  "scalar allreduce, acq_rel and seq_cst, vs MPI_Allreduce (paper 4.4)"),
    "dot": (dot.arguments, dot.run, (("Gflop/s", "gflops"),),
            "dot-product flop rate per core vs length, with and without the reduction (4.5)"),
    "ghost": (ghost.arguments, ghost.run,
              (("kB/rank", "data_kb"), ("/PETSc", "vs_petsc"), ("/DOLFINx", "vs_dolfinx")),
              "every Halo method, flat-numpy and (--peers) PETSc and DOLFINx on cube meshes, "
              "a mesh file or a ring (4.6, 6.4)"),
    "sync": (collectives.sync_arguments, collectives.run_sync, (),
             "first call after 100 MPI_Barrier vs after 100 shm barriers (4.1, Fig. 10)"),
    "cg": (cg.arguments, cg.run, (("zc", "zc"), ("/private", "vs_private")),
           "time per CG iteration of P1 Poisson: atomic (private or shared search direction) "
           "vs flat vs flat-numpy"),
    "heat3d": (apps.heat3d_arguments, apps.run_heat3d,
               (("halo", "halo_us"), ("imbal", "imbalance_us"), ("transfer", "transfer_us"),
                ("compute", "compute_us"), ("reduce", "reduce_us"), ("halo/MPI", "halo_ratio"),
                ("xfer/MPI", "transfer_ratio"), ("checksum", "checksum")),
               "3D heat conduction: time per step by exchange, split halo/compute/reduce"),
    "himeno": (apps.himeno_arguments, apps.run_himeno,
               (("halo", "halo_us"), ("imbal", "imbalance_us"), ("transfer", "transfer_us"),
                ("compute", "compute_us"), ("reduce", "reduce_us"), ("halo/MPI", "halo_ratio"),
                ("xfer/MPI", "transfer_ratio"), ("MFLOPS", "mflops"), ("gosa", "gosa", "14.6e")),
               "Himeno benchmark: time per iteration by exchange, MFLOPS, gosa"),
    "dolfinx": (dolfinx_heat.arguments, dolfinx_heat.run, (),
                "explicit heat in DOLFINx: ghost updates by DOLFINx's scatters vs a Halo on its "
                "IndexMap, per step, same bits"),
    "mesh": (mesh.arguments, mesh.run, (("points", "points"), ("max local", "max_local_points")),
             "mesh pipeline: gmsh generation, cached read, METIS partition, distribute"),
    "profile": (profile.arguments, profile.run, (("+us", "overhead_us"),),
                "Halo.update with hybridmpi.profile off and on; a sleeping rank's imbalance"),
    "share": (share.arguments, share.run, (("node MB", "node_mb"), ("MB/rank", "per_rank_mb"),
                                           ("root peak", "root_peak_mb")),
              "hybridmpi.share vs a copy per rank (MPI Bcast, comm.bcast): time and node memory"),
    "rma": (rma.arguments, rma.run, (("MB/s", "mb_per_s"), ("overlap%", "overlap_pct")),
            "one-sided put/get latency, bandwidth, overlap and coarray ping-pong vs mpi4py RMA"),
}

__all__ = ["KINDS", "SCHEMA", "print_table", "set_ratios", "validate", "write_json"]
