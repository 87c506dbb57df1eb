"""The tuning table: which path a layout's barrier and allreduce take, measured where they run.

A table is what ``hybridmpi tune`` measured under ``mpiexec`` at one layout: the library's
barrier and allreduce by the C core and by MPI's own call, both through the library, at several
sizes, and the path it chose for the layout (``"core"`` or ``"mpi"``).  It is kept in a cache
folder (``HYBRIDMPI_TUNE_DIR``, else ``XDG_CACHE_HOME/hybridmpi/tune``) under a name made from
its key: the host's processor (its model and CPU count, not its name), the MPI library and
thread level, and the layout (ranks, nodes, ranks per node, cores per node).
``HYBRIDMPI_TUNE_FILE`` names one instead; a table whose key is not this job's (another host,
MPI or layout), or of another format, is refused with a one-line reason.  Without a table, the
layout's default (:meth:`Layout.default_path`).

One path per layout, not per size: ranks that pass different counts (an erroneous call) then
never meet one in the core and another in MPI, where neither would see the other.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import stat
from pathlib import Path
from typing import Any, NamedTuple

from .. import settings

#: the table's format; a table of another is refused (run ``hybridmpi tune`` again)
FORMAT = "hybridmpi-tune/1"
#: the paths a table may choose
PATHS = ("core", "mpi")
#: HYBRIDMPI_TUNE's values: a table where one is found (else the core), the core always, MPI's
#: own calls always
MODES = ("auto", "off", "mpi")


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
    return f"{platform.machine()}, {model or platform.processor() or 'unknown processor'}, " \
           f"{os.cpu_count()} CPUs"


def key_of(MPI: Any, layout: Layout) -> dict[str, Any]:
    """The key a table must carry to be taken by a job of ``layout`` on this host and MPI (the
    thread level too: MPICH's shared-memory collectives are off at ``multiple``)."""
    level = MPI.Query_thread()
    return {"host": host(), "mpi": mpi_name(MPI),
            "thread_level": _LEVELS.get(level, str(level)), "ranks": layout.ranks,
            "nodes": layout.nodes, "per_node": list(layout.per_node), "cores": layout.cores,
            "oversubscribed": layout.oversubscribed}


def file_name(key: dict[str, Any]) -> str:
    """The cache file of a key: its layout in short, then a digest of the whole key."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return f"{key['ranks']}r-{key['nodes']}n-{digest}.json"


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
    path = table.get("path")
    if path not in PATHS:
        raise TableError(f"tuning table {where} chose path {path!r}, not one of {list(PATHS)}")
    return str(path)


#: the largest table read, in bytes (one is a few kB)
MAX_BYTES = 1 << 20


def read(path: Path | str) -> Any:
    """A table file's JSON.  Only a regular file of at most :data:`MAX_BYTES` is opened (never
    blocking: a named pipe or a device is refused), and whatever its content, the only error
    is TableError.

    Raises:
        TableError: missing, not a regular file, too large, unreadable or not JSON.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise TableError(f"tuning table {path} is not a regular file")
            if st.st_size > MAX_BYTES:
                raise TableError(f"tuning table {path} has {st.st_size} bytes, more than a table "
                                 f"({MAX_BYTES})")
            return json.loads(f.read(MAX_BYTES + 1))
    except TableError:
        raise
    except Exception as e:  # noqa: BLE001 - any content (a nesting too deep: RecursionError)
        raise TableError(f"tuning table {path} cannot be read ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:200]})") from None


class Choice(NamedTuple):
    """The path this rank's view chose, and where the choice came from, in words."""

    path: str
    source: str


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
        return Choice(check(read(named), key, named), f"table {named}")
    cached = cached_path(key)
    default = layout.default_path()
    why = ("one rank per node, a core each" if default == "mpi" else
           "ranks share a node" if layout.per_node[1] > 1 else "ranks share cores" if
           layout.oversubscribed else "one node")
    if not cached.is_file():
        return Choice(default, f"the default for this layout ({why}; no tuning table for this "
                      "host, MPI and layout)")
    try:
        return Choice(check(read(cached), key, str(cached)), f"table {cached}")
    except TableError as e:
        return Choice(default, f"the default for this layout ({why}; {e})")


def write(table: dict[str, Any], path: Path | str | None = None) -> Path:
    """Write ``table`` where :func:`choose` finds it (or to ``path``), atomically."""
    target = Path(path) if path else cached_path(table["key"])
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(table, f, indent=1)
    os.replace(tmp, target)
    return target
