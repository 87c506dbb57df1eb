"""The house rules of docs/design.md, kept by tools: the layers contract (import-linter, every
import counted, those inside functions too), no import cycle in hybridmpi/, no function over 80
lines, and no more private reach-ins into another object than the budget below (ruff SLF001)."""

import ast
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "hybridmpi")
MAX_LINES = 80

#: accesses to another object's private names (ruff SLF001) per module, at most: the count may
#: only go down (issue "the house, second pass"); modules not named here have none
SLF001_BUDGET = {
    "hybridmpi/globalmem/coarray.py": 27,
    "hybridmpi/profile.py": 20,
    "hybridmpi/globalmem/requests.py": 16,
    "hybridmpi/halo.py": 12,
    "hybridmpi/comm.py": 7,
    "hybridmpi/globalmem/sync.py": 5,
    "hybridmpi/dropin.py": 4,
    "hybridmpi/globalmem/memory.py": 2,
    "hybridmpi/pattern.py": 1,
}


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


def test_private_access_budget():
    """Accesses to another object's private names (ruff SLF001) stay within the budget."""
    proc = subprocess.run([_tool("ruff"), "check", "--select", "SLF001", "--output-format", "concise",
                           "--no-cache", "--exit-zero", "hybridmpi"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    counts = {}
    for line in proc.stdout.splitlines():
        if "SLF001" in line:
            path = line.split(":", 1)[0]
            counts[path] = counts.get(path, 0) + 1
    over = {p: (n, SLF001_BUDGET.get(p, 0)) for p, n in counts.items() if n > SLF001_BUDGET.get(p, 0)}
    assert not over, f"private reach-ins over the budget (found, allowed): {over}\n{proc.stdout}"
    assert proc.returncode == 0, proc.stderr
