"""``hybridmpi tune``: measure the library's barrier and allreduce on this machine, at this
job's layout, by the C core and by MPI's own calls, and write the tuning table that
``HybridComm`` reads (:mod:`hybridmpi.comm.tuning`).

Both candidates run through the library (two ``HybridComm`` of the same layout, one with
``collectives="core"``, one with ``collectives="mpi"``), in alternating blocks of calls, the
median of the blocks' times (each the slowest rank's) taken; mpi4py's own call (``comm.Barrier``,
``comm.Allreduce``) is timed beside them for reference.  The path is chosen for the layout, not
per size (docs/guide/tuning.md): the one whose times' geometric mean over the calls is lower
(:func:`hybridmpi.comm.tuning.path_of`).  Where a node has more than 3 ranks, the core is timed
with each radix of :func:`radices` (a ``HybridComm`` each) and the radix of the lowest geometric
mean is the table's, and the core's times in it.  On one node of 2 or more ranks, the core's
array allreduce is also timed with the direct allreduce and with the reduce-scatter and
allgather at the per-rank sizes of :data:`GATE_BYTES` (:func:`direct_gate`): the table's
``direct_total`` is the gate of the lowest geometric mean of those times (:func:`gate_of`).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from typing import Any, NamedTuple

import numpy as np

from .._extras import need
from .._native.clib import lib
from ..comm import tuning
from ..comm.hybridcomm import HybridComm

#: allreduce lengths measured, in doubles (1: ``hc.allreduce`` of a Python float)
SIZES = (1, 8, 64, 512, 4096, 32768)
#: seconds one block of calls lasts, about
BLOCK_S = 0.01
#: per-rank bytes at which the direct allreduce is timed against the reduce-scatter and
#: allgather (above recursive doubling's 96 bytes, up to the direct buffer's 16 KiB)
GATE_BYTES = (256, 1024, 4096, 16384)


def arguments(p: Any) -> None:
    p.add_argument("--node-size", type=int, help="ranks per virtual node (the layout to tune)")
    p.add_argument("--reps", type=int, default=9, help="blocks per candidate and call (default 9)")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)),
                   help="allreduce lengths in doubles (1: a Python float)")
    p.add_argument("--output", help="write the table here too (it always goes to the cache)")
    p.add_argument("--plot", help="a PNG figure of the candidates' times")
    p.add_argument("--show", action="store_true",
                   help="print the table this layout takes now, measure nothing")


def radices(per_node: int) -> list[int]:
    """The node tree's radices timed where a node has at most ``per_node`` ranks: 2, 4, 8 and
    16 below the flat tree, and the flat tree (every rank a child of the first); none where
    fewer than two trees differ (up to 3 ranks per node)."""
    flat = min(per_node - 1, lib.HM_MAX_RADIX)
    out = sorted({k for k in (2, 4, 8, 16) if k < flat} | {flat}) if flat >= 2 else []
    return out if len(out) > 1 else []


def _calls(hc: Any, comm: Any, sizes: list[int]) -> list[tuple[str, int, Any, Any]]:
    """(call, bytes, the library's call on ``hc``, mpi4py's) for each call measured."""
    out: list[tuple[str, int, Any, Any]] = [("barrier", 0, lambda h: h.barrier(), comm.Barrier)]
    for n in sizes:
        x, y = np.full(n, 1.0), np.empty(n)
        if n == 1:
            out.append(("allreduce", 8, lambda h: h.allreduce(1.0),
                        lambda x=x, y=y: comm.Allreduce(x, y)))
        else:
            out.append(("Allreduce", 8 * n, lambda h, x=x, y=y: h.Allreduce(x, y),
                        lambda x=x, y=y: comm.Allreduce(x, y)))
    return out


def _block(comm: Any, call: Any, iters: int) -> float:
    """Microseconds per call of ``iters`` calls, the slowest rank's."""
    from mpi4py import MPI

    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    return float(comm.allreduce((time.perf_counter() - t0) / iters * 1e6, op=MPI.MAX))


class Measured(NamedTuple):
    """What :func:`measure` found: the core comm's layout, the rows of a table, the radix
    chosen (None where :func:`radices` gives none: the core's default), the direct allreduce's
    gate (None off one node of 2 or more ranks) and the rows it was chosen from."""

    layout: Any
    rows: list[dict[str, Any]]
    radix: int | None
    direct_total: int | None
    direct_rows: list[dict[str, Any]]


def measure(comm: Any, node_size: int | None, sizes: list[int], reps: int,
            say: Any = print) -> Measured:
    """The rows of a table: each call's median time by the core, by MPI's own call through the
    library, and by mpi4py's call (µs), with what else the table chooses (:class:`Measured`)."""
    core = HybridComm(comm, node_size=node_size, collectives="core")
    comms = {"mpi": HybridComm(comm, node_size=node_size, collectives="mpi")}
    layout = core.layout
    trees = radices(layout.per_node[1])
    try:
        for k in trees:
            comms[f"radix {k}"] = HybridComm(comm, node_size=node_size, collectives="core", radix=k)
        # (with several radices, the core is timed as each of them: one of them is its default)
        rows = [_row(comm, name, nbytes, raw, reps, say,
                     {**({} if trees else {"core": lambda c=call: c(core)}),
                      **{w: lambda c=call, h=h: c(h) for w, h in comms.items()}})
                for name, nbytes, call, raw in _calls(core, comm, sizes)]
        gate: int | None = None
        gate_rows: list[dict[str, Any]] = []
        if layout.nodes == 1 and layout.ranks >= 2:
            gate, gate_rows = direct_gate(comm, core, reps, say)
            say(f"# direct allreduce gate {gate} bytes (node ranks times bytes; the default "
                f"{lib.HM_DIRECT_TOTAL})")
    finally:
        for h in reversed(comms.values()):
            h.free()
        core.free()
    radix = None
    if trees:
        radix = min(trees, key=lambda k: sum(math.log(r["radix_us"][str(k)]) for r in rows))
        for r in rows:
            r["core_us"] = r["radix_us"][str(radix)]
        say(f"# radix {radix} chosen of {trees} (the lowest geometric mean of the core's times)")
    return Measured(layout, rows, radix, gate, gate_rows)


def _iters(us: float) -> int:
    """Calls in a block of about :data:`BLOCK_S` where one call takes ``us`` (3 to 20,000)."""
    return max(3, min(20000, int(BLOCK_S * 1e6 / max(us, 0.05))))


def direct_gate(comm: Any, hc: Any, reps: int, say: Any = print) -> tuple[int, list[dict[str, Any]]]:
    """The direct allreduce's gate for ``hc`` (one node of 2 or more ranks, the core's path):
    ``hc.Allreduce`` timed at each of :data:`GATE_BYTES` per rank with the gate open (the direct
    allreduce) and shut (the reduce-scatter and allgather), in alternating blocks, and the gate
    (node ranks times bytes) of :func:`gate_of`, with the rows timed.  Every rank sets the gate
    alike before each block (``_block`` starts with a barrier).  The comm's own gate is
    restored after."""
    coll, n = hc.context.coll, hc.node_size
    rows: list[dict[str, Any]] = []
    saved = int(coll.direct_total)
    gates = {"direct": lib.HM_DIRECT_TOTAL_MAX, "rsag": 0}
    try:
        for nbytes in GATE_BYTES:
            x, y = np.full(nbytes // 8, 1.0), np.empty(nbytes // 8)

            def call(x: Any = x, y: Any = y) -> None:
                hc.Allreduce(x, y)
            times: dict[str, list[float]] = {k: [] for k in gates}
            iters = 0
            for gate in gates.values():   # warm up, and the block's length
                lib.hm_coll_set_direct_total(coll, gate)
                t1 = _block(comm, call, 3)
                iters = max(iters, _iters(t1))
            for _ in range(reps):
                for k, gate in gates.items():
                    lib.hm_coll_set_direct_total(coll, gate)
                    times[k].append(_block(comm, call, iters))
            med = {k: statistics.median(v) for k, v in times.items()}
            rows.append({"bytes": nbytes, "direct_us": med["direct"], "rsag_us": med["rsag"]})
            say(f"# direct allreduce {nbytes:>6d} B a rank: direct {med['direct']:9.3f} us, "
                f"reduce-scatter and allgather {med['rsag']:9.3f} us")
    finally:
        lib.hm_coll_set_direct_total(coll, saved)
    return gate_of(rows, n), rows


def gate_of(rows: list[dict[str, Any]], per_node: int) -> int:
    """The direct allreduce's gate from :func:`direct_gate`'s rows (by size): of the gates that
    split the sizes (0, and ``per_node`` times each size), the one whose times have the lowest
    geometric mean (the direct allreduce's at the sizes it lets through, the reduce-scatter's
    above), the smaller on a tie; a single size's noise moves it one size at most."""
    def cost(k: int) -> float:
        return sum(math.log(r["direct_us"] if i < k else r["rsag_us"]) for i, r in enumerate(rows))
    best = min(range(len(rows) + 1), key=lambda k: (cost(k), k))
    return per_node * rows[best - 1]["bytes"] if best else 0


def _row(comm: Any, name: str, nbytes: int, raw: Any, reps: int, say: Any,
         lib_calls: dict[str, Any]) -> dict[str, Any]:
    """One call's row: its median time by each of ``lib_calls`` (the core, MPI's call through
    the library, the core with each radix) and by mpi4py's ``raw``, in alternating blocks."""
    cands = {**lib_calls, "MPI": raw}
    for f in cands.values():   # warm up: MPICH switches its shared-memory paths on
        for _ in range(20):
            f()
    first = next(k for k in cands if k != "mpi")   # the core, or its first radix
    t1 = _block(comm, cands[first], 3) + _block(comm, cands["mpi"], 3)
    iters = _iters(t1 / 2)
    times: dict[str, list[float]] = {k: [] for k in cands}
    for _ in range(reps):   # alternating blocks
        for k, f in cands.items():
            times[k].append(_block(comm, f, iters))
    med = {k: statistics.median(v) for k, v in times.items()}
    trees = {k.split()[1]: v for k, v in med.items() if k.startswith("radix ")}
    row: dict[str, Any] = {"call": name, "bytes": nbytes, "iters": iters,
                           "core_us": med.get("core", min(trees.values(), default=0.0)),
                           "mpi_us": med["mpi"], "MPI_us": med["MPI"]}
    if trees:
        row["radix_us"] = trees
    say(f"# {name:9s} {nbytes:>8d} B: core {row['core_us']:9.3f} us, MPI's call through "
        f"the library {row['mpi_us']:9.3f} us, mpi4py's {row['MPI_us']:9.3f} us"
        + "".join(f", radix {k} {v:.3f}" for k, v in trees.items()))
    return row


def print_table(t: dict[str, Any], where: str, out: Any = None) -> None:
    out = out or sys.stdout
    k = t["key"]
    print(f"# tuning table {where}", file=out)
    print(f"# host {k['host']}; {k['mpi']}, thread level {k['thread_level']}; {t['layout']}",
          file=out)
    tree = f"; the core's node tree of radix {t['radix']}" if t.get("radix") else ""
    if t.get("direct_total") is not None:
        tree += f"; the direct allreduce to {t['direct_total']} bytes over the node's ranks"
    print(f"# path chosen: {t['path']}{tree} (made by {t.get('made_by', 'hybridmpi tune')} "
          f"{t['created']} in {t['seconds']} s)", file=out)
    print(f"{'# call':<12}{'bytes':>9}{'core us':>11}{'mpi us':>11}{'mpi4py us':>11}"
          f"{'chosen':>8}{'vs best':>9}{'vs mpi4py':>11}", file=out)
    for r in t["rows"]:
        mpi4py = r.get("MPI_us")   # (a calibration does not time mpi4py's call)
        print(f"{r['call']:<12}{r['bytes']:>9}{r['core_us']:>11.3f}{r['mpi_us']:>11.3f}"
              f"{mpi4py or float('nan'):>11.3f}{t['path']:>8}{r['chosen_us'] / r['best_us']:>9.2f}"
              f"{r['chosen_us'] / mpi4py if mpi4py else float('nan'):>11.2f}", file=out)


def plot(t: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = t["rows"]
    labels = [f"{r['call']}\n{r['bytes']} B" for r in rows]
    xs = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, (key, name) in enumerate((("core_us", "the C core"), ("mpi_us", "MPI's call (library)"),
                                     ("MPI_us", "mpi4py's call"))):
        ax.bar(xs + (i - 1) * 0.27, [r[key] for r in rows], 0.27, label=name)
    ax.set_xticks(xs, labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("time per call (us)")
    ax.set_title(f"{t['layout']}: path {t['path']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: Any) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    sizes = [int(s) for s in str(args.sizes).split(",") if s.strip()]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--sizes must be lengths >= 1, got {args.sizes!r}")
    if args.reps < 1:
        raise ValueError(f"--reps must be >= 1, got {args.reps}")
    if args.plot:
        need("matplotlib", "'hybridmpi tune --plot'")
    say = print if comm.rank == 0 else (lambda *_a, **_k: None)
    if args.show:
        hc = HybridComm(comm, node_size=args.node_size)
        where, path, source = None, hc.collective_path, hc.tuning
        if source.startswith("table "):
            where = source[len("table "):]
        hc.free()
        if comm.rank == 0:
            print(f"# this layout takes the {path} path: {source}")
            if where:
                print_table(tuning.read(where), where)
        return
    t0 = time.perf_counter()
    say(f"# hybridmpi tune: {comm.size} ranks, {len(sizes) + 1} calls, {args.reps} blocks each "
        "of the core, MPI's call and mpi4py's, alternating")
    m = measure(comm, args.node_size, sizes, args.reps, say)
    from .. import __version__

    t = tuning.make_table(MPI, m.layout, m.rows, time.perf_counter() - t0, "hybridmpi tune",
                          __version__, radix=m.radix, direct_total=m.direct_total)
    if m.direct_rows:
        t["direct_rows"] = m.direct_rows
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)   # each host writes it to its own cache
    where = tuning.write(t) if local.Get_rank() == 0 else None
    local.Free()
    if comm.rank == 0:
        print_table(t, str(where))
        if args.output:
            print(f"# wrote {tuning.write(t, args.output)}")
        if args.plot:
            plot(t, args.plot)
            print(f"# wrote {args.plot}")
    comm.Barrier()
