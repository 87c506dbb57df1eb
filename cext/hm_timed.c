/* hybridmpi._timed: the profile's call wrapper (hybridmpi.profile) in C, so that a
 * profiled call costs two clock reads and one record instead of several Python calls.
 *
 * Timed(fn, begin, end, log) is callable: it calls begin(), then fn(*args, **kw), then
 * end(log) (or abort() when fn raised) — the C core's hm_prof_begin, hm_prof_end and
 * hm_prof_abort, passed as addresses because they live in another shared object. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

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

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "hybridmpi._timed",
                                    "The profile's call wrapper.", -1, NULL};

PyMODINIT_FUNC PyInit__timed(void)
{
    if (PyType_Ready(&TimedType) < 0)
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
    return m;
}
