"""A loop of ``Halo.update`` + ``allreduce`` across emulated hosts, for the host faults of
tests/test_hosts.py (not through the case harness: a host fails here).

    python hosts_fault.py [--guard] [--iters N] [--pattern all|node]

Each rank ghosts one point of every other rank (so every host waits on every other), prints
``ready`` once the loop runs, then loops until an error or ``--iters`` iterations.  On an error
it prints one line ``rank R on HOST: ERROR CLASS at T: MESSAGE`` (T: ``time.time()``, the
clock the test compares with the moment of the fault) and exits 3; with ``--guard`` the loop
runs inside ``hybridmpi.abort_on_error()``, which aborts the job instead.
"""

import argparse
import os
import signal
import socket
import time

import hybridmpi

ap = argparse.ArgumentParser()
ap.add_argument("--guard", action="store_true")
ap.add_argument("--iters", type=int, default=10**9)
ap.add_argument("--pattern", choices=["all", "node"], default="all",
                help="all: ghost a point of every rank; node: of the ranks of this host only "
                     "(then only the allreduce waits on other hosts)")
ap.add_argument("--ignore-usr1", action="store_true",
                help="hydra without its cleanup tells the survivors of a dead rank by SIGUSR1, whose "
                     "default action would end them before they could find out themselves")
a = ap.parse_args()
if a.ignore_usr1:
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

comm = MPI.COMM_WORLD
r, p = comm.rank, comm.size
host = socket.gethostname()


def loop():
    with hybridmpi.HybridComm(comm) as hc:
        others = [q for q in (range(p) if a.pattern == "all" else hc.node_ranks) if q != r]
        pattern = hybridmpi.GhostPattern(hc, send={q: [0] for q in others},
                                         recv={q: [1 + i] for i, q in enumerate(others)},
                                         size=1 + len(others))
        with hybridmpi.Halo(pattern) as halo:
            x = np.zeros(1 + len(others))
            for it in range(a.iters):
                x[0] = r + it
                halo.update(x)
                want = np.array([q + it for q in others], dtype=float)
                assert np.array_equal(x[1:], want), (x, want)
                s = hc.allreduce(float(it))
                assert s == it * p
                if it == 20:
                    print(f"rank {r} on {host}: ready (node {hc.node_id} of {hc.num_nodes})",
                          flush=True)
                time.sleep(0.001)
    print(f"rank {r}: done", flush=True)


def report(e):
    msg = str(e).replace("\n", " ")
    print(f"rank {r} on {host}: ERROR {type(e).__name__} at {time.time():.3f}: {msg}", flush=True)


if a.guard:
    with hybridmpi.abort_on_error():  # the job ends by MPI_Abort
        try:
            loop()
        except Exception as e:
            report(e)
            raise
try:
    loop()
except Exception as e:  # noqa: BLE001 - the test reads the line
    report(e)
    os._exit(3)
