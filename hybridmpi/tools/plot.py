"""PNG figures from benchmark JSON documents, in the spirit of the paper's figures."""

from __future__ import annotations

import json
import os
import re
import zlib
from typing import Any

from .._extras import need
from .bench import validate


def _load(source):
    if isinstance(source, dict):
        return validate(source)
    with open(source) as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{source}: not JSON ({e})") from None
    try:
        return validate(doc)
    except ValueError as e:
        raise ValueError(f"{source}: not a hybridmpi result document: {e}") from None


#: one colour per series, the same in every figure the project draws (matplotlib's tab10 and
#: tab20): the MPI baselines dark grey, each method and peer its own
COLORS = {
    # ghost update methods, their floor and the peers
    "atomic": "#1f77b4", "atomic shared": "#aec7e8", "flat": "#ff7f0e", "neighbor": "#2ca02c",
    "fence": "#d62728", "pscw": "#9467bd", "lock": "#8c564b", "floor": "#7f7f7f",
    "PETSc": "#e377c2", "petsc": "#e377c2", "DOLFINx": "#bcbd22", "dolfinx": "#bcbd22",
    "hybridmpi": "#17becf",
    # collectives
    "default (hc.barrier())": "#17becf", "drop-in barrier(comm)": "#98df8a",
    "dissemination acq_rel": "#393b79", "dissemination seq_cst": "#6b6ecf",
    "tree acq_rel": "#ffbb78", "tree seq_cst": "#e7ba52", "linear acq_rel": "#c5b0d5",
    "linear seq_cst": "#ce6dbd", "drop-in allreduce": "#98df8a",
    # a step's parts
    "computation": "#c7c7c7", "halo exchange": "#1f77b4", "reduction": "#ff9896"}
_MPI_COLOR = "#333333"
_OTHERS = ["#637939", "#8c6d31", "#843c39", "#7b4173", "#9edae5", "#c49c94", "#f7b6d2",
           "#dbdb8d", "#ff9896", "#5254a3", "#b5cf6b", "#e7969c"]


def color(series: str) -> str:
    """The colour of ``series`` in every figure: a fixed one for the library's methods, its
    collectives and the peers, dark grey for MPI's own calls (names starting "MPI", mpi4py,
    flat-numpy), else one drawn from the series' name (the same name, the same colour, in
    every figure and run)."""
    if series in COLORS:
        return COLORS[series]
    if series.startswith(("MPI", "mpi4py", "flat-numpy", "Send/Recv", "after MPI")):
        return _MPI_COLOR
    head = series.split(" (")[0]   # "atomic (zero copy)": atomic's
    if head in COLORS:
        return COLORS[head]
    return _OTHERS[zlib.crc32(series.encode()) % len(_OTHERS)]


def mpi_label(text: str) -> str:
    """An MPI's version string as a title shows it: without padding (MPICH's), unprintable
    characters (Open MPI's ends with a NUL) or what follows the first comma (Open MPI's
    package, ident and date)."""
    text = "".join(ch for ch in text if ch.isprintable())
    return " ".join(text.split(",")[0].split())


def _series(doc):
    out = {}
    for r in doc["results"]:
        out.setdefault(r["series"], []).append(r)
    return out


def _save(plt, fig, ax, title, path):
    """Title, grid and legend (outside the axes, on the right: it never covers a bar), then
    write the figure and close it."""
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3, which="both" if ax.get_yscale() == "log" else "major")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot(source: Any, outdir: str) -> list[str]:
    """Write the figures of one result document; return their paths.

    ``<benchmark>-time.png``: mean time per call of every series against
    the x value (size, length, mesh), with min-max bars; one group of bars
    per x when there are few x values.  ``<benchmark>-ratio.png``: the ratio
    of every series to the MPI baseline of the same run (1 = as fast).
    Results that carry a flop rate (``dot``) add ``<benchmark>-gflops.png``.

    Args:
        source: path of a JSON document, or the document itself.
        outdir: folder for the PNG files (created if needed).

    Raises:
        ValueError: the file is not a hybridmpi result document.
    """
    matplotlib = need("matplotlib", "plotting results")
    matplotlib.use("Agg")
    plt = need("matplotlib.pyplot", "plotting results")

    doc = _load(source)
    os.makedirs(outdir, exist_ok=True)
    name = doc["benchmark"]
    series = _series(doc)
    xs = sorted({r["x"] for r in doc["results"]}, key=lambda v: (isinstance(v, str), v))
    numeric = all(isinstance(v, (int, float)) for v in xs) and len(xs) > 2
    mpi_name = mpi_label(doc["mpi_library"])
    level = f", thread level {doc['thread_level']}" if doc.get("thread_level") else ""
    subtitle = f"{doc['ranks']} ranks, {doc['nodes']} node(s); {mpi_name}{level}"
    base = sorted({r["series"] for r in doc["results"] if r["baseline"]})
    what = re.sub(r"[:,;]?\s*(mean\s+)?time per \w+.*$", "", doc["title"]).strip() or doc["title"]
    paths = []
    for kind in ("time", "ratio"):
        fig, ax = plt.subplots(figsize=(10, 5))
        rows_of = {s: rows for s, rows in series.items()
                   if kind == "time" or any(r["ratio"] is not None for r in rows)}
        if numeric:
            _lines(ax, doc, rows_of, kind)
        else:
            _bars(ax, doc, rows_of, kind, xs)
        if kind == "time":
            ax.set_ylabel(f"time per call ({doc['unit']}), mean with min-max")
            means = [r["mean"] for r in doc["results"] if r["mean"] > 0]
            if numeric or (means and max(means) > 20 * min(means)):
                ax.set_yscale("log")
        else:
            ax.set_yscale("log")   # ratios of 0.001 and of 3 both readable
            ax.axhline(1.0, color="black", linewidth=1.0, linestyle="--",
                       label="1: as fast as " + (" / ".join(base) or "the baseline"))
            ax.set_ylabel("time / the MPI baseline's, same run (below 1: faster)")
        title = (doc["title"] if kind == "time" else
                 f"{what}: time relative to {' / '.join(base) or 'the MPI baseline'} (log scale)")
        paths.append(_save(plt, fig, ax, f"{title}\n{subtitle}",
                           os.path.join(outdir, f"{name}-{kind}.png")))
    split = [r for r in doc["results"] if isinstance(r.get("halo_us"), (int, float))]
    if split:
        paths.append(_split(plt, doc, split, subtitle, outdir))
    # rates against ranks (MFLOPS, as XcalableMP's Fig. 9) or against size (flop rate per core)
    for key, ylabel, logx, path in (
            ("mflops", "MFLOPS", False, f"{doc['benchmark']}-mflops.png"),
            ("gflops", "flop rate per core (Gflop/s)", True, f"{name}-gflops.png")):
        rated = [r for r in doc["results"] if isinstance(r.get(key), (int, float))]
        if not rated:
            continue
        fig, ax = plt.subplots(figsize=(10, 5))
        for s_name, rows in _series({"results": rated}).items():
            rows = sorted(rows, key=lambda r: r["x"])
            ax.plot([r["x"] for r in rows], [r[key] for r in rows], marker="o", label=s_name,
                    color=color(s_name))
        if logx:
            ax.set_xscale("log")
        ax.set_xlabel(doc["x_label"])
        ax.set_ylabel(ylabel)
        paths.append(_save(plt, fig, ax, f"{doc['title']}\n{subtitle}", os.path.join(outdir, path)))
    return paths


def _lines(ax, doc, rows_of, kind):
    """One line per series against numeric x (log scale): mean time with min-max bars
    (baselines dashed), or the ratio."""
    for s, rows in rows_of.items():
        rows = sorted(rows, key=lambda r: r["x"])
        x = [r["x"] for r in rows]
        if kind == "time":
            y = [r["mean"] for r in rows]
            err = [[r["mean"] - r["min"] for r in rows], [r["max"] - r["mean"] for r in rows]]
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, color=color(s),
                        linestyle="--" if rows[0]["baseline"] else "-", label=s)
        else:
            ax.plot(x, [r["ratio"] for r in rows], marker="o", label=s, color=color(s))
    ax.set_xscale("log")
    ax.set_xlabel(doc["x_label"])


def _bars(ax, doc, rows_of, kind, xs):
    """One group of bars per x value ``xs``, one bar per series: mean time with min-max bars,
    or the ratio."""
    width = 0.8 / max(len(rows_of), 1)
    for k, (s, rows) in enumerate(rows_of.items()):
        at = {r["x"]: r for r in rows}
        pos = [i + k * width for i, v in enumerate(xs) if v in at]
        vals = [at[v]["mean" if kind == "time" else "ratio"] for v in xs if v in at]
        if kind == "time":
            err = [[at[v]["mean"] - at[v]["min"] for v in xs if v in at],
                   [at[v]["max"] - at[v]["mean"] for v in xs if v in at]]
            ax.bar(pos, vals, width, yerr=err, capsize=3, label=s, color=color(s))
        else:
            ax.bar(pos, vals, width, label=s, color=color(s))
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(xs))], [str(v) for v in xs])
    ax.set_xlabel(doc["x_label"])


def _split(plt, doc, split, subtitle, outdir):
    """``<benchmark>-split.png``: the results that carry a split of the step (``halo_us``) as
    stacked bars per rank count and exchange, as DART-MPI's Fig. 8; return its path."""
    fig, ax = plt.subplots(figsize=(10, 5))
    labels = [f"{r['series']}\n{r['x']} ranks" for r in split]
    bottom = [0.0] * len(split)
    for key, part in (("compute_us", "computation"), ("halo_us", "halo exchange"),
                      ("reduce_us", "reduction")):
        vals = [r.get(key) or 0.0 for r in split]
        ax.bar(range(len(split)), vals, bottom=bottom, label=part, color=color(part))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(split)), labels, fontsize=7)
    ax.set_ylabel(f"time per step ({doc['unit']}), mean over ranks")
    return _save(plt, fig, ax, f"{doc['title']}\n{subtitle}",
                 os.path.join(outdir, f"{doc['benchmark']}-split.png"))
