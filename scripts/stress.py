"""Stress: many mixed operations over three Halos, with every value checked.

    mpiexec -n 8 python -m mpi4py scripts/stress.py [--ops 100000] [--node-size K] [--method atomic]

Updates, reverses (add), barriers and allreduces, in an order all ranks draw
from one seed, over three Halos of different dtypes and blocks used in turn,
with random sleeps on random ranks.  Values are small integers, so every
expected result is exact whatever the combination order.  Prints the count
of operations checked and of mismatches; exits 1 if any value was wrong.
"""

import argparse
import sys
import time

import numpy as np
from mpi4py import MPI

import hybridmpi
import hybridmpi.tools.baselines  # noqa: F401  (the paper's baseline methods: --method fence, ...)

KINDS = ("update", "reverse", "barrier", "allreduce")


def random_pattern(hc, seed):
    """Random ownership and ghost sets (some ranks without ghosts), from global ids."""
    rng = np.random.default_rng(seed)
    p, r = hc.size, hc.rank
    n = 60 * p
    gids = rng.permutation(n).astype(np.int64) * 7 + 3
    owner = rng.integers(0, p, n)
    ghosts = []
    for q in range(p):
        others = gids[owner != q]
        k = 0 if rng.random() < 0.15 or not others.size else int(rng.integers(1, min(others.size, 40) + 1))
        ghosts.append(rng.choice(others, k, replace=False))
    return hybridmpi.GhostPattern.from_global(hc, gids[owner == r], ghosts[r]), gids[owner == r], ghosts[r]


def value(gids, op, salt, block):
    """A small integer per (global id, operation, salt, component), as float-safe int64."""
    v = (gids[:, None] * 31 + op * 17 + salt * 13 + np.arange(block)[None, :] * 5) % 1000
    return v.astype(np.int64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=100000)
    ap.add_argument("--node-size", type=int, default=None)
    ap.add_argument("--method", default="atomic")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sleep-prob", type=float, default=0.002, help="chance of a short sleep per op")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    hc = hybridmpi.HybridComm(comm, node_size=a.node_size)
    pattern, owned, ghosts = random_pattern(hc, a.seed)
    gids = np.concatenate((owned, ghosts))
    n_owned = owned.size
    halos = [hybridmpi.Halo(pattern, dtype=np.float64, block=1, method=a.method),
             hybridmpi.Halo(pattern, dtype=np.float32, block=3, method=a.method),
             hybridmpi.Halo(pattern, dtype=np.int64, block=2, method=a.method)]
    vecs = [np.zeros(pattern.size), np.zeros((pattern.size, 3), np.float32),
            np.zeros((pattern.size, 2), np.int64)]
    # Which ranks ghost each owned point, in rank order (for the expected reverse sums).
    ghosted_by = [[] for _ in range(n_owned)]
    for p, ids in pattern.send.items():
        for i in ids:
            ghosted_by[i].append(p)
    plan = np.random.default_rng(a.seed + 1).integers(0, len(KINDS), a.ops)
    mine = np.random.default_rng([a.seed, comm.rank])
    checked = mismatches = 0
    t0 = time.perf_counter()
    for op, kind in enumerate(plan):
        if mine.random() < a.sleep_prob:
            time.sleep(mine.random() * 2e-3)
        k = op % 3
        h, x = halos[k], vecs[k]
        block = 1 if x.ndim == 1 else x.shape[1]
        kind = KINDS[kind]
        if kind == "update":
            x[:] = -1
            x[:n_owned] = value(owned, op, 0, block).reshape(x[:n_owned].shape)
            h.update(x)
            want = value(gids, op, 0, block).reshape(x.shape)
            bad = int(np.count_nonzero(x != want))
        elif kind == "reverse":
            x[:n_owned] = value(owned, op, 1, block).reshape(x[:n_owned].shape)
            x[n_owned:] = value(ghosts, op, 2 + comm.rank, block).reshape(x[n_owned:].shape)
            h.reverse(x, op="add")
            want = value(owned, op, 1, block)
            for i, peers in enumerate(ghosted_by):
                for p in peers:
                    want[i] += value(owned[i:i + 1], op, 2 + p, block)[0]
            want = np.concatenate((want, value(ghosts, op, 2 + comm.rank, block))).reshape(x.shape)
            bad = int(np.count_nonzero(x != want))
        elif kind == "barrier":
            hc.barrier()
            bad = 0
        else:
            got = hc.allreduce(op % 1000 + comm.rank)
            bad = int(got != (op % 1000) * comm.size + comm.size * (comm.size - 1) // 2)
        checked += 1
        mismatches += bad
    elapsed = time.perf_counter() - t0
    total = comm.allreduce(checked)
    wrong = comm.allreduce(mismatches)
    for h in halos:
        h.free()
    hc.free()
    if comm.rank == 0:
        print(f"stress: {a.ops} operations x {comm.size} ranks = {total} checked calls, "
              f"{wrong} mismatched values, method {a.method}, node_size {a.node_size}, "
              f"{elapsed:.1f} s")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
