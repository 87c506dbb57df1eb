"""The C core and the package, without MPI."""

import subprocess
import sys

import numpy as np
import pytest

from hybridmpi._native.clib import ffi, lib


def test_import_does_not_initialize_mpi():
    code = ("import sys, hybridmpi; "
            "assert 'mpi4py.MPI' not in sys.modules, 'mpi4py.MPI imported'; print('clean')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and "clean" in out.stdout, out.stderr


def test_atomics_lock_free():
    assert lib.hm_lock_free() == 1


@pytest.mark.parametrize("dtype,code", [(np.float64, lib.HM_F64), (np.float32, lib.HM_F32),
                                        (np.int64, lib.HM_I64), (np.int32, lib.HM_I32),
                                        (np.complex128, lib.HM_C128)])
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_combine_kernels(dtype, code, op):
    rng = np.random.default_rng(7)
    if np.dtype(dtype).kind == "i":
        a, b = (rng.integers(-50, 50, 1001).astype(dtype) for _ in range(2))
    elif np.dtype(dtype).kind == "c":
        a, b = (rng.standard_normal(1001) + 1j * rng.standard_normal(1001) for _ in range(2))
    else:
        a, b = (rng.standard_normal(1001).astype(dtype) for _ in range(2))
    opc = {"sum": lib.HM_SUM, "prod": lib.HM_PROD, "min": lib.HM_MIN, "max": lib.HM_MAX}[op]
    d = a.copy()
    rc = lib.hm_combine(ffi.from_buffer(d), ffi.from_buffer(b), d.size, code, opc)
    if np.dtype(dtype).kind == "c" and op in ("min", "max"):
        assert rc == lib.HM_EARG and np.array_equal(d, a)
        return
    assert rc == lib.HM_OK
    want = {"sum": a + b, "prod": a * b, "min": np.minimum(a, b), "max": np.maximum(a, b)}[op]
    if np.dtype(dtype).kind == "c" and op == "prod":
        # the textbook formula, as MPI libraries use it; numpy may fuse
        np.testing.assert_allclose(d, want, rtol=1e-14)
    else:
        assert np.array_equal(d, want)


def test_single_process_protocol():
    """A node of one: collectives return at once, with the input as result."""
    cap = 1024
    seg = ffi.new("char[]", lib.hm_coll_segment_bytes(cap) + 128)
    segs = ffi.new("char *[]", 1)
    segs[0] = seg + (-int(ffi.cast("uintptr_t", seg))) % 128
    c = ffi.new("hm_coll *")
    assert lib.hm_coll_init(c, 0, 1, 4, segs, cap) == lib.HM_OK
    assert lib.hm_barrier(c, lib.HM_TREE, lib.HM_BOTH) == lib.HM_OK
    assert lib.hm_allreduce_f64(c, 2.5, lib.HM_SUM) == 2.5
    x = np.arange(10.0)
    y = np.empty(10)
    assert lib.hm_allreduce(c, ffi.from_buffer(x), ffi.from_buffer(y), 10, lib.HM_F64,
                            lib.HM_MAX, lib.HM_BOTH) == lib.HM_OK
    assert np.array_equal(x, y)
    assert lib.hm_allreduce(c, ffi.from_buffer(x), ffi.from_buffer(y), cap, lib.HM_F64,
                            lib.HM_SUM, lib.HM_BOTH) == lib.HM_EARG
    assert lib.hm_coll_init(c, 0, 1, 1, segs, cap) == lib.HM_EARG
    assert lib.hm_coll_init(c, 2, 2, 4, segs, cap) == lib.HM_EARG
