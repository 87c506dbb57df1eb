"""The cost model of docs/guide/cost-model.md: each candidate's predicted time at 16-128 ranks on
one node, from parameters fitted to measurements (a model, not a measurement).

    python scripts/cost_model.py
"""

import math

H = 0.27      # us per round of signals (16-core fit: dissemination barrier 0.60/0.85/1.14 us at 4/8/16)
FIXED = 0.06     # us, that fit's intercept
CALL = 0.30   # us, a Python call's share (hc.allreduce of a float at 2 ranks here: 0.59 us)
LINE = 0.05   # us per further cache line a rank reads from other cores, two loads in flight
B = 1.9e3     # bytes per us a rank reads and combines from another core's buffer (fit here)
MPI_A, MPI_B = 1.66, 0.135   # MPICH's barrier: MPI_A + MPI_B * log2 p (16-core fit)
B_MPI = 1.3e3  # bytes per us, MPICH's allreduce slope here (0.76 ns a byte)


def lg(p, k=2):
    return math.ceil(math.log(p, k) - 1e-9)


def lines(m):
    return max(1, math.ceil(m / 64))


def barrier_core(p):
    return FIXED + H * lg(p)


def barrier_mpi(p):
    return MPI_A + MPI_B * lg(p)


def recursive_doubling(p, m):
    return CALL + lg(p) * (H + LINE * (lines(m) - 1))


def direct(p, m):
    return CALL + H + (p - 1) * LINE * lines(m) + p * m / B


def tree(p, m, k=4):
    levels = lg(p, k)
    return CALL + 2 * levels * H + levels * k * m / B + levels * m / B


def reduce_scatter_allgather(p, m):
    return CALL + 2 * H + 2 * (p - 1) * LINE * lines(m / p) / 4 + 2 * m / B


def mpi(p, m):
    return MPI_A + 2 * MPI_B * lg(p) + 2 * m / B_MPI


def main():
    print("| ranks | barrier: core / MPI | 8 B: rd / direct / tree / rs+ag / MPI "
          "| 2 KiB: direct / tree / rs+ag / MPI | 128 KiB: tree / rs+ag / MPI |")
    print("| --- | --- | --- | --- | --- |")
    for p in (16, 32, 64, 128):
        row = [f"{barrier_core(p):.2f} / {barrier_mpi(p):.2f}"]
        row.append(" / ".join(f"{f(p, 8):.1f}" for f in (recursive_doubling, direct, tree,
                                                           reduce_scatter_allgather, mpi)))
        row.append(" / ".join(f"{f(p, 2048):.1f}" for f in (direct, tree, reduce_scatter_allgather, mpi)))
        row.append(" / ".join(f"{f(p, 131072):.0f}" for f in (tree, reduce_scatter_allgather, mpi)))
        print(f"| {p} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
