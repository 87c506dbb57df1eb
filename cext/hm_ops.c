/* hybridmpi C core: the reduction operators (sum, product, min, max, and the integer types'
 * logical and bitwise operations) over every element type, which the node's allreduces, the
 * leaders' MPI ops and the ghost update's reverse combine with.  See hm_core.h for the
 * contract of each exported function. */
#define _GNU_SOURCE
#include "hm_core.h"

#include <string.h>

size_t hm_dtype_size(int dtype)
{
    switch (dtype) {
    case HM_F64: case HM_I64: case HM_U64: case HM_PYINT: return 8;
    case HM_F32: case HM_I32: case HM_U32: return 4;
    case HM_I16: case HM_U16: return 2;
    case HM_I8: case HM_U8: return 1;
    case HM_C128: return 16;
    default: return 0;
    }
}

/* The floating types' min and max are IEEE 754-2019's minimum and maximum (C23's fminimum
 * and fmaximum), one result whatever order the node's algorithm, the tree across the nodes or
 * the sender order of a ghost update combines the values in: a NaN met gives a quiet NaN (the
 * bitwise or of the NaNs met, quieted, so its bits do not depend on the order either), and
 * -0.0 is below +0.0.  C's `<` (MPI_MIN's usual code) drops a NaN where it comes second and keeps
 * whichever zero comes first.  Written as selects, which gcc 12 vectorises for SSE2 (a mask
 * made of a comparison, or || of two comparisons, it does not). */
#if defined(__FAST_MATH__) || (defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__)
#error "the core's min, max and complex product need IEEE arithmetic: build without -ffast-math"
#endif
#define HM_IEEE_MINMAX(T, U, QUIET)                                                        \
    static inline U bits_##T(T x) { U u; memcpy(&u, &x, sizeof u); return u; }            \
    static inline T of_bits_##T(U u) { T x; memcpy(&x, &u, sizeof x); return x; }         \
    static inline T nans_##T(T a, T b)                                                     \
    {                                                                                      \
        T na = a != a ? a : (T)0, nb = b != b ? b : (T)0;                                  \
        return of_bits_##T(bits_##T(na) | bits_##T(nb) | (QUIET));                         \
    }                                                                                      \
    static inline T min_##T(T a, T b)                                                      \
    {                                                                                      \
        T r = a < b ? a : b, n = nans_##T(a, b);                                           \
        r = a == b ? of_bits_##T(bits_##T(a) | bits_##T(b)) : r;   /* -0.0 if either */    \
        r = a != a ? n : r;                                                                \
        return b != b ? n : r;                                                             \
    }                                                                                      \
    static inline T max_##T(T a, T b)                                                      \
    {                                                                                      \
        T r = a > b ? a : b, n = nans_##T(a, b);                                           \
        r = a == b ? of_bits_##T(bits_##T(a) & bits_##T(b)) : r;   /* +0.0 if either */    \
        r = a != a ? n : r;                                                                \
        return b != b ? n : r;                                                             \
    }
HM_IEEE_MINMAX(double, uint64_t, UINT64_C(1) << 51)
HM_IEEE_MINMAX(float, uint32_t, UINT32_C(1) << 22)

#define HM_MIN_(a, b) ((b) < (a) ? (b) : (a))
#define HM_MAX_(a, b) ((b) > (a) ? (b) : (a))
#define min_int(a, b) HM_MIN_(a, b)
#define max_int(a, b) HM_MAX_(a, b)

#define HM_LOOP(expr) for (uint64_t i = 0; i < n; i++) d[i] = (expr)
#define HM_COMBINE_REAL(T, KIND)                                                \
    static void combine_##T(T *restrict d, const T *restrict s, uint64_t n, int op) \
    {                                                                           \
        switch (op) {                                                           \
        case HM_SUM: HM_LOOP(d[i] + s[i]); break;                               \
        case HM_PROD: HM_LOOP(d[i] * s[i]); break;                              \
        case HM_MIN: HM_LOOP(min_##KIND(d[i], s[i])); break;                    \
        case HM_MAX: HM_LOOP(max_##KIND(d[i], s[i])); break;                    \
        }                                                                       \
    }
/* The integer types also take MPI's logical and bitwise operations. */
#define HM_COMBINE_INT(T)                                                       \
    HM_COMBINE_REAL(T, int)                                                     \
    static void combine_bits_##T(T *restrict d, const T *restrict s, uint64_t n, int op) \
    {                                                                           \
        switch (op) {                                                           \
        case HM_LAND: HM_LOOP(d[i] && s[i]); break;                             \
        case HM_LOR: HM_LOOP(d[i] || s[i]); break;                              \
        case HM_LXOR: HM_LOOP(!d[i] != !s[i]); break;                           \
        case HM_BAND: HM_LOOP(d[i] & s[i]); break;                              \
        case HM_BOR: HM_LOOP(d[i] | s[i]); break;                               \
        case HM_BXOR: HM_LOOP(d[i] ^ s[i]); break;                              \
        default: combine_##T(d, s, n, op);                                      \
        }                                                                       \
    }

HM_COMBINE_REAL(double, double)
HM_COMBINE_REAL(float, float)
HM_COMBINE_INT(int64_t)
HM_COMBINE_INT(int32_t)
HM_COMBINE_INT(uint64_t)
HM_COMBINE_INT(uint32_t)
HM_COMBINE_INT(int16_t)
HM_COMBINE_INT(uint16_t)
HM_COMBINE_INT(int8_t)
HM_COMBINE_INT(uint8_t)

/* Complex numbers as C99's double _Complex ((re, im) pairs): the product is C99's (Annex G,
 * gcc's __muldc3 where the textbook formula gave NaN in both parts), as MPICH's MPI_PROD of
 * MPI_C_DOUBLE_COMPLEX computes it: (inf + NaN i)(1 + 0i) is inf + NaN i, not NaN + NaN i.
 * (-fcx-limited-range, which -ffast-math implies, would make it the textbook formula.) */
static void combine_c128(double _Complex *restrict d, const double _Complex *restrict s, uint64_t n,
                         int op)
{
    if (op == HM_SUM)
        HM_LOOP(d[i] + s[i]);
    else
        HM_LOOP(d[i] * s[i]);
}

int hm_op_valid(int dtype, int op)
{
    switch (dtype) {
    case HM_F64: case HM_PYINT: case HM_F32: return op >= 0 && op < HM_NOPS;
    case HM_C128: return op == HM_SUM || op == HM_PROD;
    default:
        return hm_dtype_size(dtype) != 0 &&
               ((op >= 0 && op < HM_NOPS) || (op >= HM_LAND && op <= HM_BXOR));
    }
}

int hm_combine(void *dst, const void *src, uint64_t n, int dtype, int op)
{
    if (!hm_op_valid(dtype, op))
        return HM_EARG;
    switch (dtype) {
    case HM_F64: case HM_PYINT: combine_double(dst, src, n, op); return HM_OK;
    case HM_F32: combine_float(dst, src, n, op); return HM_OK;
    case HM_I64: combine_bits_int64_t(dst, src, n, op); return HM_OK;
    case HM_I32: combine_bits_int32_t(dst, src, n, op); return HM_OK;
    case HM_U64: combine_bits_uint64_t(dst, src, n, op); return HM_OK;
    case HM_U32: combine_bits_uint32_t(dst, src, n, op); return HM_OK;
    case HM_I16: combine_bits_int16_t(dst, src, n, op); return HM_OK;
    case HM_U16: combine_bits_uint16_t(dst, src, n, op); return HM_OK;
    case HM_I8: combine_bits_int8_t(dst, src, n, op); return HM_OK;
    case HM_U8: combine_bits_uint8_t(dst, src, n, op); return HM_OK;
    default: combine_c128(dst, src, n, op); return HM_OK;
    }
}
