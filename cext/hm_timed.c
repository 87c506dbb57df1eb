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
#include <string.h>

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

typedef void (*begin_fn)(void);
typedef int (*end_fn)(void *);

typedef struct {
    PyObject_HEAD
    PyObject *fn;
    PyObject *keep;       /* what owns the log's memory */
    begin_fn begin;
    end_fn end;
    begin_fn abort;
    void *log;
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
    t->log = (void *)(uintptr_t)log;
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
    long rank = PyLong_AsLong(args[1]);
    long off = nargs == 3 ? PyLong_AsLong(args[2]) : 0;
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
    if (view.ndim != 1 || view.itemsize != t->itemsize || off + n > t->count[rank]) {
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

static void near_release(Near *t)
{
    PyMem_Free(t->base);
    PyMem_Free(t->count);
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
    Py_ssize_t n = PySequence_Size(bases);
    if (n < 0 || PySequence_Size(counts) != n) {
        PyErr_SetString(PyExc_ValueError, "Near: bases and counts differ in length");
        return NULL;
    }
    Near *t = (Near *)type->tp_alloc(type, 0);
    if (t == NULL)
        return NULL;
    t->base = PyMem_Calloc((size_t)n + 1, sizeof(char *));
    t->count = PyMem_Calloc((size_t)n + 1, sizeof(int64_t));
    if (t->base == NULL || t->count == NULL) {
        Py_DECREF(t);
        return PyErr_NoMemory();
    }
    unsigned long long *words = PyMem_Calloc((size_t)n + 1, 2 * sizeof(unsigned long long));
    if (words == NULL) {
        Py_DECREF(t);
        return PyErr_NoMemory();
    }
    if (read_words(bases, n, words) < 0 || read_words(counts, n, words + n) < 0) {
        PyMem_Free(words);
        Py_DECREF(t);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        t->base[i] = (char *)(uintptr_t)words[i];
        t->count[i] = (int64_t)words[n + i];
    }
    PyMem_Free(words);
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

static PyObject *near_wrapped(Near *t, void *closure) { return ref_or_none(t->fallback); }

static PyMethodDef near_methods[] = {
    {"close", (PyCFunction)near_close, METH_NOARGS, "send every later call to the fallback"},
    {NULL}
};

WRAPPED_ONLY(near, "the Python method");

static PyTypeObject NearType = {
    CALLABLE(Near, near, "Near",
             "Near(ndarray, dtype, fallback, bases, counts, itemsize, get): Put or Get on this node"),
    .tp_methods = near_methods,
};

/* ------------------------------------------------------------------ Halo hot paths */

typedef int (*xchg_update_fn)(void *, void *, void *, uint64_t);
typedef int (*xchg_both_fn)(void *, void *, void *, uint64_t, int, int);
typedef int (*zc_update_fn)(void *, void *, void *, void *, int64_t, void *, uint64_t);

enum { HOT_UPDATE = 0, HOT_ZC = 1, HOT_REVERSE = 2 };

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
    hot_array arr[HOT_ARRAYS];
    int narr, next;       /* arrays held; the slot the next one replaces */
    PyObject *fallback;   /* Halo.update or Halo.reverse (the function) */
    PyObject *error;      /* error(rc): raises the exception of a failed call */
    PyObject *op;         /* reverse: the op string of the hot call */
    PyObject *keep;       /* what owns the profile log's memory, or None */
    int kind, d, opcode, closed, default_op, bound;
    void (*pbegin)(void);      /* a profile records the hot calls (hybridmpi.profile): */
    int (*pend)(void *);       /* hm_prof_begin, hm_prof_end, hm_prof_abort and the log */
    void (*pabort)(void);
    void *plog;
    void *fn;
    void *a[4];
    int64_t tagval;
    char *buf;
    Py_ssize_t len, itemsize, shape[2];
    int ndim;
    char format[8];
    vectorcallfunc vectorcall;
} Hot;

static PyObject *s_pending, *s_broken, *s_epoch, *s_current, *small_int[2];

static int attr_is_none(PyObject *o, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) {
        PyErr_Clear();
        return 0;
    }
    int none = v == Py_None;
    Py_DECREF(v);
    return none;
}

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
    if (!attr_is_none(t->halo, s_pending) || !attr_is_none(t->halo, s_broken))
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
    /* e = halo._epoch[d] + 1 (stored back), halo._current = d */
    PyObject *ep = PyObject_GetAttr(t->halo, s_epoch);
    if (ep == NULL || !PyList_CheckExact(ep) || PyList_GET_SIZE(ep) != 2) {
        Py_XDECREF(ep);
        PyErr_Clear();
        goto slow;
    }
    if (t->plog)
        t->pbegin();
    uint64_t e = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(ep, t->d)) + 1;
    PyObject *ne = PyErr_Occurred() ? NULL : PyLong_FromUnsignedLongLong(e);
    if (ne == NULL) {
        Py_DECREF(ep);
        if (t->plog)
            t->pabort();
        return NULL;
    }
    PyList_SetItem(ep, t->d, ne);
    Py_DECREF(ep);
    if (PyObject_SetAttr(t->halo, s_current, small_int[t->d]) < 0) {
        if (t->plog)
            t->pabort();
        return NULL;
    }
    int rc;
    if (t->kind == HOT_UPDATE)
        rc = ((xchg_update_fn)t->fn)(t->a[0], t->a[1], buf, e);
    else if (t->kind == HOT_ZC)
        rc = ((zc_update_fn)t->fn)(t->a[0], t->a[1], t->a[2], t->a[3], t->tagval, buf, e);
    else
        rc = ((xchg_both_fn)t->fn)(t->a[0], t->a[1], buf, e, t->opcode, t->d);
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
    PyObject *halo, *x, *fb, *err, *op, *addrs, *prof = Py_None;
    int kind, d, opcode;
    unsigned long long fn, buf;
    long long tagval;
    if (!PyArg_ParseTuple(args, "OOOOOiiiKOKL|O", &halo, &x, &fb, &err, &op, &kind, &d, &opcode,
                          &fn, &addrs, &buf, &tagval, &prof))
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
    t->pbegin = (void (*)(void))(uintptr_t)pa[0];
    t->pend = (int (*)(void *))(uintptr_t)pa[1];
    t->pabort = (void (*)(void))(uintptr_t)pa[2];
    t->plog = (void *)(uintptr_t)pa[3];
    t->vectorcall = hot_vectorcall;
    return (PyObject *)t;
}

/* The object references a Hot holds besides its arrays (for the collector). */
#define HOT_REFS(DO) DO(t->halo); DO(t->fallback); DO(t->error); DO(t->op); DO(t->keep)

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

static void hot_dealloc(Hot *t)
{
    PyObject_GC_UnTrack(t);
    hot_clear(t);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

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
             "Hot(halo, x, fallback, error, op, kind, d, opcode, fn, addrs, buf, tag[, prof]): "
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
    if (PyType_Ready(&TimedType) < 0 || PyType_Ready(&NearType) < 0 || PyType_Ready(&HotType) < 0)
        return NULL;
    dtype_name = PyUnicode_InternFromString("dtype");
    s_pending = PyUnicode_InternFromString("_pending");
    s_broken = PyUnicode_InternFromString("_broken");
    s_epoch = PyUnicode_InternFromString("_epoch");
    s_current = PyUnicode_InternFromString("_current");
    small_int[0] = PyLong_FromLong(0);
    small_int[1] = PyLong_FromLong(1);
    if (!dtype_name || !s_pending || !s_broken || !s_epoch || !s_current || !small_int[0] ||
        !small_int[1])
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    PyTypeObject *types[] = {&TimedType, &NearType, &HotType};
    const char *names[] = {"Timed", "Near", "Hot"};
    for (int i = 0; i < 3; i++) {
        if (PyModule_AddObject(m, names[i], ref((PyObject *)types[i])) < 0) {
            Py_DECREF(types[i]);
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
