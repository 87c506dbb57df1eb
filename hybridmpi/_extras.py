"""Optional dependencies.

``pip install hybridmpi`` needs only mpi4py, numpy and cffi.  The mesh pipeline, the FEM solver,
the benchmarks and the plots import what they need through :func:`need`, which names the extra
that installs a missing module.  A leaf module: it imports only the standard library.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

#: the extra of pyproject.toml that installs each optional module
EXTRA = {"meshio": "mesh", "pymetis": "mesh", "gmsh": "mesh", "scipy": "fem", "matplotlib": "plot"}


class MissingExtra(ImportError):
    """An optional dependency is missing; the message says which extra installs it.

    An :class:`ImportError`, so ``except ImportError`` keeps working.
    """


def need(module: str, what: str) -> ModuleType:
    """Import ``module`` (an optional dependency, or one of its submodules) for ``what``.

    Raises:
        MissingExtra: the module cannot be imported; the message names the extra
            (``pip install 'hybridmpi[mesh]'``) and the import's own error.
    """
    top = module.partition(".")[0]
    try:
        return importlib.import_module(module)
    except (ImportError, OSError) as e:  # OSError: a wheel whose shared libraries are missing
        extra = EXTRA[top]
        raise MissingExtra(f"hybridmpi: {what} needs {top}, which cannot be imported ({e}); "
                           f"install it with: pip install 'hybridmpi[{extra}]'", name=top) from None


def need_everywhere(comm: Any, module: str, what: str) -> ModuleType:
    """:func:`need` on every rank of ``comm`` (collective): raises MissingExtra on every rank
    when any rank lacks the module, naming those ranks, instead of leaving the others waiting in
    the next collective call; returns the module."""
    found: ModuleType | None = None
    problem = None
    try:
        found = need(module, what)
    except MissingExtra as e:
        problem = str(e)
    problems = comm.allgather(problem)
    missing = [r for r, p in enumerate(problems) if p is not None]
    if missing:
        first = problems[missing[0]]
        raise MissingExtra(f"{first} (rank{'s' if len(missing) > 1 else ''} "
                           f"{', '.join(map(str, missing))} of {len(problems)})",
                           name=module.partition(".")[0])
    assert found is not None
    return found
