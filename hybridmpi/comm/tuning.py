"""The tuning table: which path a layout's barrier and allreduce take, measured where they run.

A table is what ``hybridmpi tune`` measured under ``mpiexec`` at one layout: the library's
barrier and allreduce by the C core and by MPI's own call, both through the library, at several
sizes, and the path it chose for the layout (``"core"`` or ``"mpi"``).  It is kept in a cache
folder (``HYBRIDMPI_TUNE_DIR``, else ``XDG_CACHE_HOME/hybridmpi/tune``) under a name made from
its key: the host's processor (its model and CPU count, not its name), the MPI library and
thread level, and the layout (ranks, nodes, ranks per node, cores per node).
``HYBRIDMPI_TUNE_FILE`` names one instead; a table whose key is not this job's (another host,
MPI or layout), or of another format, is refused with a one-line reason.  Without a table, a
calibration (:func:`calibrate`: both paths timed for about 10 ms when the comm is made, the
result cached as a table), or with ``HYBRIDMPI_TUNE=table`` the layout's default
(:meth:`Layout.default_path`).  The PMPI library reads the same tables (``key_line``).

One path per layout, not per size: ranks that pass different counts (an erroneous call) then
never meet one in the core and another in MPI, where neither would see the other.
"""

from __future__ import annotations

import json
import math
import os
import platform
import stat
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .. import settings
from .._native.clib import lib

#: the table's format; a table of another is refused (run ``hybridmpi tune`` again)
FORMAT = "hybridmpi-tune/1"
#: the paths a table may choose
PATHS = ("core", "mpi")
#: HYBRIDMPI_TUNE's values: a table where one is found, else a calibration; a table where one
#: is found, else the layout's default; the core always; MPI's own calls always
MODES = ("auto", "table", "off", "mpi")


class Layout(NamedTuple):
    """What a table's choice depends on besides the host and the MPI."""

    ranks: int
    nodes: int
    #: ranks per node, the fewest and the most
    per_node: tuple[int, int]
    #: cores that a physical node's ranks may run on (their affinity masks' union), the fewest
    cores: int
    #: some physical node has more ranks than cores (its ranks share cores)
    oversubscribed: bool = False

    @classmethod
    def of(cls, facts: list[tuple[int, int, bool]], nodes: int) -> Layout:
        """The layout of a comm from each rank's (its node's size where it leads the node, else
        0; the cores its physical node's ranks may run on; whether they share them)."""
        per_node = [n for n, _, _ in facts if n]
        return cls(len(facts), nodes, (min(per_node), max(per_node)), min(c for _, c, _ in facts),
                   any(s for _, _, s in facts))

    def words(self) -> str:
        lo, hi = self.per_node
        per = f"{lo}" if lo == hi else f"{lo}-{hi}"
        shared = ", ranks sharing cores" if self.oversubscribed else ""
        return (f"{self.ranks} ranks, {self.nodes} node(s) of {per}, {self.cores} core(s) per "
                f"node{shared}")

    def default_path(self) -> str:
        """The path without a table: MPI's own calls where every node has one rank, each with a
        core of its own (the core's node steps are then empty, and its agreement between the
        nodes costs 2-5 x MPI's call: docs/guide/tuning.md), else the core (ranks sharing cores:
        MPI's waits sleep, 8 ms a call here, the core's 0.1-3 ms)."""
        one = self.nodes > 1 and self.per_node == (1, 1) and not self.oversubscribed
        return "mpi" if one else "core"


def mpi_name(MPI: Any) -> str:
    """The MPI library's first line of ``MPI_Get_library_version``, as one clean line."""
    line = MPI.Get_library_version().splitlines()[0]
    return " ".join("".join(ch for ch in line if ch.isprintable()).split())


_LEVELS = {0: "single", 1: "funneled", 2: "serialized", 3: "multiple"}


def host() -> str:
    """The host as a table's key names it: its machine, processor model and CPU count (not its
    name: the nodes of a cluster, alike, share one table, whichever a job lands on)."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "cpu model", "processor\t: ")) and ":" in line:
                    model = " ".join(line.split(":", 1)[1].split())
                    if model and not model.isdigit():
                        break
    except OSError:
        pass
    return f"{platform.machine()}, {model or 'unknown processor'}, {os.cpu_count()} CPUs"


def key_of(MPI: Any, layout: Layout) -> dict[str, Any]:
    """The key a table must carry to be taken by a job of ``layout`` on this host and MPI (the
    thread level too: MPICH's shared-memory collectives are off at ``multiple``)."""
    level = MPI.Query_thread()
    return {"host": host(), "mpi": mpi_name(MPI),
            "thread_level": _LEVELS.get(level, str(level)), "ranks": layout.ranks,
            "nodes": layout.nodes, "per_node": list(layout.per_node), "cores": layout.cores,
            "oversubscribed": layout.oversubscribed}


def key_line(key: dict[str, Any]) -> str:
    """The key as one line of printable ASCII (anything else, and quotes and backslashes, made
    ``?``): what the PMPI library, which parses no JSON, builds the same way and finds in the
    table's ``key_line`` field (cext/hm_pmpi_tune.c)."""
    lo, hi = key["per_node"]
    line = (f"host={key['host']};mpi={key['mpi']};thread_level={key['thread_level']};"
            f"ranks={key['ranks']};nodes={key['nodes']};per_node={lo},{hi};cores={key['cores']};"
            f"oversubscribed={int(bool(key['oversubscribed']))}")
    return "".join(ch if " " <= ch <= "~" and ch not in "\\\"" else "?" for ch in line)


def fnv1a64(text: str) -> int:
    """The 64-bit FNV-1a hash of ``text``'s ASCII bytes (cext/hm_pmpi_tune.c computes it too)."""
    h = 0xCBF29CE484222325
    for b in text.encode("ascii", "replace"):
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def file_name(key: dict[str, Any]) -> str:
    """The cache file of a key: its layout in short, then a hash of its key line (the PMPI
    library opens the same name)."""
    return f"{key['ranks']}r-{key['nodes']}n-{fnv1a64(key_line(key)):016x}.json"


def cached_path(key: dict[str, Any]) -> Path:
    return settings.tune_dir() / file_name(key)


class TableError(ValueError):
    """A table that cannot be taken: its one-line reason."""


def check(table: Any, key: dict[str, Any], where: str) -> str:
    """The path a table chose, after checking its format and that its key is ``key``.

    Raises:
        TableError: not a table of this format, or of another host, MPI or layout.
    """
    if not isinstance(table, dict) or table.get("format") != FORMAT:
        got = table.get("format") if isinstance(table, dict) else type(table).__name__
        raise TableError(f"tuning table {where} is of format {got!r}, not {FORMAT!r}: "
                         "run hybridmpi tune again")
    theirs = table.get("key")
    if not isinstance(theirs, dict):
        raise TableError(f"tuning table {where} has no key")
    for field, value in key.items():
        got = theirs.get(field)
        if type(got) is not type(value) or got != value:   # (2.0 is not the count 2)
            raise TableError(f"tuning table {where} is for {field} {theirs.get(field)!r}, this job "
                             f"has {value!r}: run hybridmpi tune here, at this layout")
    line = table.get("key_line")
    if line is not None and line != key_line(key):   # (what the PMPI library goes by)
        raise TableError(f"tuning table {where} has a key line of another host, MPI or layout: "
                         "run hybridmpi tune here, at this layout")
    path = table.get("path")
    if path not in PATHS:
        raise TableError(f"tuning table {where} chose path {path!r}, not one of {list(PATHS)}")
    radix = table.get("radix", 2)
    if type(radix) is not int or not 2 <= radix <= lib.HM_MAX_RADIX:
        raise TableError(f"tuning table {where} chose radix {radix!r}, not an int from 2 to "
                         f"{lib.HM_MAX_RADIX}")
    direct = table.get("direct_total", 0)
    if type(direct) is not int or not 0 <= direct <= lib.HM_DIRECT_TOTAL_MAX:
        raise TableError(f"tuning table {where} chose direct_total {direct!r}, not an int from 0 "
                         f"to {lib.HM_DIRECT_TOTAL_MAX}")
    return str(path)


#: the largest table read, in bytes (one is a few kB)
MAX_BYTES = 1 << 20


class _Fields(dict):
    """A JSON object that remembers the keys it was given more than once."""

    repeated: list[str]


def _fields(pairs: list[tuple[str, Any]]) -> _Fields:
    out = _Fields(pairs)
    seen: set[str] = set()
    out.repeated = [k for k, _ in pairs if k in seen or seen.add(k)]  # type: ignore[func-returns-value]
    return out


#: the table's number fields, which the PMPI library reads as a run of decimal digits
NUMBER_FIELDS = ("radix", "direct_total")


def _outer_fields(text: str) -> list[tuple[str, str]]:
    """The outermost object's fields as written: (the key between its quotes, escapes and all;
    the value's text up to the next ``,`` or ``}`` where it is not a string, object or array),
    found as the PMPI library finds them (a key is a string at depth 1 followed by ``:``)."""
    out, depth, i = [], 0, 0
    while i < len(text):
        ch = text[i]
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        if ch != '"':
            i += 1
            continue
        j = i + 1
        while j < len(text) and text[j] != '"':
            j += 2 if text[j] == "\\" else 1
        key, rest = text[i + 1:j], text[j + 1:].lstrip()
        if depth == 1 and rest.startswith(":"):
            value = rest[1:].lstrip()
            end = min((k for k in (value.find(","), value.find("}")) if k >= 0), default=len(value))
            out.append((key, value[:end].strip()))
        i = j + 1
    return out


def _plain(table: Any, text: bytes, path: Path | str) -> Any:
    """``table`` if its own fields are written as the PMPI library reads them: each once, its
    name without escapes (the library finds ``"radix"``, not ``"rad\u0069x"``), a number
    field as decimal digits (``-0`` is not the library's 0); else TableError.  Nested objects
    are not the table's fields (a row's keys are its own)."""
    if isinstance(table, _Fields):
        if table.repeated:
            raise TableError(f"tuning table {path} has the field {table.repeated[0]!r} twice")
        for key, value in _outer_fields(text.decode("utf-8", "replace")):
            if "\\" in key:
                raise TableError(f"tuning table {path} writes the name of its field {key!r} with "
                                 "escapes")
            if key in NUMBER_FIELDS and type(table.get(key)) is int and \
                    not (value.isdigit() and value.isascii()):   # (check() words the others)
                raise TableError(f"tuning table {path} writes its {key} as {value[:40]!r}, not "
                                 "as decimal digits")
    return table


def read(path: Path | str) -> Any:
    """A table file's JSON.  Only a regular file of at most :data:`MAX_BYTES` is opened (never
    blocking: a named pipe or a device is refused), and whatever its content, the only error
    is TableError.

    Raises:
        TableError: missing, not a regular file, too large, unreadable or not JSON, or a field
            of its own given twice or named with escapes (which the PMPI library reads
            otherwise).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise TableError(f"tuning table {path} is not a regular file")
        with os.fdopen(fd, "rb") as f:
            if st.st_size > MAX_BYTES:
                raise TableError(f"tuning table {path} has {st.st_size} bytes, more than a table "
                                 f"({MAX_BYTES})")
            text = f.read(MAX_BYTES + 1)
        return _plain(json.loads(text, object_pairs_hook=_fields), text, path)
    except TableError:
        raise
    except Exception as e:  # noqa: BLE001 - any content (a nesting too deep: RecursionError)
        raise TableError(f"tuning table {path} cannot be read ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:200]})") from None


class Choice(NamedTuple):
    """The path this rank's view chose, and where the choice came from, in words; ``calibrate``:
    no table was found, and the comm should time both paths (:func:`calibrate`); ``radix``: the
    node tree's arity a table chose; ``direct_total``: the direct allreduce's gate it chose
    (node ranks times bytes; None: the comm's default)."""

    path: str
    source: str
    calibrate: bool = False
    radix: int | None = None
    direct_total: int | None = None


class Tuned(NamedTuple):
    """What every rank of a comm takes (:func:`agreed`): the path (``"calibrate"``: time both),
    where it came from, in words, and the tables' node-tree radix and direct allreduce gate
    (None: none, or the ranks' differ: the comm's defaults)."""

    path: str
    source: str
    radix: int | None = None
    direct_total: int | None = None


def _param(table: dict[str, Any], name: str) -> int | None:
    """A number a table (already :func:`check`-ed) chose, None where it chose none (a
    calibration's; a layout where ``hybridmpi tune`` had no candidates to time)."""
    value = table.get(name)
    return int(value) if value is not None else None


def taken(path: Path | str, key: dict[str, Any], source: str) -> Choice:
    """The choice of the table at ``path`` for ``key``.

    Raises:
        TableError: it cannot be taken here.
    """
    table = read(path)
    return Choice(check(table, key, str(path)), source, radix=_param(table, "radix"),
                  direct_total=_param(table, "direct_total"))


#: what calibrations chose in this process, by a key's file name (also when no table could be
#: written): a layout is calibrated once per process
_CALIBRATED: dict[str, Choice] = {}


def _default(layout: Layout, key: dict[str, Any], mode: str, missing: str) -> Choice:
    """The choice without a table: a calibration (``auto``, where both paths can win: several
    ranks, no core shared), else the layout's default."""
    default = layout.default_path()
    why = ("one rank per node, a core each" if default == "mpi" else
           "ranks share cores" if layout.oversubscribed else
           "ranks share a node" if layout.per_node[1] > 1 else "one node")
    if mode == "auto" and layout.ranks > 1 and not layout.oversubscribed:
        done = _CALIBRATED.get(file_name(key))
        if done is not None:
            return done._replace(source=f"{done.source}; this process's, for this layout "
                                 f"({missing})")
        return Choice(default, missing, True)
    return Choice(default, f"the default for this layout ({why}; {missing})")


def choose(MPI: Any, layout: Layout) -> Choice:
    """This rank's choice for a comm of ``layout`` (HYBRIDMPI_TUNE, HYBRIDMPI_TUNE_FILE, the
    cache): the comm agrees on it across its ranks.

    Raises:
        TableError: HYBRIDMPI_TUNE_FILE names a table that cannot be taken here.
    """
    mode = settings.tune_mode()
    if mode == "off":
        return Choice("core", "HYBRIDMPI_TUNE=off")
    if mode == "mpi":
        return Choice("mpi", "HYBRIDMPI_TUNE=mpi")
    key = key_of(MPI, layout)
    named = settings.tune_file()
    if named:
        return taken(named, key, f"table {named}")
    cached = cached_path(key)
    try:
        found = cached.is_file()
    except OSError as e:   # (a name too long, a folder this user may not enter)
        return _default(layout, key, mode, f"the cache cannot be looked in: {type(e).__name__}: "
                        f"{' '.join(str(e).split())[:200]}")
    if not found:
        return _default(layout, key, mode, "no tuning table for this host, MPI and layout")
    try:
        return taken(cached, key, f"table {cached}")
    except TableError as e:
        return _default(layout, key, mode, str(e))


def agreed(comm: Any, MPI: Any, layout: Layout) -> Tuned:
    """What every rank of ``comm`` takes, from each rank's :func:`choose` (collective): a table
    that one rank cannot take raises ValueError on every rank; ranks whose views differ (tables
    of different hosts) take the core; a radix or gate the ranks' tables differ on is None."""
    try:
        mine: tuple[Choice, str | None] = choose(MPI, layout), None
    except Exception as e:  # noqa: BLE001 - whatever it is, every rank must hear of it
        reason = str(e) if isinstance(e, TableError) else \
            f"the tuning table could not be chosen ({type(e).__name__}: {e})"
        mine = Choice("core", ""), " ".join(reason.split())[:300]
    views = comm.allgather(mine)
    problems = [(r, p) for r, (_, p) in enumerate(views) if p]
    if problems:
        r, p = problems[0]
        raise ValueError(f"hybridmpi: HybridComm(): rank {r}: {p}")
    if any(c.calibrate for c, _ in views):   # some rank has no table: every rank times both
        return Tuned("calibrate", next(c.source for c, _ in views if c.calibrate))
    if len({c.path for c, _ in views}) != 1:
        return Tuned("core", ("the default (the ranks' tuning tables differ: "
                              f"{sorted({c.source for c, _ in views})})"))
    first = views[0][0]
    source, params = first.source, {}
    for name, words in (("radix", "radices"), ("direct_total", "direct allreduce gates")):
        values = {getattr(c, name) for c, _ in views}
        if len(values) > 1:
            source += f" (the ranks' {words} differ: the default)"
        params[name] = values.pop() if len(values) == 1 else None
    return Tuned(first.path, source, **params)


def core_over_mpi(rows: list[dict[str, Any]]) -> float:
    """The core's time over MPI's call's, the geometric mean over a table's rows (``core_us``,
    ``mpi_us``; rows without both times left out)."""
    logs = [math.log(r["core_us"] / r["mpi_us"]) for r in rows if r["core_us"] > 0 and r["mpi_us"] > 0]
    return math.exp(sum(logs) / len(logs)) if logs else 1.0


def path_of(rows: list[dict[str, Any]]) -> str:
    """The path of lower geometric-mean time over a table's rows (``core_us``, ``mpi_us``)."""
    return "mpi" if core_over_mpi(rows) > 1.0 else "core"


def make_table(MPI: Any, layout: Layout, rows: list[dict[str, Any]], seconds: float,
               made_by: str, version: str | None = None, radix: int | None = None,
               direct_total: int | None = None) -> dict[str, Any]:
    """A table of ``rows`` (each: call, bytes, core_us, mpi_us, and mpi4py's MPI_us where
    measured) for this host, MPI and ``layout``; ``made_by``: ``"hybridmpi tune"`` or
    ``"calibration"``; ``version``: the library's, where the caller knows it (the command);
    ``radix``, ``direct_total``: the core's node tree and direct allreduce gate chosen, where
    they were (``hybridmpi tune``)."""
    path = path_of(rows)
    for r in rows:
        r["chosen_us"] = r[f"{path}_us"]
        r["best_us"] = min(r["core_us"], r["mpi_us"])
        mpi4py = r.get("MPI_us")
        r["ratio_to_mpi4py"] = r["chosen_us"] / mpi4py if mpi4py else None
    key = key_of(MPI, layout)
    return {"format": FORMAT, "key": key, "key_line": key_line(key), "path": path,
            **({"radix": radix} if radix is not None else {}),
            **({"direct_total": direct_total} if direct_total is not None else {}),
            "made_by": made_by, "layout": layout.words(),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "seconds": round(seconds, 4), "hybridmpi": version, "rows": rows}


#: the calibration's calls: (call, bytes); the calls of ``hybridmpi tune`` but fewer sizes
CALIBRATION_CALLS = (("barrier", 0), ("allreduce", 8), ("Allreduce", 4096), ("Allreduce", 32768))
#: about how long the calibration's timed rounds may last, in seconds (its whole cost, the
#: second path's set-up and the table's writing included: docs/guide/tuning.md)
CALIBRATION_S = 0.008
#: the most timed rounds (each: every call once by each path)
CALIBRATION_ROUNDS = 25


def _calls_of(coll: Any) -> list[Any]:
    """The calibration's calls on one path's collectives (``Collectives``), as callables."""
    x, y = np.ones(4096), np.empty(4096)
    xs, ys = x[:512], y[:512]
    return [coll.barrier, lambda: coll.allreduce(1.0), lambda: coll.Allreduce(xs, ys),
            lambda: coll.Allreduce(x, y)]


def calibrate(core: Any, mpi: Any) -> tuple[list[dict[str, Any]], float]:
    """Time the calibration's calls by both paths' collectives (``core`` and ``mpi``) over
    their comm's ranks (collective): each call's median time per rank over rounds in
    alternating order, the slowest rank's taken; as many rounds as fit in
    :data:`CALIBRATION_S` by a first probe (none where one round is longer: the probe decides).
    Every rank gets the same rows (they come from the core's max reductions), and the seconds
    it took."""
    t0 = time.perf_counter()
    cands = (_calls_of(core), _calls_of(mpi))
    n = len(CALIBRATION_CALLS)

    def once(k: int, i: int) -> float:
        t = time.perf_counter()
        cands[k][i]()
        return time.perf_counter() - t

    for calls in cands:   # the first calls set things up (MPICH's shared-memory paths)
        for f in calls:
            f()
    # the agreements go by the core's own allreduce: under the deadline and the failure notices
    times = core.allreduce(np.array([[[once(k, i) for k in (0, 1)] for i in range(n)]]), "max")
    rounds = int(min(CALIBRATION_ROUNDS, CALIBRATION_S // max(float(times.sum()), 1e-9)))
    if rounds > 0:
        times = np.empty((rounds, n, 2))
        for r in range(rounds):
            for i in range(n):
                for k in ((0, 1) if r % 2 == 0 else (1, 0)):
                    times[r, i, k] = once(k, i)
        # (the middle of the sorted rounds: np.median's first call costs 15 ms)
        times = core.allreduce(np.ascontiguousarray(np.sort(times, axis=0)[rounds // 2])[None], "max")
    rows = [{"call": name, "bytes": nbytes, "rounds": max(rounds, 1),
             "core_us": float(times[0, i, 0] * 1e6), "mpi_us": float(times[0, i, 1] * 1e6)}
            for i, (name, nbytes) in enumerate(CALIBRATION_CALLS)]
    return rows, time.perf_counter() - t0


def _keep(table: dict[str, Any], target: Path) -> str:
    """Write a calibration's table to ``target`` unless a table this job could take is there
    (another node's calibration, or ``hybridmpi tune``'s made meanwhile: kept); in words."""
    try:
        check(read(target), table["key"], str(target))
        return f"not cached: {target} holds a table"
    except TableError:
        pass
    try:
        write(table, target)
    except OSError as e:
        return f"not cached: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
    return f"cached in {target}"


def calibrated(MPI: Any, layout: Layout, rows: list[dict[str, Any]], seconds: float,
               keep: bool) -> Choice:
    """The choice a calibration's ``rows`` make, remembered for this process, and (``keep``:
    one rank per node) written into the cache as a table; a table that cannot be written is
    said in the choice's words, never raised."""
    table = make_table(MPI, layout, rows, seconds, "calibration")
    target = cached_path(table["key"])
    where = f"the node's first rank caches it in {target}"
    if keep:
        where = _keep(table, target)
    choice = Choice(table["path"], f"calibrated in {seconds * 1e3:.1f} ms (the core's time "
                    f"{core_over_mpi(rows):.2f} x MPI's call's, geometric mean; {where})")
    _CALIBRATED[file_name(table["key"])] = choice
    return choice


def write(table: dict[str, Any], path: Path | str | None = None) -> Path:
    """Write ``table`` where :func:`choose` finds it (or to ``path``), atomically."""
    target = Path(path) if path else cached_path(table["key"])
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            json.dump(table, f, indent=1)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)   # (a full disk leaves no part behind)
        raise
    return target
