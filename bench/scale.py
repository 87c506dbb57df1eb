"""The scaling benchmark: the core's calls against each MPI at 2 to 16 ranks on one node, in one run.

    python bench/scale.py [--venv DIR ...] [--ranks 2,4,8,16] [--levels funneled,multiple]
                          [--imb PATH] [--mesh meshes/cube-h0.05.vtu] [--out DIR] [--quick]

For each environment (``--venv``: a Python environment with hybridmpi and mpi4py for one MPI;
default this one), thread level and rank count it runs, with that environment's ``mpiexec``:

- ``hybridmpi bench barrier`` and ``bench allreduce --sizes 1,8,32,256,2048`` (hybridmpi's calls
  and the MPI's, timed in the same run; every level in ``--levels``: ``multiple`` is mpi4py's
  default, where MPICH's own shared-memory collectives are off);
- ``hybridmpi bench ghost --mesh MESH --methods atomic,flat,neighbor`` (the mesh partitioned by
  METIS for the job's ranks: ``atomic`` against ``MPI_Neighbor_alltoallv``, first level only);
- with ``--imb`` (Intel MPI's ``IMB-MPI1``, shipped with ``impi-rt``): ``IMB-MPI1 Allreduce``
  from 4 bytes to 4 KiB without and with the PMPI library (``hybridmpi pmpi path``).

It writes every benchmark's JSON under ``--out`` (default ``hybridmpi-results/scale``), then
``scale.json`` (one row per call, size, MPI, level and rank count: hybridmpi's median time, the
MPI's, their ratio) and ``scale.png`` (time against ranks, one panel per call and size, the MPI
dashed), and prints the table.  ``--quick`` shortens every loop (a check that the run works,
not a measurement).  Run it alone on the machine; ``machine`` in the JSON describes it (CPU
model, cores, NUMA nodes, the MPIs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # this tree's hybridmpi.tools.plot, for the labels and colours
from hybridmpi.tools.plot import color, mpi_label  # noqa: E402

SIZES = "1,8,32,256,2048"
#: the bench subcommands' own baselines, by kind
BASELINES = {"barrier": "MPI_Barrier", "allreduce": "MPI_Allreduce", "ghost": "neighbor"}
#: the hybridmpi series reported for each kind (the bench's other series stay in its JSON)
OURS = {"barrier": ["default (hc.barrier())", "drop-in barrier(comm)"],
        "allreduce": ["acq_rel", "hc.allreduce(x)", "drop-in allreduce"],
        "ghost": ["atomic", "flat"]}


#: the bench's series names, in the figure
NAMES = {("allreduce", "acq_rel"): "hc.Allreduce (a float: hc.allreduce)",
         ("barrier", "default (hc.barrier())"): "hc.barrier()"}


def machine() -> dict:
    """CPU model, cores and NUMA nodes, from Linux's /proc and /sys."""
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                  if line.startswith("model name")), platform.processor())
    nodes = sorted(p.name for p in Path("/sys/devices/system/node").glob("node[0-9]*"))
    return {"cpu": model, "cores": os.cpu_count(), "numa_nodes": len(nodes) or 1,
            "kernel": platform.release(), "python": platform.python_version()}


def mpi_of(venv: Path) -> dict:
    python = venv / "bin" / "python"
    code = ("from mpi4py import MPI; from hybridmpi.tools import pmpi; t = pmpi.target(); "
            "print(MPI.Get_library_version().splitlines()[0].strip()); print(t.family); "
            "print(t.libmpi); print(pmpi.library())")
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT))).stdout.splitlines()
    mpiexec = venv / "bin" / "mpiexec"
    return {"venv": str(venv), "python": str(python), "mpi": mpi_label(out[0]), "family": out[1],
            "libmpi": out[2], "pmpi": out[3], "mpiexec": str(mpiexec) if mpiexec.exists() else "mpiexec"}


def launch(mpi: dict, ranks: int, argv: list[str], env: dict | None = None, timeout: int = 600) -> str:
    e = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
             OPENBLAS_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    e.update(env or {})
    cmd = [mpi["mpiexec"], "-n", str(ranks)]
    if mpi["family"] == "openmpi":
        cmd += ["--oversubscribe", "--bind-to", "core" if ranks <= (os.cpu_count() or 1) else "none"]
        for k in (env or {}):
            cmd += ["-x", k]
    p = subprocess.run(cmd + argv, env=e, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd + argv)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n"
                         f"{p.stderr[-3000:]}")
    return p.stdout


def bench_rows(doc: dict, kind: str, mpi: dict, level: str, ranks: int) -> list[dict]:
    """One row per hybridmpi series and x of a bench JSON, against the run's baseline."""
    med = {}
    for r in doc["results"]:
        med[(r["series"], r["x"])] = statistics.median(r["samples"])
    base_name = BASELINES[kind]
    rows = []
    for (series, x), t in med.items():
        base = med.get((base_name, x))
        if series in OURS[kind] and base:
            if kind == "ghost":
                x = Path(str(x)).name
            rows.append({"kind": kind, "series": series, "x": x, "mpi": mpi["mpi"],
                         "family": mpi["family"], "level": level, "ranks": ranks, "us": t,
                         "mpi_us": base, "ratio": t / base})
    return rows


def imb_rows(mpi: dict, ranks: int, imb: str, iters: int) -> list[dict]:
    """IMB-MPI1 Allreduce from 4 bytes to 4 KiB, without and with the PMPI library."""
    env = {"LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(Path(mpi["libmpi"]).parent),
                                                          os.environ.get("LD_LIBRARY_PATH")]))}
    got = {}
    for with_lib in (False, True):
        e = dict(env, LD_PRELOAD=mpi["pmpi"]) if with_lib else dict(env)
        out = launch(mpi, ranks, [imb, "-npmin", str(ranks), "-iter", str(iters), "-msglog", "2:12",
                                  "-time", "5", "Allreduce"], env=e)
        got[with_lib] = {int(b): float(t) for b, t in
                         re.findall(r"^\s+(\d+)\s+\d+\s+[\d.]+\s+[\d.]+\s+([\d.]+)", out, re.M)}
    return [{"kind": "imb-allreduce", "series": "PMPI library", "x": b, "mpi": mpi["mpi"],
             "family": mpi["family"], "level": "single", "ranks": ranks, "us": got[True][b],
             "mpi_us": t, "ratio": got[True][b] / t} for b, t in sorted(got[False].items())
            if b in got[True] and t > 0]


def figure(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["kind"], r["x"]) for r in rows if r["kind"] in ("barrier", "allreduce")})
    if not panels:
        return
    cols = min(3, len(panels))
    fig, axes = plt.subplots((len(panels) + cols - 1) // cols, cols, squeeze=False,
                             figsize=(5 * cols, 3.6 * ((len(panels) + cols - 1) // cols)))
    for ax, (kind, x) in zip(axes.flat, panels):
        mine = [r for r in rows if r["kind"] == kind and r["x"] == x]
        for key in sorted({(r["series"], r["mpi"], r["level"]) for r in mine}):
            pts = sorted((r["ranks"], r["us"], r["mpi_us"]) for r in mine
                         if (r["series"], r["mpi"], r["level"]) == key)
            name = NAMES.get((kind, key[0]), key[0])
            label = f"{name} ({key[1].split()[0]} {key[2]})"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label,
                    color=color(label))
            if key[0] in (OURS[kind][0],):   # the MPI's own call, once per MPI and level
                ax.plot([p[0] for p in pts], [p[2] for p in pts], linestyle="--", marker="x",
                        label=f"{BASELINES[kind]} ({key[1].split()[0]} {key[2]})",
                        color=color(f"MPI {key[1]} {key[2]}"))
        ax.set_title("barrier" if kind == "barrier" else
                     f"allreduce, {'a float' if x == 1 else f'{x} doubles'}")
        ax.set_xlabel("ranks (one node)")
        ax.set_ylabel("time per call (us)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--venv", action="append", type=Path, help="an environment per MPI (default: this)")
    p.add_argument("--ranks", default="2,4,8,16")
    p.add_argument("--levels", default="funneled,multiple")
    p.add_argument("--imb", default="", help="IMB-MPI1 (impi-rt ships it); none: no IMB runs")
    p.add_argument("--mesh", default=str(ROOT / "meshes" / "cube-h0.05.vtu"),
                   help="the ghost update's mesh ('' for none)")
    p.add_argument("--out", type=Path, default=Path("hybridmpi-results/scale"))
    p.add_argument("--quick", action="store_true", help="short loops: a check, not a measurement")
    a = p.parse_args(argv)
    iters, reps, imb_iters = (200, 3, 100) if a.quick else (3000, 7, 5000)
    a.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    mpis = [mpi_of(v) for v in (a.venv or [Path(sys.prefix)])]
    levels = a.levels.split(",")
    for mpi in mpis:
        tag = re.sub(r"[^A-Za-z0-9]+", "-", mpi["mpi"])[:40].strip("-")
        for ranks in map(int, a.ranks.split(",")):
            for level in levels:
                for kind, extra in (("barrier", []), ("allreduce", ["--sizes", SIZES]),
                                    ("ghost", ["--mesh", a.mesh, "--methods", "atomic,flat,neighbor"])):
                    if kind == "ghost" and (level != levels[0] or not a.mesh):
                        continue
                    out = a.out / f"{kind}-{tag}-{level}-{ranks}.json"
                    launch(mpi, ranks, [mpi["python"], "-m", "hybridmpi", "bench", kind, *extra,
                                        "--iters", str(iters if kind != "ghost" else iters // 3),
                                        "--reps", str(reps), "--thread-level", level,
                                        "--json", str(out)])
                    new = bench_rows(json.loads(out.read_text()), kind, mpi, level, ranks)
                    rows += new
                    for r in new:
                        print(f"{mpi['mpi'][:24]:<24} {level:>9} {ranks:>3} {kind:>9} "
                              f"{r['series'][:24]:<24} {r['x']!s:>8} {r['us']:9.3f} {r['mpi_us']:9.3f} "
                              f"{r['ratio']:6.2f}", flush=True)
            if a.imb and ranks > 1:
                new = imb_rows(mpi, ranks, a.imb, imb_iters)
                rows += new
                for r in new:
                    print(f"{mpi['mpi'][:24]:<24} {'IMB':>9} {ranks:>3} {'PMPI':>9} {r['x']:>8} B "
                          f"{r['us']:9.3f} {r['mpi_us']:9.3f} {r['ratio']:6.2f}", flush=True)
    doc = {"benchmark": "scale", "machine": machine(), "mpis": mpis, "quick": a.quick,
           "iters": iters, "reps": reps, "rows": rows}
    (a.out / "scale.json").write_text(json.dumps(doc, indent=1))
    try:
        figure(rows, a.out / "scale.png")
    except ImportError:
        print("# no matplotlib: no figure", file=sys.stderr)
    print(f"# wrote {a.out / 'scale.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
