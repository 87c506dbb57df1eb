"""The cost model of docs/guide/cost-model.md: each candidate's predicted time at 16-128 ranks on
one node, from parameters fitted to measurements (a model, not a measurement).

    python scripts/cost_model.py
"""
import math

# parameters (docs/guide/cost-model.md)
h = 0.27      # us per round of signals (Xeon fit: dissemination barrier 0.60/0.85/1.14 us at 4/8/16)
o = 0.06      # us, its intercept
oc = 0.30     # us, a Python call's share (hc.allreduce of a float at 2 ranks here: 0.59 us)
tl = 0.05     # us per cache line a rank reads from another core beyond the first, in parallel
B = 1.9e3     # bytes per us a rank reads and combines from another core's buffer (fit here)
mpi_a, mpi_b = 1.66, 0.135   # MPICH barrier: a + b * log2 p (Xeon fit)
Bm = 1.3e3    # bytes per us, MPI's allreduce slope here (0.76 ns/B)
def lg(p, k=2): return math.ceil(math.log(p, k) - 1e-9)
def lines(m): return max(1, math.ceil(m / 64))
def barrier_core(p): return o + h * lg(p)
def barrier_mpi(p): return mpi_a + mpi_b * lg(p)
def rd(p, m): return oc + lg(p) * (h + tl * (lines(m) - 1))
def direct(p, m): return oc + h + (p - 1) * tl * lines(m) + p * m / B
def tree(p, m, k=4): L = lg(p, k); return oc + 2 * L * h + L * k * m / B + L * m / B
def rsag(p, m): return oc + 2 * h + 2 * (p - 1) * tl * max(1, lines(m / p)) / 4 + 2 * m / B
def mpi(p, m): return mpi_a + 2 * mpi_b * lg(p) + 2 * m / Bm
print("| ranks | barrier: core / MPI | 8 B: rd / direct / tree / rs+ag / MPI | 2 KiB: direct / tree / rs+ag / MPI | 128 KiB: tree / rs+ag / MPI |")
print("| --- | --- | --- | --- | --- |")
for p in (16, 32, 64, 128):
    row = [f"{barrier_core(p):.2f} / {barrier_mpi(p):.2f}"]
    m = 8; row.append(" / ".join(f"{f(p, m):.1f}" for f in (rd, direct, tree, rsag, mpi)))
    m = 2048; row.append(" / ".join(f"{f(p, m):.1f}" for f in (direct, tree, rsag, mpi)))
    m = 131072; row.append(" / ".join(f"{f(p, m):.0f}" for f in (tree, rsag, mpi)))
    print(f"| {p} | " + " | ".join(row) + " |")
