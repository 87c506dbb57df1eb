"""The house rules of docs/design.md, kept by tools: the layers contract (import-linter, every
import counted, those inside functions too), no import cycle in hybridmpi/, no function over 80
lines, and no reach into another object's private names (ruff SLF001) but through the seams
below."""

import ast
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "hybridmpi")
MAX_LINES = 80

#: the classes with the seam ``_internal`` (what the layer above uses of them), by module; the
#: comm layer's seam is HybridComm.context (docs/design.md, "Layers")
SEAMS = {"hybridmpi/ghost/halo.py": "Halo", "hybridmpi/globalmem/memory.py": "GlobalMemory",
         "hybridmpi/globalmem/coarray.py": "Coarray"}


def _tool(name):
    path = shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
    return path


def test_layers_contract():
    """`lint-imports` keeps pyproject.toml's layers: no import from a lower layer to a higher."""
    proc = subprocess.run([_tool("lint-imports"), "--config", os.path.join(ROOT, "pyproject.toml")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_import_cycle():
    """No cycle in hybridmpi's import graph, imports inside functions included (imports under
    TYPE_CHECKING, which never run, left out)."""
    grimp = pytest.importorskip("grimp")
    g = grimp.build_graph("hybridmpi", exclude_type_checking_imports=True)
    mods = sorted(g.modules)
    edges = {m: sorted(set(g.find_modules_directly_imported_by(m)) & set(mods)) for m in mods}
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components, iteratively
        work = [(v, iter(edges[v]))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(edges[w])))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        cycles.append(sorted(comp))

    for m in mods:
        if m not in index:
            visit(m)
    assert not cycles, f"import cycles in hybridmpi/: {cycles}"


def _functions():
    for folder, _, files in os.walk(PKG):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    tree = ast.parse(f.read())
                for node in ast.walk(tree):
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        yield os.path.relpath(path, ROOT), node


def test_no_long_function():
    long = [f"{path}:{fn.lineno} {fn.name} ({fn.end_lineno - fn.lineno + 1} lines)"
            for path, fn in _functions() if fn.end_lineno - fn.lineno + 1 > MAX_LINES]
    assert not long, f"functions over {MAX_LINES} lines: {long}"


def test_no_private_reach_in():
    """No access to another object's private names in hybridmpi/ (ruff SLF001, with the
    project's settings: ``_internal`` is the one name allowed)."""
    proc = subprocess.run([_tool("ruff"), "check", "--select", "SLF001", "--output-format", "concise",
                           "--no-cache", "hybridmpi"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _defined(tree):
    """The private names a module defines: functions, classes, attributes it assigns or
    declares (``self.x =``, ``x: T``), slots."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)   # __slots__ entries
    return {n for n in names if n.startswith("_")}


def test_private_names_stay_in_their_module():
    """A ``noqa: SLF001`` marks only a name of the same module (a class's helper reaching its
    own object), and ``_internal`` is defined only by the classes of SEAMS."""
    wrong, seams = [], {}
    for folder, _, files in os.walk(PKG):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, ROOT)
            with open(path) as f:
                text = f.read()
            tree = ast.parse(text)
            mine = _defined(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and any(
                        isinstance(f, ast.FunctionDef) and f.name == "_internal" for f in node.body):
                    seams[rel] = node.name
            for lineno, line in enumerate(text.splitlines(), 1):
                if "noqa: SLF001" in line:
                    used = {a for a in re.findall(r"\.(_[A-Za-z]\w*)", line) if not a.startswith("__")}
                    if not used or not used <= mine:
                        wrong.append(f"{rel}:{lineno}: {sorted(used - mine) or line.strip()}")
    assert not wrong, f"noqa: SLF001 on another module's private names: {wrong}"
    assert seams == SEAMS, f"classes defining _internal: {seams}, expected {SEAMS}"


def test_no_private_import():
    """No module imports another module's private names (``from .x import _y``); a private
    module (``from . import _hooks``) is the package's own."""
    wrong = []
    for folder, _, files in os.walk(PKG):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if not (isinstance(node, ast.ImportFrom) and node.level):
                    continue
                base = folder
                for _ in range(node.level - 1):
                    base = os.path.dirname(base)
                base = os.path.join(base, *(node.module or "").split(".") if node.module else [])
                for alias in node.names:
                    n = alias.name
                    module = os.path.exists(os.path.join(base, n + ".py")) or os.path.isdir(
                        os.path.join(base, n))
                    if n.startswith("_") and not n.startswith("__") and not module:
                        wrong.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {n}")
    assert not wrong, f"private names imported from another module: {wrong}"



def test_settings_read_in_one_module():
    """The environment is read in hybridmpi/settings.py only, and docs/settings.md lists every
    variable of its table with its default."""
    from hybridmpi.settings import variables

    VARIABLES = variables()

    readers = []
    for dirpath, _, files in os.walk(PKG):
        for f in files:
            path = os.path.join(dirpath, f)
            if f.endswith(".py") and f != "settings.py":
                with open(path) as fh:
                    if re.search(r"os\.environ|os\.getenv|\bgetenv\(", fh.read()):
                        readers.append(os.path.relpath(path, ROOT))
    assert readers == [], readers
    with open(os.path.join(ROOT, "docs", "settings.md")) as fh:
        doc = fh.read()
    for v in VARIABLES:
        assert f"| `{v.name}` | {v.default} |" in doc, v.name
        assert v.reader in ("python", "pmpi", "both"), v
    named = set(re.findall(r"HYBRIDMPI_[A-Z_]+", open(os.path.join(PKG, "settings.py")).read()))
    python = {v.name for v in VARIABLES if v.reader != "pmpi"}
    assert named == python, named ^ python
    # the PMPI library's reads (its env_* helpers and getenv) are the table's "pmpi" and "both"
    read = set()
    for f in os.listdir(os.path.join(ROOT, "cext")):
        if f.startswith("hm_pmpi") and f.endswith(".c"):
            text = open(os.path.join(ROOT, "cext", f)).read()
            read |= set(re.findall(r'(?:getenv|env_[a-z]+)\("(HYBRIDMPI_[A-Z_]+)"', text))
    pmpi = {v.name for v in VARIABLES if v.reader != "python"}
    assert read == pmpi, read ^ pmpi


#: the module that loads the C core and the error map
_ERROR_MAP_FILES = (os.path.join("_native", "clib.py"), os.path.join("_native", "errmap.py"))


def test_error_codes_named_in_the_error_map_only():
    """The C core's return codes, error-record markers and error bits are named in the module
    that loads the C core and in the error map only (docs/design.md, "The error map"); the
    error bits are defined once, in cext/hm_core.h, and Python reads them from there."""
    names = re.compile(r"\bHM_(?:OK|E[A-Z]+|BAD_[A-Z_]+|CNT_[A-Z_]+|TAG_BAD|ERRBIT|MISBIT)\b"
                       r"|\b(?:ERRBIT|MISBIT)\b|>> *6[23]\b|<< *6[23]\b")
    found = []
    for dirpath, _, files in os.walk(PKG):
        for f in files:
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, PKG)
            if f.endswith(".py") and rel not in _ERROR_MAP_FILES:
                with open(path) as fh:
                    found += [f"{rel}: {m}" for m in names.findall(fh.read())]
    assert found == [], found
    with open(os.path.join(ROOT, "cext", "hm_wait.h")) as fh:
        assert "#define HM_ERRBIT" not in fh.read()
    from hybridmpi._native.errmap import ERRBIT, MISBIT

    assert (ERRBIT, MISBIT) == (1 << 62, 1 << 63)


def test_errors_worded_in_the_error_map_only():
    """Every timeout, peer failure and disagreement between ranks is worded in the error map
    (``_native/errmap.py``): no other module builds SyncTimeout, PeerError or
    PeerArgumentError, or writes the words of these messages."""
    words = re.compile(r"\b(?:SyncTimeout|PeerError|PeerArgumentError)\(|timed out after|"
                       r"passed different|failed in this|passed invalid arguments|"
                       r"passed another vector|in different calls|free different objects")
    found = []
    for dirpath, _, files in os.walk(PKG):
        for f in files:
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, PKG)
            if not f.endswith(".py") or rel in (_ERROR_MAP_FILES[1], "errors.py"):
                continue
            with open(path) as fh:
                tree = ast.parse(fh.read())
            docs = {id(n.body[0].value) for n in ast.walk(tree)
                    if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                    and n.body and isinstance(n.body[0], ast.Expr)}
            for node in ast.walk(tree):
                text = (node.func.id + "(" if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        else node.value if isinstance(node, ast.Constant) and isinstance(node.value, str)
                        and id(node) not in docs else None)
                if text and words.search(text):
                    found.append(f"{rel}:{node.lineno}: {text[:80]}")
    assert found == [], "\n".join(found)


def test_old_module_names_are_gone():
    """The modules that moved when the package was organised by folder answer only at their
    homes (0.1 keeps no aliases: ``docs/changelog.md`` lists the moves); importing the package
    loads no module of the tools, numpy or MPI; ``hybridmpi.profile`` stays the class."""
    code = (
        "import sys, importlib, hybridmpi\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('numpy', 'mpi4py', 'cffi')\n"
        "            or m.startswith('hybridmpi.tools')]\n"
        "assert not hasattr(hybridmpi, 'MOVED')\n"
        "old = ['halo', 'pattern', 'interop', 'transport', 'ghost.transport', 'arena',\n"
        "       'collectives', 'dropin', 'cli', 'demo', 'plot', 'bench', 'apps', 'fem', 'mesh',\n"
        "       'transport.neighbor', 'nosuch', 'halo.nosuch', 'profile']\n"
        "for name in old:\n"
        "    try:\n"
        "        importlib.import_module('hybridmpi.' + name)\n"
        "    except ModuleNotFoundError:\n"
        "        continue\n"
        "    raise AssertionError(name)\n"
        "from hybridmpi.tools.mesh.generate import SHIPPED\n"
        "from hybridmpi.tools.baselines.neighbor import Graphs\n"
        "from hybridmpi.ghost.halo import ZERO_COPY_BYTES\n"
        "from hybridmpi.comm import HybridComm, TAG_SLOTS\n"
        "assert HybridComm is hybridmpi.HybridComm\n"
        "import hybridmpi.profiling.profile\n"
        "assert isinstance(hybridmpi.profile, type)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(ROOT))
    assert out.returncode == 0, out.stderr
