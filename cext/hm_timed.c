/* hybridmpi._timed: calls that pay for Python's overhead more than for their work, in C.
 *
 * Timed(fn, begin, end, abort, log), the profile's call wrapper (hybridmpi.profile): a
 * profiled call costs two clock reads and one record instead of several Python calls.  It
 * calls begin(), then fn(*args, **kw), then end(log) (or abort() when fn raised) — the C
 * core's hm_prof_begin, hm_prof_end and hm_prof_abort, passed as addresses because they
 * live in another shared object.
 *
 * Near(ndarray, dtype, fallback, bases, counts, itemsize, get): GlobalMemory.Put or Get
 * on a part of this node (a memcpy from or into the peer's segment).  Anything else (another
 * type, dtype or shape, a rank on another node, a range outside the part, keywords) goes
 * to `fallback`, the Python method, which checks and raises.  close() sends every call
 * there (GlobalMemory.free). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hm_core.h"

/* A new reference to o (Py_NewRef is 3.10+). */
static PyObject *ref(PyObject *o)
{
    Py_INCREF(o);
    return o;
}

/* The first n items of a sequence of ints as addresses (or counts): 0, or -1 with an error. */
static int read_words(PyObject *seq, Py_ssize_t n, unsigned long long *out)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_GetItem(seq, i);
        if (item == NULL)
            return -1;
        out[i] = PyLong_AsUnsignedLongLong(item);
        Py_DECREF(item);
        if (PyErr_Occurred())
            return -1;
    }
    return 0;
}

/* The fields every callable type of this module shares (a vectorcall object
 * whose functions are PREFIX_new, PREFIX_dealloc and attributes PREFIX_getset). */
#define CALLABLE(T, PREFIX, NAME, DOC)                                                          \
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hybridmpi._timed." NAME,                         \
    .tp_basicsize = sizeof(T), .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,     \
    .tp_vectorcall_offset = offsetof(T, vectorcall), .tp_call = PyVectorcall_Call, .tp_doc = DOC, \
    .tp_new = PREFIX##_new, .tp_dealloc = (destructor)PREFIX##_dealloc, .tp_getset = PREFIX##_getset

/* A new reference to `o`, or to None when it is NULL (the __wrapped__ getters). */
static PyObject *ref_or_none(PyObject *o)
{
    if (o == NULL)
        Py_RETURN_NONE;
    Py_INCREF(o);
    return o;
}

/* The attributes of a type that has only __wrapped__ (its getter: PREFIX_wrapped). */
#define WRAPPED_ONLY(PREFIX, DOC)                                                               \
    static PyGetSetDef PREFIX##_getset[] = {                                                    \
        {"__wrapped__", (getter)PREFIX##_wrapped, NULL, DOC, NULL}, {NULL}}

/* PREFIX_dealloc of a type the garbage collector tracks: untrack, PREFIX_clear, free. */
#define GC_DEALLOC(T, PREFIX)                                                                   \
    static void PREFIX##_dealloc(T *t)                                                          \
    {                                                                                           \
        PyObject_GC_UnTrack(t);                                                                 \
        PREFIX##_clear(t);                                                                      \
        Py_TYPE(t)->tp_free((PyObject *)t);                                                     \
    }

/* __wrapped__ (the fallback) and close() (PREFIX_close) of a type that has nothing more. */
#define CLOSE_ONLY(T, PREFIX)                                                                   \
    static PyObject *PREFIX##_wrapped(T *t, void *closure) { return ref_or_none(t->fallback); } \
    static PyMethodDef PREFIX##_methods[] = {                                                   \
        {"close", (PyCFunction)PREFIX##_close, METH_NOARGS,                                     \
         "send every later call to the fallback"},                                              \
        {NULL}};                                                                                \
    WRAPPED_ONLY(PREFIX, "the Python method")

/* hm_prof_begin, hm_prof_end and hm_prof_abort of the C core, passed by address. */
typedef __typeof__(hm_prof_begin) *begin_fn;
typedef __typeof__(hm_prof_end) *end_fn;

typedef struct {
    PyObject_HEAD
    PyObject *fn;
    PyObject *keep;       /* what owns the log's memory */
    begin_fn begin;
    end_fn end;
    begin_fn abort;
    hm_prof_log *log;
    vectorcallfunc vectorcall;
} Timed;

static PyObject *timed_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames)
{
    Timed *t = (Timed *)self;
    t->begin();
    PyObject *out = PyObject_Vectorcall(t->fn, args, nargsf, kwnames);
    if (out == NULL)
        t->abort();
    else
        t->end(t->log);
    return out;
}

static PyObject *timed_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *fn, *keep = Py_None;
    unsigned long long b, e, a, log;
    if (!PyArg_ParseTuple(args, "OKKKK|O", &fn, &b, &e, &a, &log, &keep))
        return NULL;
    Timed *t = (Timed *)type->tp_alloc(type, 0);
    if (t == NULL)
        return NULL;
    t->fn = ref(fn);
    t->keep = ref(keep);
    t->begin = (begin_fn)(uintptr_t)b;
    t->end = (end_fn)(uintptr_t)e;
    t->abort = (begin_fn)(uintptr_t)a;
    t->log = (hm_prof_log *)(uintptr_t)log;
    t->vectorcall = timed_vectorcall;
    return (PyObject *)t;
}

static void timed_dealloc(Timed *t)
{
    Py_XDECREF(t->fn);
    Py_XDECREF(t->keep);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyObject *timed_wrapped(Timed *t, void *closure) { return ref_or_none(t->fn); }

WRAPPED_ONLY(timed, "the timed callable");

static PyTypeObject TimedType = {
    CALLABLE(Timed, timed, "Timed", "Timed(fn, begin, end, abort, log): fn timed into a profile log"),
};

typedef struct {
    PyObject_HEAD
    PyObject *ndarray;
    PyObject *dtype;
    PyObject *fallback;
    char **base;
    int64_t *count;
    Py_ssize_t nranks;
    Py_ssize_t itemsize;
    int get;
    vectorcallfunc vectorcall;
} Near;

static PyObject *dtype_name;

static PyObject *near_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames)
{
    Near *t = (Near *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs < 2 || nargs > 3 || t->base == NULL)
        goto slow;
    PyObject *a = args[0];
    if ((PyObject *)Py_TYPE(a) != t->ndarray || !PyLong_CheckExact(args[1]) ||
        (nargs == 3 && !PyLong_CheckExact(args[2])))
        goto slow;
    long long rank = PyLong_AsLongLong(args[1]);
    long long off = nargs == 3 ? PyLong_AsLongLong(args[2]) : 0;
    if (PyErr_Occurred()) {
        PyErr_Clear();
        goto slow;
    }
    if (rank < 0 || rank >= t->nranks || t->base[rank] == NULL || off < 0)
        goto slow;
    PyObject *dt = PyObject_GetAttr(a, dtype_name);
    if (dt == NULL) {
        PyErr_Clear();
        goto slow;
    }
    Py_DECREF(dt);
    if (dt != t->dtype)
        goto slow;
    Py_buffer view;
    if (PyObject_GetBuffer(a, &view, PyBUF_C_CONTIGUOUS | (t->get ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Clear();
        goto slow;
    }
    Py_ssize_t n = view.itemsize ? view.len / view.itemsize : 0;
    /* n > count - off, never off + n (a huge offset would wrap it past the check; counts are
     * in [0, INT64_MAX], near_new); anything outside goes to the Python method, which raises */
    int64_t count = t->count[rank];
    if (view.ndim != 1 || view.itemsize != t->itemsize || n > count || off > count - n) {
        PyBuffer_Release(&view);
        goto slow;
    }
    char *part = t->base[rank] + off * t->itemsize;
    if (t->get)
        memcpy(view.buf, part, (size_t)view.len);
    else
        memcpy(part, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
slow:
    return PyObject_Vectorcall(t->fallback, args, nargsf, kwnames);
}

/* Near's arrays come from libc, not from Python's allocator: under HYBRIDMPI_SANITIZE, ASan
 * puts redzones around them and LeakSanitizer reports them with this file's frames (pymalloc
 * serves small blocks from its arenas, where neither sees them). */
static void near_release(Near *t)
{
    free(t->base);
    free(t->count);
    t->base = NULL;
    t->count = NULL;
}

static PyObject *near_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *nd, *dt, *fb, *bases, *counts;
    Py_ssize_t itemsize;
    int get;
    if (!PyArg_ParseTuple(args, "OOOOOnp", &nd, &dt, &fb, &bases, &counts, &itemsize, &get))
        return NULL;
    if (itemsize < 1) {
        PyErr_Format(PyExc_ValueError, "Near: itemsize must be >= 1, got %zd", itemsize);
        return NULL;
    }
    Py_ssize_t n = PySequence_Size(bases);
    if (n < 0 || PySequence_Size(counts) != n) {
        PyErr_SetString(PyExc_ValueError, "Near: bases and counts differ in length");
        return NULL;
    }
    Near *t = (Near *)type->tp_alloc(type, 0);
    if (t == NULL)
        return NULL;
    t->base = calloc((size_t)n + 1, sizeof(char *));
    t->count = calloc((size_t)n + 1, sizeof(int64_t));
    if (t->base == NULL || t->count == NULL) {
        Py_DECREF(t);
        return PyErr_NoMemory();
    }
    unsigned long long *words = calloc((size_t)n + 1, 2 * sizeof(unsigned long long));
    if (words == NULL) {
        Py_DECREF(t);
        return PyErr_NoMemory();
    }
    if (read_words(bases, n, words) < 0 || read_words(counts, n, words + n) < 0) {
        free(words);
        Py_DECREF(t);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (words[n + i] > (unsigned long long)(INT64_MAX / itemsize)) {
            PyErr_Format(PyExc_ValueError, "Near: count %llu of rank %zd is too large", words[n + i], i);
            free(words);
            Py_DECREF(t);
            return NULL;
        }
        t->base[i] = (char *)(uintptr_t)words[i];
        t->count[i] = (int64_t)words[n + i];
    }
    free(words);
    t->ndarray = ref(nd);
    t->dtype = ref(dt);
    t->fallback = ref(fb);
    t->nranks = n;
    t->itemsize = itemsize;
    t->get = get;
    t->vectorcall = near_vectorcall;
    return (PyObject *)t;
}

static void near_dealloc(Near *t)
{
    near_release(t);
    Py_XDECREF(t->ndarray);
    Py_XDECREF(t->dtype);
    Py_XDECREF(t->fallback);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyObject *near_close(Near *t, PyObject *unused)
{
    near_release(t);
    Py_RETURN_NONE;
}

CLOSE_ONLY(Near, near);

static PyTypeObject NearType = {
    CALLABLE(Near, near, "Near",
             "Near(ndarray, dtype, fallback, bases, counts, itemsize, get): Put or Get on this node"),
    .tp_methods = near_methods,
};

/* ------------------------------------------------------------------ collectives */

/* Coll(kind, st, fn, fallback, fail, ops): HybridComm.barrier() or allreduce(x[, op]) of one
 * float on one node, as one C call instead of a Python method and a cffi call.  kind 0:
 * fn = hm_barrier_dissemination, called with no arguments; kind 1: fn = hm_allreduce_rd_f64,
 * called with a float and optionally an op name (a key of `ops`, the names' codes).  Any
 * other call (keywords, another type, an unknown op) goes to `fallback`, the Python method,
 * which checks and raises; a call the C core failed goes to fail(code), which raises its
 * error.  close() sends every later call to the fallback (the comm freed or broken). */
typedef __typeof__(hm_barrier_dissemination) *barrier_fn;
typedef __typeof__(hm_allreduce_rd_f64) *allreduce_fn;

typedef struct {
    PyObject_HEAD
    hm_coll *st;          /* NULL once closed */
    void *fn;
    int kind;
    PyObject *fallback;
    PyObject *fail;
    PyObject *ops;        /* dict: op name -> code */
    vectorcallfunc vectorcall;
} Coll;

static PyObject *coll_failed(Coll *t, int code)
{
    PyObject *rc = PyLong_FromLong(code);
    if (rc == NULL)
        return NULL;
    PyObject *out = PyObject_CallOneArg(t->fail, rc);
    Py_DECREF(rc);
    return out;  /* fail raises: NULL */
}

static PyObject *coll_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames)
{
    Coll *t = (Coll *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (t->fallback == NULL) {  /* cleared by the garbage collector */
        PyErr_SetString(PyExc_RuntimeError, "hybridmpi: the HybridComm of this call is gone");
        return NULL;
    }
    if (t->st == NULL || kwnames != NULL)
        goto slow;
    if (t->kind == 0) {
        if (nargs != 0)
            goto slow;
        int rc;
        hm_coll *st = t->st;  /* close() may clear t->st meanwhile */
        Py_BEGIN_ALLOW_THREADS  /* other threads run while this one waits, as around cffi calls */
        rc = ((barrier_fn)t->fn)(st);
        Py_END_ALLOW_THREADS
        if (rc)
            return coll_failed(t, rc);
        Py_RETURN_NONE;
    }
    if (nargs < 1 || nargs > 2 || !PyFloat_CheckExact(args[0]))
        goto slow;
    int op = HM_SUM;
    if (nargs == 2) {
        if (!PyUnicode_CheckExact(args[1]))
            goto slow;
        PyObject *code = PyDict_GetItemWithError(t->ops, args[1]);
        if (code == NULL) {
            PyErr_Clear();
            goto slow;
        }
        op = (int)PyLong_AsLong(code);
    }
    double x = PyFloat_AS_DOUBLE(args[0]), r;
    hm_coll *st = t->st;  /* close() may clear t->st meanwhile */
    Py_BEGIN_ALLOW_THREADS
    r = ((allreduce_fn)t->fn)(st, x, op);
    Py_END_ALLOW_THREADS
    if (r != r && st->err.code)
        return coll_failed(t, st->err.code);
    return PyFloat_FromDouble(r);
slow:
    return PyObject_Vectorcall(t->fallback, args, nargsf, kwnames);
}

static PyObject *coll_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    int kind;
    unsigned long long st, fn;
    PyObject *fallback, *fail, *ops;
    if (!PyArg_ParseTuple(args, "iKKOOO!", &kind, &st, &fn, &fallback, &fail, &PyDict_Type, &ops))
        return NULL;
    if (kind != 0 && kind != 1) {
        PyErr_Format(PyExc_ValueError, "Coll: kind must be 0 (barrier) or 1 (allreduce), got %d", kind);
        return NULL;
    }
    if (st == 0 || fn == 0) {
        PyErr_SetString(PyExc_ValueError, "Coll: st and fn must be addresses");
        return NULL;
    }
    Coll *t = (Coll *)type->tp_alloc(type, 0);
    if (t == NULL)
        return NULL;
    t->st = (hm_coll *)(uintptr_t)st;
    t->fn = (void *)(uintptr_t)fn;
    t->kind = kind;
    t->fallback = ref(fallback);
    t->fail = ref(fail);
    t->ops = ref(ops);
    t->vectorcall = coll_vectorcall;
    return (PyObject *)t;
}

/* The fallback is a method bound to the HybridComm, whose __dict__ holds this object: a
 * cycle, which the garbage collector sees through these. */
static int coll_traverse(Coll *t, visitproc visit, void *arg)
{
    Py_VISIT(t->fallback);
    Py_VISIT(t->fail);
    Py_VISIT(t->ops);
    return 0;
}

static int coll_clear(Coll *t)
{
    t->st = NULL;
    Py_CLEAR(t->fallback);
    Py_CLEAR(t->fail);
    Py_CLEAR(t->ops);
    return 0;
}

GC_DEALLOC(Coll, coll);

static PyObject *coll_close(Coll *t, PyObject *unused)
{
    t->st = NULL;
    Py_RETURN_NONE;
}

CLOSE_ONLY(Coll, coll);

static PyTypeObject CollType = {
    CALLABLE(Coll, coll, "Coll",
             "Coll(kind, st, fn, fallback, fail, ops): barrier() or allreduce(x[, op]) of a float "
             "on one node as one C call"),
    .tp_methods = coll_methods,
    .tp_traverse = (traverseproc)coll_traverse,
    .tp_clear = (inquiry)coll_clear,
};

/* ------------------------------------------------------------------ Halo hot paths */

/* The C core's calls, passed by address (they live in hybridmpi._core), typed by its header. */
typedef __typeof__(hm_xchg_update) *xchg_update_fn;
typedef __typeof__(hm_xchg_both) *xchg_both_fn;
typedef __typeof__(hm_zc_update) *zc_update_fn;

enum { HOT_UPDATE = 0, HOT_ZC = 1, HOT_REVERSE = 2 };

/* State(): the one owner of a Halo's per-call state: the epoch of each direction, the
 * direction of the current call, the pending begin and what broke it.  The Halo's Python
 * code, its hot paths (Hot), the profile and the error paths all go through it. */
typedef struct {
    PyObject_HEAD
    uint64_t epoch[2];
    int current;
    PyObject *pending;   /* NULL: no begin pending; else what the Halo keeps of it */
    PyObject *broken;    /* NULL: usable; else what made it unusable (a str) */
} State;

static PyTypeObject StateType;

static int direction(PyObject *o)
{
    long d = PyLong_AsLong(o);
    if (d == -1 && PyErr_Occurred())
        return -1;
    if (d != 0 && d != 1) {
        PyErr_SetString(PyExc_ValueError, "State: direction 0 or 1");
        return -1;
    }
    return (int)d;
}

/* start(d): the next call of direction d begins: its epoch (stored), and d is current. */
static PyObject *state_start(State *st, PyObject *o)
{
    int d = direction(o);
    if (d < 0)
        return NULL;
    st->current = d;
    return PyLong_FromUnsignedLongLong(++st->epoch[d]);
}

/* epoch(d): the last call of direction d. */
static PyObject *state_epoch(State *st, PyObject *o)
{
    int d = direction(o);
    return d < 0 ? NULL : PyLong_FromUnsignedLongLong(st->epoch[d]);
}

static PyObject *state_epochs(State *st, void *closure)
{
    return Py_BuildValue("(KK)", (unsigned long long)st->epoch[0], (unsigned long long)st->epoch[1]);
}

static PyObject *state_current(State *st, void *closure) { return PyLong_FromLong(st->current); }

static PyObject *state_get(PyObject **field) { return ref_or_none(*field); }

static int state_put(PyObject **field, PyObject *v)
{
    PyObject *old = *field;
    *field = (v == NULL || v == Py_None) ? NULL : ref(v);
    Py_XDECREF(old);
    return 0;
}

static PyObject *state_pending(State *st, void *c) { return state_get(&st->pending); }
static int state_set_pending(State *st, PyObject *v, void *c) { return state_put(&st->pending, v); }
static PyObject *state_broken(State *st, void *c) { return state_get(&st->broken); }

static int state_set_broken(State *st, PyObject *v, void *c)
{
    if (v != NULL && v != Py_None && !PyUnicode_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "State.broken: a str or None");
        return -1;
    }
    return state_put(&st->broken, v);
}

static PyObject *state_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    if (!PyArg_ParseTuple(args, ":State"))
        return NULL;
    return type->tp_alloc(type, 0);
}

static int state_traverse(State *st, visitproc visit, void *arg)
{
    Py_VISIT(st->pending);
    Py_VISIT(st->broken);
    return 0;
}

static int state_clear(State *st)
{
    Py_CLEAR(st->pending);
    Py_CLEAR(st->broken);
    return 0;
}

static void state_dealloc(State *st)
{
    PyObject_GC_UnTrack(st);
    state_clear(st);
    Py_TYPE(st)->tp_free((PyObject *)st);
}

static PyMethodDef state_methods[] = {
    {"start", (PyCFunction)state_start, METH_O, "start(d): the epoch of a new call of direction d"},
    {"epoch", (PyCFunction)state_epoch, METH_O, "epoch(d): the last call of direction d"},
    {NULL}
};

static PyGetSetDef state_getset[] = {
    {"epochs", (getter)state_epochs, NULL, "(forward, reverse): the last call of each", NULL},
    {"current", (getter)state_current, NULL, "the direction of the current (or last) call", NULL},
    {"pending", (getter)state_pending, (setter)state_set_pending, "the pending begin, or None", NULL},
    {"broken", (getter)state_broken, (setter)state_set_broken, "what made it unusable, or None",
     NULL},
    {NULL}
};

static PyTypeObject StateType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hybridmpi._timed.State",
    .tp_basicsize = sizeof(State),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "State(): a Halo's epochs, current direction, pending begin and broken state",
    .tp_new = state_new,
    .tp_dealloc = (destructor)state_dealloc,
    .tp_traverse = (traverseproc)state_traverse,
    .tp_clear = (inquiry)state_clear,
    .tp_methods = state_methods,
    .tp_getset = state_getset,
};

/* The arrays a hot path serves (a program that alternates a few vectors keeps all of them
 * hot), each with what its buffer looked like when it was added. */
#define HOT_ARRAYS 4

typedef struct {
    PyObject *x;
    char *buf;
    Py_ssize_t len, itemsize, shape[2];
    int ndim;
    char format[8];
} hot_array;

typedef struct {
    PyObject_HEAD
    PyObject *halo;
    State *state;         /* the Halo's State */
    hot_array arr[HOT_ARRAYS];
    int narr, next;       /* arrays held; the slot the next one replaces */
    PyObject *fallback;   /* Halo.update or Halo.reverse (the function) */
    PyObject *error;      /* error(rc): raises the exception of a failed call */
    PyObject *op;         /* reverse: the op string of the hot call */
    PyObject *keep;       /* what owns the profile log's memory, or None */
    int kind, d, opcode, closed, default_op, bound;
    begin_fn pbegin;      /* a profile records the hot calls (hybridmpi.profile): */
    end_fn pend;          /* hm_prof_begin, hm_prof_end, hm_prof_abort and the log */
    begin_fn pabort;
    hm_prof_log *plog;
    void *fn;
    void *a[4];
    int64_t tagval;
    char *buf;
    Py_ssize_t len, itemsize, shape[2];
    int ndim;
    char format[8];
    vectorcallfunc vectorcall;
} Hot;

/* Fill slot i with array x (a new reference; the slot's old array released): 0, or -1 with
 * an error when x is not a writeable C-contiguous buffer of 1 or 2 dimensions. */
static int hot_set(Hot *t, int i, PyObject *x)
{
    Py_buffer v;
    if (PyObject_GetBuffer(x, &v, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    hot_array *h = &t->arr[i];
    int bad = v.ndim < 1 || v.ndim > 2 || v.format == NULL || strlen(v.format) >= sizeof h->format;
    if (!bad) {
        h->buf = v.buf;
        h->len = v.len;
        h->itemsize = v.itemsize;
        h->ndim = v.ndim;
        for (int k = 0; k < v.ndim; k++)
            h->shape[k] = v.shape[k];
        strcpy(h->format, v.format);
        Py_XSETREF(h->x, ref(x));
    }
    PyBuffer_Release(&v);
    if (bad)
        PyErr_SetString(PyExc_ValueError, "Hot: an array of 1 or 2 dimensions and a short format");
    return bad ? -1 : 0;
}

/* The checks of Halo.update's hot path: one of the hot array objects, no begin pending, not
 * broken, still writeable, C-contiguous, of the same memory, dtype (format) and shape.
 * Returns that array's slot, or -1. */
static int hot_ok(Hot *t, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    int i = 0;
    while (i < t->narr && args[0] != t->arr[i].x)
        i++;
    if (t->closed || kwnames != NULL || i == t->narr)
        return -1;
    if (t->kind == HOT_REVERSE) {
        if (nargs == 2 ? args[1] != t->op : !t->default_op)
            return -1;
    } else if (nargs != 1) {
        return -1;
    }
    if (t->state->pending != NULL || t->state->broken != NULL)
        return -1;
    Py_buffer v;
    if (PyObject_GetBuffer(args[0], &v, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return -1;
    }
    const hot_array *h = &t->arr[i];
    int ok = v.buf == h->buf && v.len == h->len && v.itemsize == h->itemsize && v.ndim == h->ndim &&
             v.format != NULL && strncmp(v.format, h->format, sizeof h->format) == 0;
    for (int k = 0; ok && k < v.ndim; k++)
        ok = v.shape[k] == h->shape[k];
    PyBuffer_Release(&v);
    return ok ? i : -1;
}

static PyObject *hot_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                PyObject *kwnames)
{
    Hot *t = (Hot *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    int slot = nargs < 1 || nargs > 2 ? -1 : hot_ok(t, args, nargs, kwnames);
    if (slot < 0)
        goto slow;
    char *buf = t->arr[slot].buf;
    if (t->plog)
        t->pbegin();
    uint64_t e = ++t->state->epoch[t->d];
    t->state->current = t->d;
    int rc;
    /* other threads run while this one waits (one of them may be what a peer waits on), as
     * around the cffi calls of the Python path; the array stays alive: arr[slot] holds it */
    Py_BEGIN_ALLOW_THREADS
    if (t->kind == HOT_UPDATE)
        rc = ((xchg_update_fn)t->fn)(t->a[0], t->a[1], buf, e);
    else if (t->kind == HOT_ZC)
        rc = ((zc_update_fn)t->fn)(t->a[0], t->a[1], t->a[2], t->a[3], t->tagval, buf, e);
    else
        rc = ((xchg_both_fn)t->fn)(t->a[0], t->a[1], buf, e, t->opcode, t->d);
    Py_END_ALLOW_THREADS
    if (t->plog) {
        if (rc == 0)
            t->pend(t->plog);
        else
            t->pabort();
    }
    if (rc != 0) {
        PyObject *code = PyLong_FromLong(rc);
        if (code == NULL)
            return NULL;
        PyObject *r = PyObject_CallOneArg(t->error, code);
        Py_DECREF(code);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_NONE;
slow:;
    /* fallback(halo, *args, **kw) */
    PyObject *stack[4];
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (t->bound || nargs + nk > 3)
        return PyObject_Vectorcall(t->fallback, args, nargsf, kwnames);
    stack[0] = t->halo;
    for (Py_ssize_t i = 0; i < nargs + nk; i++)
        stack[i + 1] = args[i];
    return PyObject_Vectorcall(t->fallback, stack, (size_t)(nargs + 1), kwnames);
}

static PyObject *hot_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *halo, *state, *x, *fb, *err, *op, *addrs, *prof = Py_None;
    int kind, d, opcode;
    unsigned long long fn, buf;
    long long tagval;
    if (!PyArg_ParseTuple(args, "OO!OOOOiiiKOKL|O", &halo, &StateType, &state, &x, &fb, &err, &op,
                          &kind, &d, &opcode, &fn, &addrs, &buf, &tagval, &prof))
        return NULL;
    unsigned long long pa[4] = {0, 0, 0, 0};
    PyObject *keep = Py_None;
    if (prof != Py_None && !PyArg_ParseTuple(prof, "KKKKO", &pa[0], &pa[1], &pa[2], &pa[3], &keep))
        return NULL;
    if (kind < HOT_UPDATE || kind > HOT_REVERSE || d < 0 || d > 1) {
        PyErr_SetString(PyExc_ValueError, "Hot: bad kind or direction");
        return NULL;
    }
    Hot *t = (Hot *)type->tp_alloc(type, 0);
    if (t == NULL)
        return NULL;
    if (hot_set(t, 0, x) < 0) {
        Py_DECREF(t);
        return NULL;
    }
    t->narr = t->next = 1;
    if ((void *)(uintptr_t)buf != t->arr[0].buf) {
        Py_DECREF(t);
        PyErr_SetString(PyExc_ValueError, "Hot: the buffer is not the array's");
        return NULL;
    }
    Py_ssize_t n = PySequence_Size(addrs);
    unsigned long long a[4] = {0, 0, 0, 0};
    if (n < 0 || read_words(addrs, n < 4 ? n : 4, a) < 0) {
        Py_DECREF(t);
        return NULL;
    }
    for (int i = 0; i < 4; i++)
        t->a[i] = (void *)(uintptr_t)a[i];
    t->keep = ref(keep);
    t->halo = ref(halo);
    t->state = (State *)ref(state);
    t->fallback = ref(fb);
    t->error = ref(err);
    t->op = ref(op);
    t->default_op = PyUnicode_Check(op) && PyUnicode_CompareWithASCIIString(op, "add") == 0;
    t->kind = kind;
    t->d = d;
    t->opcode = opcode;
    t->fn = (void *)(uintptr_t)fn;
    t->tagval = tagval;
    /* with a profile: the fallback is its (bound) wrapper, and the hot calls are recorded */
    t->bound = prof != Py_None;
    t->pbegin = (begin_fn)(uintptr_t)pa[0];
    t->pend = (end_fn)(uintptr_t)pa[1];
    t->pabort = (begin_fn)(uintptr_t)pa[2];
    t->plog = (hm_prof_log *)(uintptr_t)pa[3];
    t->vectorcall = hot_vectorcall;
    return (PyObject *)t;
}

/* The object references a Hot holds besides its arrays (for the collector). */
#define HOT_REFS(DO) DO(t->halo); DO(t->state); DO(t->fallback); DO(t->error); DO(t->op); DO(t->keep)

static int hot_traverse(Hot *t, visitproc visit, void *arg)
{
    HOT_REFS(Py_VISIT);
    for (int i = 0; i < t->narr; i++)
        Py_VISIT(t->arr[i].x);
    return 0;
}

static int hot_clear(Hot *t)
{
    t->closed = 1;
    HOT_REFS(Py_CLEAR);
    for (int i = 0; i < HOT_ARRAYS; i++)
        Py_CLEAR(t->arr[i].x);
    t->narr = 0;
    return 0;
}

GC_DEALLOC(Hot, hot);

/* Serve array x too (it replaces the oldest when HOT_ARRAYS are held). */
static PyObject *hot_add(Hot *t, PyObject *x)
{
    for (int i = 0; i < t->narr; i++)
        if (t->arr[i].x == x && hot_set(t, i, x) == 0)  /* again: its buffer may have changed */
            Py_RETURN_NONE;
    if (PyErr_Occurred())
        return NULL;
    if (hot_set(t, t->next, x) < 0)
        return NULL;
    if (t->narr < HOT_ARRAYS)
        t->narr++;
    t->next = (t->next + 1) % HOT_ARRAYS;
    Py_RETURN_NONE;
}

static PyObject *hot_close(Hot *t, PyObject *unused)
{
    t->closed = 1;
    Py_RETURN_NONE;
}

static PyObject *hot_wrapped(Hot *t, void *closure) { return ref_or_none(t->fallback); }

static PyMethodDef hot_methods[] = {
    {"add", (PyCFunction)hot_add, METH_O, "serve this array too"},
    {"close", (PyCFunction)hot_close, METH_NOARGS, "send every later call to the fallback"},
    {NULL}
};

static PyObject *hot_bound(Hot *t, void *closure)
{
    return PyBool_FromLong(t->bound);
}

static PyGetSetDef hot_getset[] = {
    {"__wrapped__", (getter)hot_wrapped, NULL, "the Python method", NULL},
    {"bound", (getter)hot_bound, NULL, "whether the fallback is a profile's wrapper", NULL},
    {NULL}
};

static PyTypeObject HotType = {
    CALLABLE(Hot, hot, "Hot",
             "Hot(halo, state, x, fallback, error, op, kind, d, opcode, fn, addrs, buf, tag[, prof]): "
              "Halo.update or reverse of one array, as one C call; prof = (begin, end, abort, "
              "log) records each hot call for a profile, whose wrapper is then the fallback"),
    .tp_traverse = (traverseproc)hot_traverse,
    .tp_clear = (inquiry)hot_clear,
    .tp_methods = hot_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "hybridmpi._timed",
                                    "The profile's call wrapper.", -1, NULL};

PyMODINIT_FUNC PyInit__timed(void)
{
    HotType.tp_flags |= Py_TPFLAGS_HAVE_GC;
    CollType.tp_flags |= Py_TPFLAGS_HAVE_GC;
    if (PyType_Ready(&TimedType) < 0 || PyType_Ready(&NearType) < 0 || PyType_Ready(&HotType) < 0 ||
        PyType_Ready(&StateType) < 0 || PyType_Ready(&CollType) < 0)
        return NULL;
    dtype_name = PyUnicode_InternFromString("dtype");
    if (!dtype_name)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyTypeObject *types[] = {&TimedType, &NearType, &HotType, &StateType, &CollType};
    const char *names[] = {"Timed", "Near", "Hot", "State", "Coll"};
    for (int i = 0; i < 5; i++) {
        if (PyModule_AddObject(m, names[i], ref((PyObject *)types[i])) < 0) {
            Py_DECREF(types[i]);
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
