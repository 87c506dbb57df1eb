"""Barrier and allreduce: hybridmpi's shared-memory collectives vs MPI's.

Run under mpiexec, e.g. ``mpiexec -n 2 python bench/collectives.py``.

Method (seed 003, Section 4): each repetition synchronizes the ranks with
ten shared-memory barriers, then times a loop of calls; the time per call
of a repetition is the maximum over ranks.  The table reports min, mean,
max and standard deviation over repetitions, the MPI equivalent timed in the
same run, and the ratio of the means (hybridmpi / MPI: below 1 is faster).
Results, with every sample, go to a JSON file.
"""

import argparse
import json
import socket

import numpy as np
from _common import describe_mpi, header, stats, timed
from mpi4py import MPI

import hybridmpi


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=2000, help="calls per repetition")
    p.add_argument("--reps", type=int, default=20, help="repetitions")
    p.add_argument("--node-size", type=int, default=None, help="ranks per virtual node")
    p.add_argument("--sizes", default="1,8,1024", help="allreduce lengths in doubles")
    p.add_argument("--json", default="collectives.json", help="output file ('' for none)")
    a = p.parse_args(argv)

    comm = MPI.COMM_WORLD
    hcs = {order: hybridmpi.HybridComm(comm, node_size=a.node_size, memory_order=order)
           for order in ("acq_rel", "seq_cst")}
    hc = hcs["acq_rel"]
    sync = hc.barrier
    rows = []

    def add(op, method, order, count, call, mpi_call):
        hyb = timed(comm, sync, call, a.iters, a.reps)
        ref = timed(comm, sync, mpi_call, a.iters, a.reps)
        s, r = stats(hyb), stats(ref)
        rows.append({"op": op, "method": method, "memory_order": order, "count": count,
                     "samples_us": hyb, "mpi_samples_us": ref, **s,
                     "mpi_mean": r["mean"], "mpi_min": r["min"], "ratio": s["mean"] / r["mean"]})

    for order, h in hcs.items():
        for method in ("tree", "linear"):
            add("barrier", method, order, 0, lambda h=h, m=method: h.barrier(method=m), comm.Barrier)
    for order, h in hcs.items():
        one, res = np.ones(1), np.empty(1)
        add("allreduce", "scalar", order, 1, lambda h=h: h.allreduce(1.0),
            lambda one=one, res=res: comm.Allreduce(one, res))
        for n in map(int, a.sizes.split(",")):
            x = np.full(n, 1.0)
            y = np.empty(n)
            add("Allreduce", "array", order, n, lambda h=h, x=x, y=y: h.Allreduce(x, y),
                lambda x=x, y=y: comm.Allreduce(x, y))

    if comm.rank == 0:
        print("# hybridmpi collectives benchmark")
        print(f"# {describe_mpi()}; {comm.size} ranks, {hc.num_nodes} node(s), "
              f"node_size={a.node_size}; host {socket.gethostname()}")
        print(f"# per repetition: 10 shared-memory barriers, then {a.iters} timed calls; "
              f"{a.reps} repetitions; time per call, max over ranks, in microseconds")
        print("# MPI baseline, same run: comm.Barrier(), comm.Allreduce(x, y) (also for the "
              "scalar hc.allreduce(1.0)); ratio = hybridmpi mean / MPI mean")
        print(f"{'# operation':<12}{'method':>8}{'order':>9}{'count':>7}{'min':>9}{'avg':>9}"
              f"{'max':>9}{'sd':>8}{'MPI avg':>9}{'ratio':>7}")
        for r in rows:
            print(f"{r['op']:<12}{r['method']:>8}{r['memory_order']:>9}{r['count']:>7}"
                  f"{r['min']:9.3f}{r['mean']:9.3f}{r['max']:9.3f}{r['sd']:8.3f}"
                  f"{r['mpi_mean']:9.3f}{r['ratio']:7.2f}")
        if a.json:
            doc = {**header("collectives", comm, hc, a.node_size, a.iters, a.reps),
                   "results": rows}
            with open(a.json, "w") as f:
                json.dump(doc, f, indent=1)
            print(f"# wrote {a.json}")
    for h in hcs.values():
        h.free()


if __name__ == "__main__":
    main()
