"""Timing, statistics, tables and JSON shared by the benchmarks (the paper, Section 4).

Each repetition synchronizes the ranks with ten shared-memory barriers,
then times a loop of calls; the time per call of a repetition is the
maximum over ranks.  Tables report min, mean, max and standard deviation
over repetitions and the ratio to the MPI baseline timed in the same run.
"""

import json
import os
import platform
import socket
import statistics
import sys
import time

from ... import __version__

SCHEMA = "hybridmpi-bench/1"


def timed(comm, sync, call, iters, reps):
    """Per-repetition time of one call in microseconds, max over ranks."""
    from mpi4py import MPI

    samples = []
    for _ in range(reps):
        for _ in range(10):
            sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        dt = (time.perf_counter() - t0) / iters * 1e6
        samples.append(comm.allreduce(dt, op=MPI.MAX))
    return samples


def stats(samples):
    return {"min": min(samples), "mean": statistics.fmean(samples), "max": max(samples),
            "sd": statistics.pstdev(samples)}


def describe_mpi():
    from mpi4py import MPI

    line = MPI.Get_library_version().splitlines()[0]
    return " ".join("".join(ch for ch in line if ch.isprintable()).split())   # no padding, no NUL


#: MPI's thread levels by ``MPI.Query_thread()``'s value
THREAD_LEVELS = {0: "single", 1: "funneled", 2: "serialized", 3: "multiple"}


def document(name, title, x_label, hc, node_size, **extra):
    """A result document: what ran, where, and an empty list of results."""
    from mpi4py import MPI

    provided = MPI.Query_thread()
    return {"schema": SCHEMA, "benchmark": name, "title": title, "unit": "us",
            "x_label": x_label, "machine": platform.machine(), "host": socket.gethostname(),
            "cpus": os.cpu_count(), "mpi_library": describe_mpi(),
            "mpi_version": "%d.%d" % MPI.Get_version(), "ranks": hc.size, "nodes": hc.num_nodes,
            "node_size": node_size, "hybridmpi": __version__,
            "thread_level": THREAD_LEVELS.get(provided, str(provided)), **extra, "results": []}


def add(doc, series, x, samples, *, baseline=False, **extra):
    """Append one result row (a series at one x) with its statistics."""
    row = {"series": series, "x": x, "baseline": baseline, "samples": list(samples),
           **stats(samples), "ratio": None, **extra}
    doc["results"].append(row)
    return row


def set_ratios(doc):
    """ratio = mean / mean of the baseline row at the same x (None for the baseline).

    A row with a ``versus`` field is compared with that baseline series
    (benchmarks with several baselines per x)."""
    base, named = {}, {}
    for r in doc["results"]:
        if r["baseline"]:
            base.setdefault(r["x"], r["mean"])
            named[(r["x"], r["series"])] = r["mean"]
    for r in doc["results"]:
        b = named.get((r["x"], r["versus"])) if r.get("versus") else base.get(r["x"])
        r["ratio"] = None if r["baseline"] or not b else r["mean"] / b


def validate(doc):
    """Check a result document against the schema of bench/README.md.

    Raises:
        ValueError: naming the first field that is missing or of the wrong type.
    """
    top = {"schema": str, "benchmark": str, "title": str, "unit": str, "x_label": str,
           "machine": str, "host": str, "mpi_library": str, "mpi_version": str, "ranks": int,
           "nodes": int, "hybridmpi": str, "results": list}
    row = {"series": str, "x": (int, float, str), "baseline": bool, "samples": list,
           "min": (int, float), "mean": (int, float), "max": (int, float), "sd": (int, float)}
    if not isinstance(doc, dict):
        raise ValueError("result document is not a JSON object")
    for key, kind in top.items():
        if not isinstance(doc.get(key), kind):
            raise ValueError(f"field {key!r} missing or not {kind}")
    if doc["schema"] != SCHEMA:
        raise ValueError(f"schema {doc['schema']!r} is not {SCHEMA!r}")
    if "node_size" not in doc:
        raise ValueError("field 'node_size' missing")
    if not doc["results"]:
        raise ValueError("no results")
    for i, r in enumerate(doc["results"]):
        for key, kind in row.items():
            if not isinstance(r.get(key), kind):
                raise ValueError(f"results[{i}].{key} missing or not {kind}")
        if not r["samples"] or not r["min"] <= r["mean"] <= r["max"]:
            raise ValueError(f"results[{i}]: empty samples or min <= mean <= max fails")
        if "ratio" not in r or not (r["ratio"] is None or isinstance(r["ratio"], (int, float))):
            raise ValueError(f"results[{i}].ratio missing or not a number")
    return doc


def print_table(doc, extra=()):
    """OSU-style table of a document on stdout (rank 0 only calls it)."""
    print(f"# hybridmpi {doc['benchmark']} benchmark: {doc['title']}")
    level = f", thread level {doc['thread_level']}" if doc.get("thread_level") else ""
    print(f"# {doc['mpi_library']}{level}; {doc['ranks']} ranks, {doc['nodes']} node(s), "
          f"node_size={doc['node_size']}; host {doc['host']}")
    for line in doc.get("notes", ()):
        print(f"# {line}")
    cols = f"{'# ' + doc['x_label']:<16}{'series':>22}{'min':>10}{'avg':>10}{'max':>10}{'sd':>9}"
    def width(spec):
        return int(spec[2].split(".")[0]) if len(spec) > 2 else 10
    cols += "".join(f"{spec[0]:>{width(spec)}}" for spec in extra) + f"{'ratio':>8}"
    print(cols)
    for r in doc["results"]:
        line = (f"{str(r['x']):<16}{r['series']:>22}{r['min']:10.3f}{r['mean']:10.3f}"
                f"{r['max']:10.3f}{r['sd']:9.3f}")
        for spec in extra:
            v, fmt = r.get(spec[1]), (spec[2] if len(spec) > 2 else "10.3f")
            line += f"{v:{fmt}}" if isinstance(v, (int, float)) else f"{'-':>{width(spec)}}"
        line += f"{r['ratio']:8.2f}" if r["ratio"] is not None else f"{'(MPI)' if r['baseline'] else '-':>8}"
        print(line)


def write_json(doc, path):
    validate(doc)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


class Progress:
    """A one-line progress bar on rank 0's stderr, only when it is a terminal."""

    def __init__(self, comm, total, label):
        self.on = comm.Get_rank() == 0 and sys.stderr.isatty() and total > 1
        self.total, self.done, self.label = total, 0, label

    def step(self, what=""):
        self.done += 1
        if self.on:
            width = 30
            fill = width * self.done // self.total
            sys.stderr.write(f"\r{self.label} [{'#' * fill}{'.' * (width - fill)}] "
                             f"{self.done}/{self.total} {what:<30}")
            sys.stderr.flush()
            if self.done == self.total:
                sys.stderr.write("\n")
