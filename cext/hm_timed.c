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

typedef void (*begin_fn)(void);
typedef int (*end_fn)(void *);

typedef struct {
    PyObject_HEAD
    PyObject *fn;
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
    PyObject *fn;
    unsigned long long b, e, a, log;
    if (!PyArg_ParseTuple(args, "OKKKK", &fn, &b, &e, &a, &log))
        return NULL;
    Timed *t = (Timed *)type->tp_alloc(type, 0);
    if (t == NULL)
        return NULL;
    Py_INCREF(fn);
    t->fn = fn;
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
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyObject *timed_wrapped(Timed *t, void *closure)
{
    Py_INCREF(t->fn);
    return t->fn;
}

static PyGetSetDef timed_getset[] = {
    {"__wrapped__", (getter)timed_wrapped, NULL, "the timed callable", NULL},
    {NULL}
};

static PyTypeObject TimedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hybridmpi._timed.Timed",
    .tp_basicsize = sizeof(Timed),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Timed, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = timed_new,
    .tp_dealloc = (destructor)timed_dealloc,
    .tp_getset = timed_getset,
    .tp_doc = "Timed(fn, begin, end, abort, log): fn timed into a profile log",
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
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PySequence_GetItem(bases, i), *c = PySequence_GetItem(counts, i);
        if (b == NULL || c == NULL) {
            Py_XDECREF(b);
            Py_XDECREF(c);
            Py_DECREF(t);
            return NULL;
        }
        t->base[i] = (char *)(uintptr_t)PyLong_AsUnsignedLongLong(b);
        t->count[i] = PyLong_AsLongLong(c);
        Py_DECREF(b);
        Py_DECREF(c);
        if (PyErr_Occurred()) {
            Py_DECREF(t);
            return NULL;
        }
    }
    Py_INCREF(nd);
    Py_INCREF(dt);
    Py_INCREF(fb);
    t->ndarray = nd;
    t->dtype = dt;
    t->fallback = fb;
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

static PyObject *near_wrapped(Near *t, void *closure)
{
    Py_INCREF(t->fallback);
    return t->fallback;
}

static PyMethodDef near_methods[] = {
    {"close", (PyCFunction)near_close, METH_NOARGS, "send every later call to the fallback"},
    {NULL}
};

static PyGetSetDef near_getset[] = {
    {"__wrapped__", (getter)near_wrapped, NULL, "the Python method", NULL},
    {NULL}
};

static PyTypeObject NearType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hybridmpi._timed.Near",
    .tp_basicsize = sizeof(Near),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Near, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = near_new,
    .tp_dealloc = (destructor)near_dealloc,
    .tp_methods = near_methods,
    .tp_getset = near_getset,
    .tp_doc = "Near(ndarray, dtype, fallback, bases, counts, itemsize, get): Put or Get on this node",
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "hybridmpi._timed",
                                    "The profile's call wrapper.", -1, NULL};

PyMODINIT_FUNC PyInit__timed(void)
{
    if (PyType_Ready(&TimedType) < 0 || PyType_Ready(&NearType) < 0)
        return NULL;
    dtype_name = PyUnicode_InternFromString("dtype");
    if (dtype_name == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&TimedType);
    if (PyModule_AddObject(m, "Timed", (PyObject *)&TimedType) < 0) {
        Py_DECREF(&TimedType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&NearType);
    if (PyModule_AddObject(m, "Near", (PyObject *)&NearType) < 0) {
        Py_DECREF(&NearType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
