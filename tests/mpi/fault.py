"""Fault injection, run by tests/test_faults.py (not through the case harness: ranks die here).

    python fault.py MODE      MODE: raise-update, raise-barrier, kill, clean, caught,
                                    with-block, abort-on-error, abort-on-error-bare

raise-*: rank 1 raises between two updates (or barriers); the other ranks
must get SyncTimeout naming rank 1, or PeerError from a rank that timed out,
and print it.  kill: rank 1
kills itself with SIGKILL.  clean and caught: a normal run, and one whose
errors the program catches; both must leave nothing in /dev/shm.
with-block: no timeout; rank 1 raises in its own code inside ``with HybridComm``:
leaving the block breaks the comm, so the others raise PeerError in their next
wait and every rank meets in the collective free.  abort-on-error: no timeout;
rank 1 raises inside ``hybridmpi.abort_on_error()``: the job is aborted.
abort-on-error-bare: the same with ``hybridmpi.abort_on_error()`` called as a statement, not
in a ``with``: it guards the rest of the program, and the uncaught exception aborts the job.
"""

import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

import hybridmpi
from hybridmpi import GhostPattern, Halo, PatternError, PeerError, SyncTimeout

mode = sys.argv[1]
comm = MPI.COMM_WORLD
r, p = comm.rank, comm.size

if mode == "abort-on-error-bare":
    hybridmpi.abort_on_error()
    hc = hybridmpi.HybridComm(comm)   # no timeout, no with: only the guard can end the job
    for i in range(50):
        if r == 1 and i == 10:
            raise RuntimeError("injected fault on rank 1")
        hc.barrier()
    sys.exit(0)
if mode in ("with-block", "abort-on-error"):
    with hybridmpi.HybridComm(comm) as hc:  # no timeout: nothing but the error can end a wait
        h = Halo(GhostPattern(hc, send={(r + 1) % p: [0, 1]}, recv={(r - 1) % p: [2, 3]}, size=4))
        x = np.arange(4, dtype=float)
        try:
            with hybridmpi.abort_on_error() if mode == "abort-on-error" else open(os.devnull):
                for i in range(50):
                    h.update(x)
                    if r == 1 and i == 10:
                        raise RuntimeError("injected fault on rank 1")
                    hc.barrier()
        except PeerError as e:
            print(f"rank {r}: PeerError peer={e.peer}: {e}", flush=True)
            raise
    sys.exit(0)
hc = hybridmpi.HybridComm(comm, timeout=float(os.environ.get("FAULT_TIMEOUT", "3")))
nxt, prv = (r + 1) % p, (r - 1) % p
pattern = GhostPattern(hc, send={nxt: [0, 1]}, recv={prv: [2, 3]}, size=4)
halo = Halo(pattern)
x = np.arange(4, dtype=float)
for _ in range(20):
    halo.update(x)
    hc.barrier()

if mode == "caught":
    for bad in (lambda: hc.allreduce("x"), lambda: halo.update(np.zeros(7)),
                lambda: GhostPattern(hc, send={r: [0]}, recv={}, size=1)):
        try:
            bad()
        except (TypeError, ValueError, PatternError):
            pass
        else:
            raise AssertionError("no error")
if mode in ("clean", "caught"):
    halo.update(x)
    halo.free()
    hc.free()
    print(f"rank {r}: done", flush=True)
    sys.exit(0)

if r == 1:
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError("injected fault on rank 1")
try:
    for _ in range(5):
        if mode == "raise-barrier":
            hc.barrier()
        else:
            halo.update(x)
except SyncTimeout as e:
    print(f"rank {r}: SyncTimeout peer={e.peer} missing={list(e.missing)}: {e}", flush=True)
    time.sleep(1)   # the other survivor's line comes out before the launcher, seeing this
    os._exit(3)     # rank end, ends the job (not MPI_Finalize: it would wait for the dead rank)
except PeerError as e:
    print(f"rank {r}: PeerError peer={e.peer}: {e}", flush=True)
    time.sleep(1)
    os._exit(3)
print(f"rank {r}: no timeout", flush=True)
sys.exit(4)
