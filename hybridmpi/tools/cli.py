"""The ``hybridmpi`` command (also ``python -m hybridmpi``).

Bad arguments give one line on stderr and exit code 2, never a traceback; a missing optional
dependency gives one line naming the extra to install, and exit code 3.  An error on any
rank of an MPI job ends the whole job (``MPI_Abort``), whenever it happens: the guard is in
place before anything that can fail, imports and argument parsing included.
"""

import argparse
import contextlib
import hashlib
import io
import json
import os
import shlex
import sys
import time
import traceback

from .. import __version__, settings
from .._extras import MissingExtra, need
from .._jobs import abort_job, world
from ..settings import launched
from .pmpi import PMPIError

#: seconds the ranks of an MPI job wait for each other to compare their command lines (env
#: HYBRIDMPI_TIMEOUT when set): a rank that runs another program, or none, ends the job then
_AGREE_S = 60.0
#: the numeric options of the benchmarks that may be 0 (the others, and any whose default is 0
#: "chosen by size", must be >= 1; floats >= 0)
_ZERO_OK = ("warmup",)
#: seconds a rank other than 0 waits before printing an argument error and aborting: when
#: every rank got the same arguments, rank 0 ends the job meanwhile and the line shows once
_ONCE_S = 1.0
#: errors in the input of a command (a missing file, a bad value): one line, no traceback
_INPUT_ERRORS = (ValueError, FileNotFoundError, OSError)
#: exit code when an optional dependency is missing (the line names the extra to install)
_MISSING_EXTRA = 3
_MESH = ("meshio", "gmsh", "pymetis")
#: the optional modules each command needs, checked on every rank before it starts (so
#: that the demo does not find a missing matplotlib only after its measurements)
_NEEDS = {"mesh": _MESH, "partition": _MESH, "solve": _MESH + ("scipy",),
          "demo": _MESH + ("matplotlib",), "plot": ("matplotlib",),
          "bench mesh": _MESH, "bench cg": _MESH + ("scipy",)}

_STATS = [
    ("owned", "owned points"),
    ("ghosts", "ghost points"),
    ("points", "points (owned + ghosts)"),
    ("neighbors", "neighbors"),
    ("data_kb", "data exchanged (kB)"),
    ("intra_neighbors", "intranode neighbors"),
    ("intra_kb", "intranode data (kB)"),
    ("inter_processes", "processes with internode neighbors, per node"),
    ("inter_neighbors", "internode neighbors"),
    ("inter_kb", "internode data (kB)"),
]


#: MPI thread levels a benchmark may ask for (``--thread-level``; mpi4py's ``rc.thread_level``)
_THREAD_LEVELS = ("single", "funneled", "serialized", "multiple")
#: the benchmarks' default: each MPI at its fastest setting (MPICH turns its shared-memory barrier
#: and allreduce off at "multiple", mpi4py's default; Open MPI and Intel MPI time the same)
_BENCH_THREAD_LEVEL = "funneled"


def _thread_level(argv):
    """The thread level to start MPI with: ``--thread-level`` of a ``bench`` or ``demo``
    command line (its default there), None otherwise (mpi4py's default).  Read before
    argparse runs, since MPI starts first."""
    if not argv or argv[0] not in ("bench", "demo", "tune"):
        return None
    for i, word in enumerate(argv):
        value = argv[i + 1] if word == "--thread-level" and i + 1 < len(argv) else \
            word.partition("=")[2] if word.startswith("--thread-level=") else None
        if value is not None:
            return value if value in _THREAD_LEVELS else None  # argparse reports a bad one
    # tune: the level the programs it tunes for start with (mpi4py's default, unless asked)
    return _BENCH_THREAD_LEVEL if argv[0] != "tune" else None


class _BadArguments(Exception):
    """An argument error: its one line, for :func:`main` to print."""


class _Mismatch(Exception):
    """The ranks of an MPI job were launched with different command lines: its one line, which
    every rank prints before it exits with code 2 (every rank knows it: no abort)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _BadArguments(f"{self.prog}: error: {message}\n")


def _positive_float(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return v


def _positive_int(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return v


def _at_least(convert, least):
    """``convert`` (int or float), refusing values below ``least`` as argparse refuses a bad
    value: one line, exit code 2."""
    def check(text):
        v = convert(text)
        if v < least:
            raise argparse.ArgumentTypeError(f"must be >= {least}, got {text}")
        return v
    check.__name__ = convert.__name__  # argparse names it in "invalid int value"
    return check


class _BenchParser(_Parser):
    """A benchmark's parser: its int and float options are bounded (``--iters -3`` printed
    negative times, ``--iters 0`` a ZeroDivisionError traceback)."""

    def add_argument(self, *names, **kwargs):
        convert = kwargs.get("type")
        if convert in (int, float):
            zero_ok = (convert is float or kwargs.get("default") == 0
                       or any(n.lstrip("-").replace("-", "_") in _ZERO_OK for n in names))
            kwargs["type"] = _at_least(convert, 0 if zero_ok else 1)
        return super().add_argument(*names, **kwargs)


def _agree_seconds():
    return settings.timeout() or _AGREE_S


def _agree_command_line(argv, failure):
    """Under MPI with several ranks: check, on MPI_COMM_WORLD and before anything collective,
    that every rank has the same command line (an MPMD launch can give each its own).

    A nonblocking allgather of a digest of ``argv``, polled under a deadline, so that a rank
    launched with another program (or a ``--help`` that exits at once) cannot leave the
    others waiting.

    Raises:
        _Mismatch: the command lines differ (on every rank; a rank whose own parse failed,
            ``failure``, names its own error).
        _BadArguments: not every rank joined before the deadline (the job is aborted).
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    mine = hashlib.sha256(json.dumps(argv).encode()).digest()
    every = bytearray(len(mine) * size)
    req = comm.Iallgather([mine, MPI.BYTE], [every, MPI.BYTE])
    wait = _agree_seconds()
    deadline = time.monotonic() + wait
    while not req.Test():
        if time.monotonic() > deadline:
            raise _BadArguments(f"hybridmpi: error on rank {rank}: not every rank came to compare "
                                f"command lines within {wait:g} s (a rank runs another program?)\n")
        time.sleep(0.001)
    digests = [bytes(every[i * len(mine):(i + 1) * len(mine)]) for i in range(size)]
    differ = [r for r, d in enumerate(digests) if d != digests[0]]
    if not differ:
        return
    if isinstance(failure, _BadArguments):
        raise _Mismatch(str(failure))
    raise _Mismatch(f"hybridmpi: error on rank {rank}: the ranks were launched with different "
                    f"command lines (ranks {differ} differ from rank 0's; this rank has "
                    f"{shlex.join(['hybridmpi', *argv])!r}); give every rank the same\n")


def _load(args):
    from . import mesh

    if args.mesh:
        return mesh.load(args.mesh), args.mesh
    return mesh.cube(args.h, cache_dir=args.cache_dir), f"unit cube, h = {args.h:g}"


def cmd_mesh(args):
    t0 = time.perf_counter()
    m, what = _load(args)
    print(f"{what}: {len(m.points)} points, {len(m.cells[0].data)} tetrahedra "
          f"({time.perf_counter() - t0:.2f} s)")


def cmd_partition(args):
    from . import mesh

    m, what = _load(args)
    t0 = time.perf_counter()
    part = mesh.partition(m, args.parts, node_size=args.node_size, seed=args.seed)
    elapsed = time.perf_counter() - t0
    stats = mesh.partition_stats(m, part, node_size=args.node_size, block=args.block)
    if args.json:
        json.dump({"mesh": what, "points": len(m.points), "parts": args.parts,
                   "node_size": args.node_size, "block": args.block, "seed": args.seed,
                   "partition_s": elapsed, "stats": stats}, sys.stdout, indent=1)
        print()
        return
    print(f"# {what}: {len(m.points)} points, {len(m.cells[0].data)} tetrahedra")
    print(f"# {args.parts} parts" + (f", {args.parts // args.node_size} nodes of {args.node_size}"
                                      if args.node_size else "")
          + f" (METIS, seed {args.seed}, {elapsed:.2f} s); means per process, {args.block} "
          "values of 8 bytes per point")
    for key, label in _STATS:
        if key in stats:
            print(f"{label:<48}{stats[key]:>10.2f}")


def _mpi_job(args, body):
    """Run ``body(hc, comm)`` on MPI.COMM_WORLD with a HybridComm, freed after."""
    from mpi4py import MPI

    from .._threads import limit_blas_threads
    from ..comm.hybridcomm import HybridComm

    limit_blas_threads(1)
    comm = MPI.COMM_WORLD
    hc = HybridComm(comm, node_size=args.node_size)
    # freed only after success: freeing is collective, and after an error on one rank the
    # command aborts the job (main) rather than wait there for the others
    result = body(hc, comm)
    hc.free()
    return result


def cmd_bench(args):

    from .bench import KINDS, print_table, set_ratios, write_json

    _, run, extra, _ = KINDS[args.kind]

    def body(hc, comm):
        doc = run(hc, comm, args)
        set_ratios(doc)
        if comm.rank == 0:
            print_table(doc, extra)
            if args.json:
                folder = os.path.dirname(args.json)
                if folder:
                    os.makedirs(folder, exist_ok=True)
                write_json(doc, args.json)
                print(f"# wrote {args.json}")

    _mpi_job(args, body)


def cmd_plot(args):

    from .plot import plot

    for path in args.results:
        for png in plot(path, args.output or os.path.dirname(os.path.abspath(path))):
            print(png)


def cmd_demo(args):
    from . import demo

    def body(hc, comm):
        doc = demo.run(hc, comm, args)
        if comm.rank == 0:
            demo.report(doc, args.output)

    _mpi_job(args, body)


def cmd_solve(args):
    from .fem import solve

    def body(hc, comm):
        r = solve.run(hc, args.h, method=args.method, tol=args.tol, vtu=args.vtu, mesh_file=args.mesh)
        if comm.rank == 0:
            solve.report(r)
            if args.vtu:
                print(f"# wrote {args.vtu}")

    _mpi_job(args, body)


def cmd_tune(args):
    from .tune import run

    run(args)


def cmd_pmpi(args):
    from .pmpi import library

    log = (lambda line: print(line, file=sys.stderr)) if args.verbose else None
    print(library(args.mpicc, rebuild=args.rebuild, log=log))


def _tune_parser(sub):
    """``hybridmpi tune``."""
    from .tune import arguments

    q = sub.add_parser("tune", help="measure barrier and allreduce by the C core and by MPI's own "
                       "calls at this job's layout and write the tuning table (run under mpiexec)")
    arguments(q)
    q.add_argument("--thread-level", choices=_THREAD_LEVELS,
                   help="MPI thread level, as the programs to tune start MPI (default: mpi4py's, "
                   "multiple); part of the table's key")
    q.set_defaults(func=cmd_tune)


def _pmpi_parser(sub):
    """``hybridmpi pmpi path``."""
    q = sub.add_parser("pmpi", help="the PMPI library: the core's barrier, allreduce and "
                       "neighbourhood collectives under unchanged C, C++ and Fortran programs "
                       "(docs/guide/pmpi.md)")
    acts = q.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    acts.required = True
    k = acts.add_parser("path", help="print the library's path for mpi4py's MPI (or --mpicc's), "
                        "building it first if needed",
                        description="Print the path of the PMPI library for the MPI that mpi4py "
                        "uses, or for the one whose compiler wrapper --mpicc names; builds it first "
                        "if needed.  Use: mpiexec -n 4 -genv LD_PRELOAD $(hybridmpi pmpi path) ./app "
                        "(MPICH, Intel MPI) or mpiexec -x LD_PRELOAD=$(hybridmpi pmpi path) ./app "
                        "(Open MPI).")
    k.add_argument("--mpicc", help="the MPI's C compiler wrapper (default: one of mpi4py's MPI)")
    k.add_argument("--rebuild", action="store_true", help="build again even if a build exists")
    k.add_argument("--verbose", action="store_true", help="print the compile line on stderr")
    k.set_defaults(func=cmd_pmpi)


def parser():
    p = _Parser(prog="hybridmpi", description="Ghost updates, barriers and reductions over "
                "MPI-3 shared memory: tools and benchmarks.")
    p.add_argument("--version", action="version", version=f"hybridmpi {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def thread_level_argument(q):
        q.add_argument("--thread-level", choices=_THREAD_LEVELS, default=_BENCH_THREAD_LEVEL,
                       help="MPI thread level asked for (default funneled: each MPI at its fastest; "
                       "mpi4py's own default, multiple, turns MPICH's shared-memory collectives off)")

    def mesh_args(q):
        src = q.add_mutually_exclusive_group()
        src.add_argument("--h", type=_positive_float, default=0.05,
                         help="characteristic length of the cube mesh (default 0.05)")
        src.add_argument("--mesh", help="read this mesh file instead (any format meshio reads)")
        q.add_argument("--cache-dir", help="folder of generated meshes")

    q = sub.add_parser("mesh", help="generate (or read) the cube mesh and report its size")
    mesh_args(q)
    q.set_defaults(func=cmd_mesh)

    q = sub.add_parser("partition", help="partition a mesh with METIS and print its statistics")
    mesh_args(q)
    q.add_argument("--parts", type=_positive_int, required=True, help="number of parts (ranks)")
    q.add_argument("--node-size", type=_positive_int, help="ranks per node (two-level partition)")
    q.add_argument("--block", type=_positive_int, default=3, help="values per point (default 3)")
    q.add_argument("--seed", type=int, default=0, help="METIS seed")
    q.add_argument("--json", action="store_true", help="print JSON instead of the table")
    q.set_defaults(func=cmd_partition)

    from .bench import KINDS

    q = sub.add_parser("bench", help="the paper's benchmarks (run under mpiexec)")
    kinds = q.add_subparsers(dest="kind", metavar="KIND", parser_class=_BenchParser)
    kinds.required = True
    for kind, (arguments, _, _, about) in KINDS.items():
        k = kinds.add_parser(kind, help=about, description=about)
        arguments(k)
        k.add_argument("--node-size", type=_positive_int, help="ranks per virtual node")
        k.add_argument("--json", default=f"hybridmpi-results/bench-{kind}.json",
                       help="output file ('' for none)")
        thread_level_argument(k)
        k.set_defaults(func=cmd_bench)

    from .baselines import METHODS

    q = sub.add_parser("solve", help="P1 Poisson with conjugate gradients on the cube (run under mpiexec)")
    src = q.add_mutually_exclusive_group()
    src.add_argument("--h", type=_positive_float, default=0.05, help="cube mesh (default 0.05)")
    src.add_argument("--mesh", help="solve on this mesh file instead (any format meshio reads, "
                     "tetrahedra; u = g on its surface)")
    q.add_argument("--method", choices=list(METHODS), default="atomic", help="Halo method")
    q.add_argument("--tol", type=float, default=1e-10, help="relative residual (default 1e-10)")
    q.add_argument("--node-size", type=_positive_int, help="ranks per virtual node")
    q.add_argument("--vtu", help="write the solution to this VTU file (ParaView)")
    q.set_defaults(func=cmd_solve)

    q = sub.add_parser("plot", help="PNG figures from result JSON files")
    q.add_argument("results", nargs="+", help="JSON files written by bench or demo")
    q.add_argument("-o", "--output", help="folder for the figures (default: next to each file)")
    q.set_defaults(func=cmd_plot)

    _pmpi_parser(sub)
    _tune_parser(sub)

    q = sub.add_parser("demo", help="ghost update and collectives vs MPI on the shipped mesh "
                       "(run under mpiexec -n N)")
    src = q.add_mutually_exclusive_group()
    src.add_argument("--h", type=_positive_float, default=0.05, help="cube mesh (default 0.05, shipped)")
    src.add_argument("--mesh", help="time the ghost update on this mesh file instead (any format "
                     "meshio reads, tetrahedra)")
    q.add_argument("--iters", type=_positive_int, default=1000, help="calls per repetition")
    q.add_argument("--reps", type=_positive_int, default=10, help="repetitions")
    q.add_argument("--node-size", type=_positive_int, help="ranks per virtual node")
    q.add_argument("-o", "--output", default="hybridmpi-results", help="output folder")
    thread_level_argument(q)
    q.set_defaults(func=cmd_demo)
    return p


def _quit(code, text, wait=0.0):
    """Print ``text`` and end the job with ``code`` (MPI_Abort when several ranks run)."""
    abort_job(code, None, message=text, wait=wait)
    sys.stderr.write(text)  # alone: no job to abort
    return code


def main(argv=None):
    """Run the command ``hybridmpi ARGV`` (default ``sys.argv[1:]``); return the exit code.

    Under a launcher with several ranks, MPI is started first (every rank gets there: this
    module imports only the standard library), so that an error on one rank, in an import or
    in the arguments too, prints and aborts the job instead of leaving the others waiting.
    """
    args = None
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        level = _thread_level(argv)
        if level is not None:  # before MPI starts
            import mpi4py

            mpi4py.rc.thread_level = level
        several = launched()[1] > 1
        if several:
            from mpi4py import MPI  # noqa: F401 -- starts MPI before anything can fail
        # every rank parses, its output (--help, --version) held back until the ranks agree
        held, failure = io.StringIO(), None
        try:
            with contextlib.redirect_stdout(held):
                args = parser().parse_args(argv)
        except (_BadArguments, SystemExit) as e:
            failure = e
        if several:
            _agree_command_line(argv, failure)
        sys.stdout.write(held.getvalue())
        if failure is not None:
            raise failure
        if level is not None and getattr(args, "thread_level", level) != level:
            # an abbreviation or a repeated option: MPI already started at another level
            raise _BadArguments(f"hybridmpi {args.command}: error: give --thread-level once and in "
                                f"full (MPI started at {level!r}, the arguments ask for "
                                f"{args.thread_level!r})\n")
        command = " ".join(filter(None, (args.command, getattr(args, "kind", None))))
        for module in _NEEDS.get(command, ()):
            need(module, f"'hybridmpi {command}'")
        args.func(args)
    except _Mismatch as e:  # every rank found it: each prints its line and exits 2
        sys.stderr.write(str(e))
        return 2
    except _BadArguments as e:
        return _quit(2, str(e), wait=_ONCE_S)
    except PMPIError as e:  # no wrapper, or the build failed: what and why, no traceback
        return _quit(1, f"hybridmpi pmpi: error: {e}\n")
    except MissingExtra as e:  # every rank lacks it, or this one alone: one line, no traceback
        return _quit(_MISSING_EXTRA, f"{e}\n", wait=_ONCE_S)
    except SystemExit as e:  # --help and --version (0), or a command's own exit
        if e.code not in (None, 0):
            abort_job(e.code if isinstance(e.code, int) else 1, None)
        raise
    except BaseException as e:
        if args is not None and isinstance(e, _INPUT_ERRORS):
            rank = (world() or (0, 1))[0]
            return _quit(2, f"hybridmpi {args.command}: error on rank {rank}: {e}\n")
        # the failing rank's traceback, then the job ends within seconds (alone: Python
        # prints the traceback)
        abort_job(1, traceback.format_exc())
        raise
    return 0
