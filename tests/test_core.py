"""The C core and the package, without MPI."""

import os
import subprocess
import sys

import numpy as np
import pytest

from hybridmpi._native.clib import ffi, lib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi"))
from _ieee import BITS, COMPLEX_SPECIALS, complex_expected, nan_of, reference, rows  # noqa: E402


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
        # C99's product, numpy's the textbook formula: the same for finite values, but numpy may fuse
        np.testing.assert_allclose(d, want, rtol=1e-14)
    else:
        assert np.array_equal(d, want)


_CODES = {np.dtype(np.float64): lib.HM_F64, np.dtype(np.float32): lib.HM_F32}
_OPS = {"min": lib.HM_MIN, "max": lib.HM_MAX}


def _combine(d, s, op):
    """d = d op s by the C core (hm_combine), in place."""
    code = _CODES.get(d.dtype, lib.HM_C128)
    assert lib.hm_combine(ffi.from_buffer(d), ffi.from_buffer(s), d.size, code,
                          _OPS.get(op, lib.HM_PROD)) == lib.HM_OK


def _tree_fold(columns, op, rng):
    """The columns combined by a random binary tree, each pair in a random order: what any of
    the collectives' algorithms does."""
    parts = [c.copy() for c in columns]
    while len(parts) > 1:
        i, j = rng.choice(len(parts), 2, replace=False)
        a, b = parts[i], parts[j]
        _combine(a, b, op)
        parts = [p for k, p in enumerate(parts) if k != j]
    return parts[0]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("op", ["min", "max"])
def test_min_max_one_rule(dtype, op):
    """hm_combine's min and max of floats are IEEE 754-2019's minimum and maximum, bit for bit
    (tests/mpi/_ieee.py): every pair of special values in both orders (NaN either side, a
    signalling NaN quieted, -0.0 and +0.0 both ways), and the values of every case at 2-5 ranks
    combined by random trees in random orders, with one result (C's `<` kept the first of two
    zeros and dropped a NaN that came second)."""
    rng = np.random.default_rng()
    uint, _ = BITS[np.dtype(dtype)]
    signalling = np.array(0x7FF0000000000001 if uint is np.uint64 else 0x7F800001, uint).view(dtype)
    specials = np.array([np.nan, nan_of(dtype, rng, negative=True), signalling, -0.0, 0.0, 1.0, -1.0,
                         np.inf, -np.inf, 5.0, np.finfo(dtype).smallest_subnormal], dtype)
    a, b = (m.ravel() for m in np.meshgrid(specials, specials))
    got = a.copy()
    _combine(got, b, op)
    want = reference(np.stack([a, b]), op)
    bad = np.flatnonzero(got.view(uint) != want.view(uint))
    assert bad.size == 0, [(a[i], b[i], got[i], want[i]) for i in bad[:4]]
    for size in (2, 3, 4, 5):
        table = rows(size, rng, dtype)
        want = reference(table.T, op)
        for _ in range(20):
            got = _tree_fold(list(table.T), op, rng)
            bad = np.flatnonzero(got.view(uint) != want.view(uint))
            assert bad.size == 0, [(table[i], got[i], want[i]) for i in bad[:4]]


def test_complex_product_is_c99():
    """hm_combine's complex product is C99's (Annex G, as MPICH's MPI_PROD of
    MPI_C_DOUBLE_COMPLEX): (inf + nan i)(1 + 0i) is inf + nan i, not the textbook formula's
    nan + nan i; the special values at any position among +-1 factors, combined in any order."""
    rng = np.random.default_rng()
    for special in COMPLEX_SPECIALS:
        for size in (2, 3, 4):
            signs = rng.choice([-1.0, 1.0], size)
            for p in range(size):
                column = [np.array([complex(signs[k], 0.0)]) for k in range(size)]
                column[p] = np.array([special])
                sign = np.prod(np.delete(signs, p))
                got = _tree_fold(column, "prod", rng)[0]
                assert complex_expected(special, sign)(got), (special, signs, p, got)


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


# ---------------------------------------------------------------- operations (hybridmpi._native._calls)

def _thing_class():
    """A class with one operation, ``op``, as the library's classes declare theirs."""
    from hybridmpi._native.clib import Calls, operations

    @operations("op")
    class Thing:
        __slots__ = ("_calls",)
        OPERATIONS: tuple[str, ...]

        def __init__(self):
            self._calls = Calls(self.OPERATIONS)

        def op(self, *args):
            """The method."""
            return ("method", args)
    return Thing


def test_operation_served_declined_delegated_and_documented():
    import inspect

    thing_class = _thing_class()
    t = thing_class()
    assert t.op(1) == ("method", (1,)) and thing_class.op.__doc__ == "The method."
    assert str(inspect.signature(t.op)) == "(*args)" and "__dict__" not in dir(t)
    t._calls.serve("op", lambda obj, x: NotImplemented if x == 1 else ("fast", obj is t, x))
    assert t.op(1) == ("method", (1,)) and t.op(2) == ("fast", True, 2)
    t._calls.delegate("op", lambda *a: ("delegate", a))
    assert t.op(1) == ("delegate", (1,)) and t.op(2) == ("fast", True, 2)
    kept = t.op
    t._calls.serve("op", None)
    t._calls.delegate("op", None)
    assert kept(3) == ("method", (3,))
    for bad in (("op", 3), ("nope", None)):
        with pytest.raises((TypeError, KeyError)):
            t._calls.serve(*bad)


def test_operation_survives_its_table_dropped_inside_a_call():
    """What serves a call may drop the object's only reference to its table (the table stays
    alive to the call's end) or call the operation again without end (RecursionError)."""
    t = _thing_class()()

    def fast(obj, *args):
        obj._calls = None
        bytearray(1 << 16)   # memory the freed table would be reused for
        return NotImplemented
    t._calls.serve("op", fast)
    assert t.op() == ("method", ())
    u = _thing_class()()
    u._calls.delegate("op", u.op)
    with pytest.raises(RecursionError):
        u.op()


def test_operation_refuses_another_class_slot_and_bad_records():
    from hybridmpi._native.clib import Op

    thing_class = _thing_class()

    class Other:
        _calls = thing_class.__dict__["_calls"]
    with pytest.raises(TypeError):
        Op(Other, lambda self: 0, 0)
    t = thing_class()
    log = ffi.new("hm_prof_log *")
    for args in (("op", -1, None, log), ("op", 0, None, log), ("op", 8, 3, log), ("nope", 8, None, log)):
        with pytest.raises((ValueError, KeyError)):
            t._calls.record(*args)
    assert t._calls.recorded == ()


def test_recorded_call_whose_finish_raises_keeps_the_clock():
    """A recorded call whose bytes cannot be counted (its finish raises) raises that error and
    leaves the profile clock as it was: a later call's record is not stretched back to an
    earlier call's start."""
    import time

    t = _thing_class()()
    log = ffi.new("hm_prof_log *")
    log.limit = 100
    address = int(ffi.cast("uintptr_t", log))
    t._calls.record("op", address, lambda out, *a: 1 // 0, log)
    for _ in range(20):
        with pytest.raises(ZeroDivisionError):
            t.op()
    time.sleep(0.2)
    t._calls.record("op", address, lambda out, *a: 24, log)
    assert t.op(5) == ("method", (5,)) and t._calls.recorded == ("op",)
    t._calls.unrecord()
    assert log.n == 1 and log.rec[5] == 24 and 0 <= log.rec[3] - log.rec[0] < 0.1e9
    lib.hm_prof_free(log)


def test_operation_table_whole_while_an_old_call_object_goes():
    """Replacing what serves an operation releases the old call object after the table is
    whole: a release that runs Python which calls the operation finds the new entry (here, a
    Hot whose error callback's finaliser calls it)."""
    from hybridmpi._native.clib import Hot, State

    t = _thing_class()()
    seen = []

    class Finaliser:
        def __call__(self, rc):
            pass

        def __del__(self):
            seen.append(t.op(7))
    x = np.zeros(4)
    address = int(ffi.cast("uintptr_t", ffi.from_buffer(x)))
    plan = (0, 0, 0, "add", address, (), 0)   # never called: no call matches its array
    t._calls.serve("op", Hot(State(), x, address, Finaliser(), plan))
    assert t.op(1) == ("method", (1,))   # declined (not its array)
    t._calls.serve("op", None)
    assert seen == [("method", (7,))]
