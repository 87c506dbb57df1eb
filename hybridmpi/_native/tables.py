"""The type tables shared by the collectives and the Halo: numpy dtypes and reduction
operations as the C core codes them."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from .clib import lib

#: numpy dtype -> C core type code
DTYPES: dict[np.dtype[Any], int] = {
    np.dtype(np.float64): lib.HM_F64,
    np.dtype(np.float32): lib.HM_F32,
    np.dtype(np.int64): lib.HM_I64,
    np.dtype(np.int32): lib.HM_I32,
    np.dtype(np.complex128): lib.HM_C128,
}
DTYPE_NAMES = {code: dt.name for dt, code in DTYPES.items()}
OPS = {"sum": lib.HM_SUM, "prod": lib.HM_PROD, "min": lib.HM_MIN, "max": lib.HM_MAX}
#: C core type code -> the MPI type (its name in mpi4py's MPI) that moves it between the nodes
MPI_TYPES = {lib.HM_F64: "DOUBLE", lib.HM_F32: "FLOAT", lib.HM_I64: "INT64_T", lib.HM_I32: "INT32_T",
             lib.HM_C128: "C_DOUBLE_COMPLEX", lib.HM_PYINT: "DOUBLE"}
#: C core op code -> the MPI op (its name in mpi4py's MPI)
MPI_OPS = {lib.HM_SUM: "SUM", lib.HM_PROD: "PROD", lib.HM_MIN: "MIN", lib.HM_MAX: "MAX"}
OP_NAMES = {code: name for name, code in OPS.items()}


_MPI: list[Any] = []


def mpi() -> Any:
    """mpi4py's MPI module, imported on first use (importing hybridmpi does not start MPI)."""
    if not _MPI:
        from mpi4py import MPI

        _MPI.append(MPI)
    return _MPI[0]


def as_int(value: Any) -> int | None:
    """``value`` as a Python int when it is an integer (a Python or numpy integer, anything
    with ``__index__``) and not a bool; else None."""
    if isinstance(value, (bool, np.bool_)):
        return None
    try:
        return operator.index(value)
    except Exception:  # noqa: BLE001 - whatever __index__ raised, it is not an integer
        return None


def op_code(op: Any, MPI: Any = None) -> int:
    """Return the C core code of a reduction operation.

    Args:
        op: ``"sum"``, ``"prod"``, ``"min"``, ``"max"`` or ``MPI.SUM``,
            ``MPI.PROD``, ``MPI.MIN``, ``MPI.MAX``.

    Raises:
        ValueError: unknown operation name.
        TypeError: neither a string nor one of those MPI operations.
    """
    if isinstance(op, str):   # a str subclass too (numpy's str_)
        code = OPS.get(str(op))
        if code is None:
            raise ValueError(f"hybridmpi: unknown op {op!r}; use one of {sorted(OPS)}")
        return code
    MPI = MPI or mpi()
    for name, mop in (("sum", MPI.SUM), ("prod", MPI.PROD), ("min", MPI.MIN), ("max", MPI.MAX)):
        if op == mop:
            return OPS[name]
    raise TypeError(f"hybridmpi: unsupported op {op!r}; use 'sum', 'prod', 'min', 'max' "
                    "or MPI.SUM, MPI.PROD, MPI.MIN, MPI.MAX")
