"""The library's floating min and max (IEEE 754-2019's minimum and maximum), bit for bit, as a
numpy reference written another way than the C core's; the values that tell the rule from C's
``<`` (NaN at every rank position, two NaNs of other bits, -0.0 and +0.0 in every order, zeros
beside other values); and the complex products whose C99 result differs from the textbook
formula's.  Used by collectives_cases.py, halo_cases.py and tests/test_core.py.
"""

import numpy as np

#: the unsigned integer of each floating dtype's bits, and its quiet-NaN bit
BITS = {np.dtype(np.float64): (np.uint64, 1 << 51), np.dtype(np.float32): (np.uint32, 1 << 22)}


def reference(values, op):
    """``op`` ("min" or "max") of the rows of ``values`` (one row per rank, in any order: the rule
    is commutative and associative), element by element: where a NaN is met, a quiet NaN whose
    bits are the or of the NaNs' (quieted); else the least (greatest) value, of two zeros
    -0.0 for min and +0.0 for max whatever their order."""
    given = np.asarray(values)
    v = given.reshape(given.shape[0], -1)
    uint, quiet = BITS[v.dtype]
    bits = v.view(uint)
    nan = np.isnan(v)
    out = (np.fmin if op == "min" else np.fmax).reduce(v, axis=0)
    out_bits = out.view(uint).copy()
    zero = out == 0
    negative_zero = np.any((v == 0) & np.signbit(v), axis=0)
    positive_zero = np.any((v == 0) & ~np.signbit(v), axis=0)
    signed = negative_zero if op == "min" else ~positive_zero
    out_bits[zero] = np.where(signed[zero], np.array(-0.0, v.dtype).view(uint), 0)
    any_nan = nan.any(axis=0)
    nan_bits = np.bitwise_or.reduce(np.where(nan, bits, 0).astype(uint), axis=0) | uint(quiet)
    out_bits[any_nan] = nan_bits[any_nan]
    return out_bits.view(v.dtype).reshape(given.shape[1:])


def nan_of(dtype, rng, negative=False):
    """A quiet NaN of ``dtype`` with random payload bits (its sign bit set if ``negative``)."""
    uint, quiet = BITS[np.dtype(dtype)]
    width = np.dtype(dtype).itemsize * 8
    mantissa = 52 if width == 64 else 23
    exponent = ((1 << (width - 1 - mantissa)) - 1) << mantissa
    payload = int(rng.integers(0, quiet))
    return np.array(exponent | quiet | payload | (negative << (width - 1)), uint).view(dtype)[()]


def rows(size, rng, dtype):
    """The inputs of one element at ``size`` ranks, one row per case (a column per rank): random
    values; a NaN at each rank position; two NaNs of different bits and signs at two positions;
    -0.0 and +0.0 in every order; zeros beside positive and beside negative values at every set
    of positions; a NaN beside zeros; infinities.  Fresh random numbers on each call (``rng``
    must give the same draws on every rank)."""
    def finite():
        return rng.standard_normal(size)

    table = [finite()]
    for p in range(size):
        r = finite()
        r[p] = np.nan
        table.append(r)
    for p in range(size):
        q = (p + 1) % size
        if q != p:
            r = finite()
            r[p], r[q] = nan_of(dtype, rng), nan_of(dtype, rng, negative=True)
            table.append(r)
    for signs in range(2 ** size):
        table.append(np.array([-0.0 if signs >> k & 1 else 0.0 for k in range(size)]))
    for zeros in range(1, 2 ** size):
        for sign in (1.0, -1.0):
            r = sign * (np.abs(finite()) + 0.5)
            for k in range(size):
                if zeros >> k & 1:
                    r[k] = -0.0 if rng.random() < 0.5 else 0.0
            table.append(r)
    for p in range(size):
        r = np.where(rng.random(size) < 0.5, -0.0, 0.0)
        r[p] = np.nan
        table.append(r)
    r = finite()
    r[rng.integers(size)] = np.inf
    r[rng.integers(size)] = -np.inf
    table.append(r)
    return np.array(table, dtype=dtype)


#: (value at one rank, the others giving +-1 + 0i) -> the C99 product's real and imaginary parts
#: for a product of the others' signs s: s*inf, nan or a nan (the textbook formula gives
#: nan + nan i for each)
COMPLEX_SPECIALS = {
    complex(np.inf, np.nan): ("inf", "nan"),
    complex(np.inf, np.inf): ("inf", "inf"),
    complex(np.nan, np.inf): ("nan", "inf"),
    complex(-np.inf, np.nan): ("-inf", "nan"),
}


def complex_expected(special, sign):
    """Whether a product ``got`` (a complex) is the C99 one of ``special`` and unit factors
    whose signs multiply to ``sign``: a predicate on the parts."""
    def part(kind, x):
        if kind == "nan":
            return np.isnan(x)
        want = np.inf * sign * (-1 if kind.startswith("-") else 1)
        return x == want
    re, im = COMPLEX_SPECIALS[special]
    return lambda got: bool(part(re, got.real) and part(im, got.imag))
