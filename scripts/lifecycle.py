"""Lifecycles: make and free many Halos and GlobalMemory objects while a few others stay live and
in use, and check that memory, shared-memory files and MPI communicators stay flat.

    mpiexec -n N python -m mpi4py scripts/lifecycle.py [--halos 100000] [--mems 20000]
        [--every 5000] [--methods atomic,flat,neighbor,fence,pscw,lock] [--node-size K]
        [--tag-test] [--json lifecycle.json] [--slack-mb 40]

Each iteration makes one Halo (the methods in turn, on one of two patterns) and frees it, using
it first every few iterations; every ``halos/mems`` iterations it also makes and frees a
GlobalMemory.  Three Halos (``atomic``, ``flat``, ``neighbor``), a shared vector and a
GlobalMemory made at the start stay live: every ``--check`` iterations they are updated,
reversed, put into and read with fresh random data and checked.  Every ``--every`` iterations
each rank records its resident memory (VmRSS), the entries of /dev/shm, the shared-memory
segments it has mapped (from /proc/self/maps), its open file descriptors, and that
``MPI_Comm_dup`` plus a new graph communicator (a ``neighbor`` Halo) still work; rank 0 prints
a table (max over ranks) and checks at the end that nothing grew: RSS by at most
``--slack-mb`` MB over the first checkpoint after warm-up, the same mapped segments, file
descriptors (+2), and /dev/shm entries (+``--shm-slack``: /dev/shm is shared with other jobs,
whose files are counted too).

``--tag-test``: keeps the first Halo of each method alive (``flat`` and ``atomic``), and after
the loop makes one more of each, then runs the first and the last one's ``update_begin`` in
opposite orders on even and odd ranks (ends likewise) and checks both Halos' ghosts: Halo
identifiers (MPI tags) that wrap around after 16,000 Halos would make the two share tags and
swap their ghosts (run with ``--node-size 1`` so that the messages are MPI's).

Exit code 0 when every check passed; rank 0 prints ``LIFECYCLE: ok`` or ``LIFECYCLE: FAILED``.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
from mpi4py import MPI

from hybridmpi import GhostPattern, GlobalMemory, Halo, HybridComm
from hybridmpi.tools import baselines  # noqa: F401  (the paper's baseline methods of the Halo)

comm = MPI.COMM_WORLD
R, P = comm.rank, comm.size


def rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def shm_maps():
    """Distinct /dev/shm files this process has mapped."""
    seen = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[5].startswith("/dev/shm/"):
                seen.add(parts[5])
    return seen


def fds():
    return len(os.listdir("/proc/self/fd"))


def pattern(hc, seed, n=8):
    """Each rank owns n points and ghosts a random few of every other rank's."""
    rng = np.random.default_rng(seed)
    owned = np.arange(R * n, R * n + n)
    ghosts = []
    for q in range(P):
        if q != R:
            k = int(rng.integers(1, n))
            ghosts += list(q * n + rng.permutation(n)[:k])
    # every rank draws from the same seed: the choices depend on (R, q) through the stream
    rng2 = np.random.default_rng([seed, R])
    ghosts = np.array(ghosts, dtype=np.int64)[rng2.permutation(len(ghosts))]
    return GhostPattern.from_global(hc, owned, ghosts), owned, ghosts


class Check:
    """Forward and reverse of a Halo against values every rank can compute."""

    def __init__(self, n):
        self.n = n

    def owned_value(self, k, gid):
        return ((np.asarray(gid) * 7919 + k * 104729) % 100003).astype(np.float64)

    def forward(self, h, x, owned, ghosts, k):
        n = len(owned)
        x[:n] = self.owned_value(k, owned)
        x[n:] = -1.0
        h.update(x)
        return np.array_equal(x[n:], self.owned_value(k, ghosts))

    def split(self, h, x, owned, ghosts, k):
        n = len(owned)
        x[:n] = self.owned_value(k, owned)
        x[n:] = -1.0
        h.update_begin(x)
        h.update_end(x)
        return np.array_equal(x[n:], self.owned_value(k, ghosts))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--halos", type=int, default=100000)
    ap.add_argument("--mems", type=int, default=20000)
    ap.add_argument("--every", type=int, default=0, help="iterations between rows (default: halos/10)")
    ap.add_argument("--check", type=int, default=97, help="iterations between checks of the live objects")
    ap.add_argument("--use", type=int, default=7, help="use every this many new Halos before freeing it")
    ap.add_argument("--methods", default="atomic,flat,neighbor,fence,pscw,lock")
    ap.add_argument("--node-size", type=int, default=None)
    ap.add_argument("--tag-test", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--slack-mb", type=float, default=8.0)
    ap.add_argument("--shm-slack", type=int, default=3)
    a = ap.parse_args()
    methods = a.methods.split(",")
    every = a.every or max(1, a.halos // 10)
    mem_every = max(1, a.halos // max(a.mems, 1)) if a.mems else 0
    shm_before = set(os.listdir("/dev/shm"))
    problems = []
    rows = []
    hc = HybridComm(comm, node_size=a.node_size)
    pats = [pattern(hc, 1), pattern(hc, 2)]
    pat, owned, ghosts = pats[0]
    size = pat.size
    chk = Check(size)
    live = [Halo(pat, method=m) for m in ("atomic", "flat", "neighbor")]
    vec_halo = Halo(pat, block=1)
    vec = vec_halo.vector()
    live_x = [np.zeros(size) for _ in live]
    gm = GlobalMemory(hc, 8 * P, np.float64)
    firsts = {}
    if a.tag_test:
        for m in ("flat", "atomic"):
            firsts[m] = Halo(pat, method=m)
    made_h = made_m = 0
    t0 = time.perf_counter()
    t_last, n_last = t0, 0
    k = 0

    def checkpoint(i):
        nonlocal t_last, n_last
        d = comm.Dup()  # one more communicator still works
        d.Free()
        probe = Halo(pats[1][0], method="neighbor")  # a new graph communicator
        probe.free()
        now = time.perf_counter()
        mine = (rss_kb(), len(shm_maps()), fds())
        views = comm.gather(mine, root=0)
        shm_now = set(os.listdir("/dev/shm"))
        if R == 0:
            dt = (now - t_last) / max(made_h - n_last, 1) * 1e6
            row = {
                "iteration": i,
                "halos_made": made_h,
                "mems_made": made_m,
                "rss_mb": max(v[0] for v in views) / 1024,
                "shm_maps": max(v[1] for v in views),
                "fds": max(v[2] for v in views),
                "dev_shm_new": len(shm_now - shm_before),
                "dev_shm_total": len(shm_now),
                "us_per_halo": dt,
            }
            rows.append(row)
            print(
                f"{row['iteration']:>10d} {row['halos_made']:>10d} {row['mems_made']:>9d} "
                f"{row['rss_mb']:>9.1f} {row['shm_maps']:>9d} {row['fds']:>6d} {row['dev_shm_new']:>8d} "
                f"{row['dev_shm_total']:>9d} {row['us_per_halo']:>10.1f}",
                flush=True,
            )
        t_last, n_last = time.perf_counter(), made_h

    if R == 0:
        print(
            f"# hybridmpi lifecycle: {P} ranks, node_size {a.node_size}, methods {methods}, "
            f"{a.halos} Halos, {a.mems} GlobalMemory",
            flush=True,
        )
        print(
            f"# {'iteration':>8} {'halos':>10} {'mems':>9} {'rss_MB':>9} {'shm_maps':>9} {'fds':>6} "
            f"{'shm_new':>8} {'shm_all':>9} {'us/halo':>10}",
            flush=True,
        )
    checkpoint(0)
    for i in range(1, a.halos + 1):
        m = methods[i % len(methods)]
        p = pats[i % 2][0]
        h = Halo(p, method=m)
        made_h += 1
        if a.use and i % a.use == 0:
            y = np.zeros(p.size)
            h.update(y)
        h.free()
        if mem_every and i % mem_every == 0 and made_m < a.mems:
            g = GlobalMemory(hc, int(i % 5), np.float64 if i % 2 else np.int64)
            made_m += 1
            if i % 3 == 0:
                g.sync_all()
            g.free()
        if i % a.check == 0:
            k += 1
            ok = all(chk.forward(h_, x, owned, ghosts, k + j) for j, (h_, x) in enumerate(zip(live, live_x)))
            ok &= chk.split(vec_halo, vec, owned, ghosts, k)
            nxt = (R + 1) % P
            gm.Put(np.full(8, float(k * 10 + R)), nxt, 8 * R)
            gm.sync_all()
            prv = (R - 1) % P
            ok &= bool(np.all(gm.local[8 * prv : 8 * prv + 8] == float(k * 10 + prv)))
            gm.sync_all()
            if not ok:
                problems.append(f"rank {R}: the live objects held wrong values at iteration {i}")
                break
        if i % every == 0:
            checkpoint(i)
    if a.tag_test:
        # the first Halos are still live: one more of each, begun in opposite orders
        for m in ("flat", "atomic"):
            later = Halo(pat, method=m)
            first = firsts[m]
            xa, xb = np.zeros(size), np.zeros(size)
            n = len(owned)
            for x, kk in ((xa, 1001), (xb, 2002)):
                x[:n] = chk.owned_value(kk, owned)
                x[n:] = -1.0
            pairs = [(first, xa), (later, xb)]
            order = pairs if R % 2 == 0 else pairs[::-1]
            for h_, x in order:
                h_.update_begin(x)
            for h_, x in order[::-1]:
                h_.update_end(x)
            good = np.array_equal(xa[n:], chk.owned_value(1001, ghosts)) and np.array_equal(
                xb[n:], chk.owned_value(2002, ghosts)
            )
            if not good:
                swapped = np.array_equal(xa[n:], chk.owned_value(2002, ghosts)) or np.array_equal(
                    xb[n:], chk.owned_value(1001, ghosts)
                )
                problems.append(
                    f"rank {R}: method {m}: the Halo made after {made_h} others and a live one "
                    f"begun in another order got wrong ghosts{' (swapped)' if swapped else ''}; "
                    f"tags {first.tag} and {later.tag}"
                )
            later.free()
            first.free()
    for h_ in live + [vec_halo]:
        h_.free()
    gm.free()
    hc.free()
    verdict = comm.gather(problems, root=0)
    shm_after = set(os.listdir("/dev/shm"))
    if R == 0:
        problems = [p for ps in verdict for p in ps]
        warm = rows[1] if len(rows) > 2 else rows[0]
        last = rows[-1]
        if last["rss_mb"] > warm["rss_mb"] + a.slack_mb:
            problems.append(f"RSS grew from {warm['rss_mb']:.1f} MB to {last['rss_mb']:.1f} MB")
        if last["shm_maps"] > warm["shm_maps"]:
            problems.append(
                f"mapped shared-memory segments grew from {warm['shm_maps']} to {last['shm_maps']}"
            )
        if last["fds"] > warm["fds"] + 2:
            problems.append(f"open file descriptors grew from {warm['fds']} to {last['fds']}")
        # /dev/shm is shared with other jobs: a few files of theirs may come and go
        if last["dev_shm_new"] > warm["dev_shm_new"] + a.shm_slack:
            problems.append(
                f"/dev/shm gained {last['dev_shm_new'] - warm['dev_shm_new']} entries between "
                f"iteration {warm['iteration']} and {last['iteration']} (more than --shm-slack "
                f"{a.shm_slack}; other jobs' files are counted too)"
            )
        left = len(shm_after - shm_before)
        print(
            f"# {time.perf_counter() - t0:.1f} s; /dev/shm entries left after hc.free(): {left} "
            "(other jobs' included)",
            flush=True,
        )
        for p in problems:
            print("PROBLEM: " + p, flush=True)
        print("LIFECYCLE: " + ("FAILED" if problems else "ok"), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(
                    {
                        "ranks": P,
                        "node_size": a.node_size,
                        "methods": methods,
                        "rows": rows,
                        "problems": problems,
                    },
                    f,
                    indent=1,
                )
    bad = comm.bcast(bool(problems) if R == 0 else None, root=0)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
