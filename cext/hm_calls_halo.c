/* hybridmpi._native._calls: the Halo's, State (the one owner of its per-call state) and Hot
 * (Halo.update or reverse of the arrays last exchanged, as one C call) (hm_calls_common.h). */
#include "hm_calls_common.h"

/* The C core's calls, passed by address (they live in hybridmpi._native._core), typed by its header. */
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

#define STATE_REFS(DO) DO(t->pending); DO(t->broken)
GC_REFS(State, state, STATE_REFS)

GC_DEALLOC(State, state);

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

PyTypeObject StateType = {
    GC_TYPE(State, state, "State",
            "State(): a Halo's epochs, current direction, pending begin and broken state"),
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
    State *state;         /* the Halo's State */
    hot_array arr[HOT_ARRAYS];
    int narr, next;       /* arrays held; the slot the next one replaces */
    PyObject *error;      /* error(rc): raises the exception of a failed call */
    PyObject *op;         /* reverse: the op string of the hot call */
    int kind, d, opcode, closed, default_op;
    void *fn;
    void *a[4];
    int64_t tagval;
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

/* The checks of Halo.update's hot path (args: the Halo, x[, op]): one of the hot array
 * objects, no begin pending, not broken, still writeable, C-contiguous, of the same memory,
 * dtype (format) and shape.  Returns that array's slot, or -1. */
static int hot_ok(Hot *t, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    int i = 0;
    while (i < t->narr && args[1] != t->arr[i].x)
        i++;
    if (t->closed || kwnames != NULL || i == t->narr)
        return -1;
    if (t->kind == HOT_REVERSE) {
        if (nargs == 3 ? args[2] != t->op : !t->default_op)
            return -1;
    } else if (nargs != 2) {
        return -1;
    }
    if (t->state->pending != NULL || t->state->broken != NULL)
        return -1;
    Py_buffer v;
    if (PyObject_GetBuffer(args[1], &v, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
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
    int slot = nargs < 2 || nargs > 3 ? -1 : hot_ok(t, args, nargs, kwnames);
    if (slot < 0)
        Py_RETURN_NOTIMPLEMENTED;
    char *buf = t->arr[slot].buf;
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
}

static PyObject *hot_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *state, *x, *err, *plan, *op, *addrs;
    int kind, d, opcode;
    unsigned long long fn, buf;
    long long tagval;
    if (!PyArg_ParseTuple(args, "O!OKOO!:Hot", &StateType, &state, &x, &buf, &err, &PyTuple_Type, &plan))
        return NULL;
    if (!PyArg_ParseTuple(plan, "iiiOKOL:Hot plan", &kind, &d, &opcode, &op, &fn, &addrs, &tagval))
        return NULL;
    if (kind < HOT_UPDATE || kind > HOT_REVERSE || d < 0 || d > 1 || fn == 0) {
        PyErr_SetString(PyExc_ValueError, "Hot: bad kind, direction or function");
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
    t->state = (State *)ref(state);
    t->error = ref(err);
    t->op = ref(op);
    t->default_op = PyUnicode_Check(op) && PyUnicode_CompareWithASCIIString(op, "add") == 0;
    t->kind = kind;
    t->d = d;
    t->opcode = opcode;
    t->fn = (void *)(uintptr_t)fn;
    t->tagval = tagval;
    t->vectorcall = hot_vectorcall;
    return (PyObject *)t;
}

/* The object references a Hot holds besides its arrays (for the collector). */
#define HOT_REFS(DO) DO(t->state); DO(t->error); DO(t->op)

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

static PyMethodDef hot_methods[] = {
    {"add", (PyCFunction)hot_add, METH_O, "serve this array too"},
    {"close", (PyCFunction)hot_close, METH_NOARGS, "decline every later call (the method serves it)"},
    {NULL}
};

PyTypeObject HotType = {
    CALLABLE(Hot, hot, "Hot",
             "Hot(state, x, buf, error, plan): what serves Halo.update or reverse of one array, as "
             "one C call; plan = (kind, d, opcode, op, fn, addrs, tag)"),
    .tp_traverse = (traverseproc)hot_traverse,
    .tp_clear = (inquiry)hot_clear,
    .tp_methods = hot_methods,
};


int hm_calls_halo_init(void)
{
    HotType.tp_flags |= Py_TPFLAGS_HAVE_GC;
    return PyType_Ready(&HotType) < 0 || PyType_Ready(&StateType) < 0 ? -1 : 0;
}
