"""A Halo's arguments: agreed by every rank when it is made (:func:`agree_args`), its method's
transport made from them (:func:`make_transport`), and the reverse update's operation checked
per call (:func:`reverse_op`)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from .. import settings
from .._native import errmap as _errmap
from .._native.clib import lib
from .._native.tables import DTYPES
from ..comm._agree import agree, safe_repr
from .exchange import METHODS

#: the reverse update's operations, by name
REVERSE_OPS = {"add": lib.HM_SUM, "insert": lib.HM_INSERT, "min": lib.HM_MIN, "max": lib.HM_MAX}


def setting(hc, key, default):
    """A threshold from the environment as every rank read it when ``hc`` was made."""
    value = hc.env[key]
    return default if value is None else value


def agree_args(pattern, hc, dtype, block, method):
    """Check the arguments on every rank and agree (collective): (dtype, block, method, the
    largest channel inside a node over all ranks in bytes), or the same error everywhere."""
    problem: Any = None
    try:
        dt = np.dtype(dtype)
    except Exception:   # anything numpy refuses is a problem to agree on, not a raise here
        dt = None
    if method is None:
        method, source = settings.method()
    else:
        source = ""
    broken = hc.context.broken()
    if broken is not None:   # agreed: ranks whose comm is fine raise too, none waits
        problem = (f"its HybridComm is unusable after an earlier error "
                   f"{hc.context.earlier_error()}; free it")
    elif dt not in DTYPES:
        problem = f"unsupported dtype {safe_repr(dtype)}; use one of {sorted(d.name for d in DTYPES)}"
    elif (isinstance(block, (bool, np.bool_)) or not isinstance(block, (int, np.integer))
          or block < 1):
        problem = f"block must be an int >= 1, got {safe_repr(block)}"
    elif dt.itemsize * int(block) >= 2**31:  # the C core holds a point's bytes in an int
        problem = (f"block {int(block)} of {dt.name} makes {dt.itemsize * int(block)} bytes per "
                   "point; it must be under 2**31")
    elif type(method) is not str or (method not in METHODS and method != "auto"):
        problem = (f"unknown method {safe_repr(method)}{source}; use one of {list(METHODS) + ['auto']}"
                   + ("" if "fence" in METHODS else " (the paper's baselines 'neighbor', 'fence', "
                      "'pscw' and 'lock': import hybridmpi.tools.baselines first)"))
    near = 0 if problem else max([ids.size * dt.itemsize * block for p, ids in pattern.send.items()
                                  if p in pattern.intranode] + [0])
    if problem is not None:
        exc = (TypeError if problem.startswith("unsupported dtype")
               else RuntimeError if problem.startswith("its HybridComm") else ValueError)
        problem = exc, f"rank {hc.rank}: {problem}"
    else:
        block = int(block)
    views = agree(hc.comm, problem, "Halo()",
                  data=None if problem else (str(dt), block, method, near))
    biggest = max(v[3] for v in views)
    views = [v[:3] for v in views]
    if len(set(views)) != 1:
        raise _errmap.ranks_differ("Halo()", "(dtype, block, method)", views)
    return dt, block, method, biggest


def reverse_op(op, dtype):
    """The C core's code of a reverse update's ``op`` for ``dtype``, or ValueError / TypeError."""
    code = REVERSE_OPS.get(str(op)) if isinstance(op, str) else None   # numpy's str_ too
    if code is None:
        raise ValueError(f"hybridmpi: Halo.reverse: op must be one of {list(REVERSE_OPS)}, "
                         f"got {safe_repr(op)}")
    if dtype.kind == "c" and op in ("min", "max"):
        raise TypeError("hybridmpi: Halo.reverse: min and max are not defined for complex")
    return code


def make_transport(method, spec):
    """The transport of ``method`` made from ``spec``, and the method it is ("auto": atomic,
    else flat with a warning)."""
    if method == "auto":
        try:
            return METHODS["atomic"](spec), "atomic"
        except MemoryError as e:
            warnings.warn(f"{e}; using method 'flat'", RuntimeWarning, stacklevel=3)
            method = "flat"
    return METHODS[method](spec), method
