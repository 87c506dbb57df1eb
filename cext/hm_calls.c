/* hybridmpi._native._calls: the library's operations as C call objects (a small CPython extension).
 *
 * Op(owner, method, index): an operation of a class (HybridComm.barrier, Halo.update,
 * GlobalMemory.Put, ...), its method: one C call that goes to what serves the operation in
 * the object's Calls table, or to the Python method; while a profile records the operation,
 * it times the call into the profile's log.
 *
 * Calls(names): an object's table of its operations, in its `_calls` slot.
 *
 * What serves an operation (each declines with NotImplemented what it does not serve: the
 * method then checks and raises):
 *   Near: GlobalMemory.Put or Get on a part of this node (a memcpy);
 *   Coll: HybridComm.barrier(), allreduce(float or array) and Allreduce on one node;
 *   Hot: Halo.update or reverse of the arrays last exchanged (State: the Halo's epochs).
 *
 * One file per object: this one the operations' tables (Calls) and the module; hm_calls_op.c
 * the operations (Op) and the profile's clock; hm_calls_coll.c, hm_calls_halo.c,
 * hm_calls_near.c what serves them (hm_calls_common.h: what they share). */
#include "hm_calls_common.h"


/* ------------------------------------------------------------------ operations */



static PyObject *calls_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *names;
    if (!PyArg_ParseTuple(args, "O!:Calls", &PyTuple_Type, &names))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (n > CALLS_MAX) {
        PyErr_Format(PyExc_ValueError, "Calls: at most %d operations, got %zd", CALLS_MAX, n);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyUnicode_Check(PyTuple_GET_ITEM(names, i))) {
            PyErr_SetString(PyExc_TypeError, "Calls: the operations' names are str");
            return NULL;
        }
    Calls *c = (Calls *)type->tp_alloc(type, 0);
    if (c == NULL)
        return NULL;
    c->names = ref(names);
    c->n = n;
    return (PyObject *)c;
}

/* The index of operation `name`, or -1 with a KeyError. */
static Py_ssize_t calls_index(Calls *c, PyObject *name)
{
    for (Py_ssize_t i = 0; i < c->n; i++) {
        int eq = PyUnicode_Check(name) ? PyUnicode_Compare(PyTuple_GET_ITEM(c->names, i), name) : 1;
        if (eq == 0)
            return i;
        if (eq == -1 && PyErr_Occurred())
            return -1;
    }
    PyErr_SetObject(PyExc_KeyError, name);
    return -1;
}

static void calls_unrecord_one(recording *r)
{
    r->log = NULL;
    Py_CLEAR(r->finish);
    Py_CLEAR(r->keep);
}


/* Set table[name] from args (name, callable or None): serve (with own: the function of one of
 * this module's call objects) and delegate. */
static PyObject *calls_put(Calls *c, PyObject *args, PyObject **table, vectorcallfunc *own,
                           const char *what)
{
    PyObject *name, *fn;
    if (!PyArg_UnpackTuple(args, what, 2, 2, &name, &fn))
        return NULL;
    Py_ssize_t i = calls_index(c, name);
    if (i < 0)
        return NULL;
    if (fn != Py_None && !PyCallable_Check(fn)) {
        PyErr_Format(PyExc_TypeError, "Calls.%s: a callable or None", what);
        return NULL;
    }
    /* the table is whole before the old entry goes (its release may run Python that calls) */
    PyObject *old = table[i];
    table[i] = fn == Py_None ? NULL : ref(fn);
    if (own != NULL) {
        PyTypeObject *t = Py_TYPE(fn);
        own[i] = t == &CollType || t == &HotType || t == &NearType ? PyVectorcall_Function(fn) : NULL;
    }
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

/* serve(name, fast): `fast` serves the operation from now on (None: nothing does). */
static PyObject *calls_serve(Calls *c, PyObject *args)
{
    return calls_put(c, args, c->fast, c->own, "serve");
}

/* delegate(name, fn): fn(*args, **kw) runs the operation when nothing serves it (a method of
 * an object the owner holds: the owner is not passed); None: the class's method does. */
static PyObject *calls_delegate(Calls *c, PyObject *args)
{
    return calls_put(c, args, c->then, NULL, "delegate");
}

/* fast(name): what serves the operation, or None. */
static PyObject *calls_fast(Calls *c, PyObject *name)
{
    Py_ssize_t i = calls_index(c, name);
    return i < 0 ? NULL : ref_or_none(c->fast[i]);
}

/* record(name, log, finish, keep): time every call of the operation into `log` (an
 * hm_prof_log address, owned by `keep`); finish(out, *args, **kw) returns each call's bytes
 * (None: the log's nbytes). */
static PyObject *calls_record(Calls *c, PyObject *args)
{
    PyObject *name, *finish, *keep;
    long long log;
    if (!PyArg_ParseTuple(args, "OLOO:record", &name, &log, &finish, &keep))
        return NULL;
    Py_ssize_t i = calls_index(c, name);
    if (i < 0)
        return NULL;
    if (log <= 0 || !hm_calls_clock_set() || (finish != Py_None && !PyCallable_Check(finish))) {
        PyErr_SetString(PyExc_ValueError, "Calls.record: a log's address, finish a callable or "
                                          "None, and the clock set (set_clock)");
        return NULL;
    }
    recording *r = &c->rec[i];
    calls_unrecord_one(r);
    r->finish = finish == Py_None ? NULL : ref(finish);
    r->keep = ref(keep);
    r->log = (hm_prof_log *)(uintptr_t)log;
    Py_RETURN_NONE;
}

/* unrecord(): no operation is recorded. */
static PyObject *calls_unrecord(Calls *c, PyObject *unused)
{
    for (Py_ssize_t i = 0; i < c->n; i++)
        calls_unrecord_one(&c->rec[i]);
    Py_RETURN_NONE;
}

/* close(): every operation goes to its method (the object was freed or broke); each call
 * object that served one is closed, so that a reference kept to it serves nothing either. */
static PyObject *calls_close(Calls *c, PyObject *unused)
{
    PyObject *type = NULL, *value = NULL, *tb = NULL;   /* the first close() that raised */
    for (Py_ssize_t i = 0; i < c->n; i++) {
        PyObject *fast = c->fast[i];
        if (fast == NULL)
            continue;
        c->fast[i] = NULL;
        c->own[i] = NULL;
        PyObject *r = PyObject_CallMethod(fast, "close", NULL);
        Py_DECREF(fast);
        if (r == NULL && type == NULL)
            PyErr_Fetch(&type, &value, &tb);
        PyErr_Clear();   /* every entry is closed; the first error is raised at the end */
        Py_XDECREF(r);
    }
    if (type == NULL)
        Py_RETURN_NONE;
    PyErr_Restore(type, value, tb);
    return NULL;
}

static int calls_traverse(Calls *c, visitproc visit, void *arg)
{
    Py_VISIT(c->names);
    for (Py_ssize_t i = 0; i < c->n; i++) {
        Py_VISIT(c->fast[i]);
        Py_VISIT(c->then[i]);
        Py_VISIT(c->rec[i].finish);
        Py_VISIT(c->rec[i].keep);
    }
    return 0;
}

static int calls_clear(Calls *c)
{
    for (Py_ssize_t i = 0; i < CALLS_MAX; i++) {
        c->own[i] = NULL;   /* before its object goes: the table stays consistent */
        Py_CLEAR(c->fast[i]);
        Py_CLEAR(c->then[i]);
        calls_unrecord_one(&c->rec[i]);
    }
    Py_CLEAR(c->names);
    c->n = 0;
    return 0;
}

GC_DEALLOC(Calls, calls);

/* The names of the operations a profile records now. */
static PyObject *calls_recorded(Calls *c, void *closure)
{
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; out != NULL && i < c->n; i++)
        if (c->rec[i].log != NULL && PyList_Append(out, PyTuple_GET_ITEM(c->names, i)) < 0)
            Py_CLEAR(out);
    if (out == NULL)
        return NULL;
    PyObject *t = PyList_AsTuple(out);
    Py_DECREF(out);
    return t;
}

static PyMethodDef calls_methods[] = {
    {"serve", (PyCFunction)calls_serve, METH_VARARGS, "serve(name, fast): fast serves it (None: the method)"},
    {"fast", (PyCFunction)calls_fast, METH_O, "fast(name): what serves it, or None"},
    {"delegate", (PyCFunction)calls_delegate, METH_VARARGS,
     "delegate(name, fn): fn(*args, **kw) runs it when nothing serves it (None: the method)"},
    {"record", (PyCFunction)calls_record, METH_VARARGS,
     "record(name, log, finish, keep): time its calls into log"},
    {"unrecord", (PyCFunction)calls_unrecord, METH_NOARGS, "record no operation"},
    {"close", (PyCFunction)calls_close, METH_NOARGS, "close every call object: the methods serve all"},
    {NULL}
};

static PyGetSetDef calls_getset[] = {
    {"recorded", (getter)calls_recorded, NULL, "the operations a profile records now", NULL},
    {NULL}
};

PyTypeObject CallsType = {
    GC_TYPE(Calls, calls, "Calls",
            "Calls(names): an object's operations: what serves each, what a profile records"),
};


static PyMethodDef module_functions[] = {
    {"set_clock", hm_calls_set_clock, METH_VARARGS, "set_clock(begin, end_bytes, abort): the profile clock"},
    {NULL}
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "hybridmpi._native._calls",
                                    "The C call objects of the library's operations.", -1,
                                    module_functions};

PyMODINIT_FUNC PyInit__calls(void)
{
    OpType.tp_flags |= Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_METHOD_DESCRIPTOR;
    if (PyType_Ready(&OpType) < 0 || PyType_Ready(&CallsType) < 0 || hm_calls_near_init() < 0 ||
        hm_calls_coll_init() < 0 || hm_calls_halo_init() < 0)
        return NULL;
    PyTypeObject *types[] = {&OpType, &CallsType, &NearType, &HotType, &StateType, &CollType};
    const char *names[] = {"Op", "Calls", "Near", "Hot", "State", "Coll"};
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    for (int i = 0; i < 6; i++) {
        if (PyModule_AddObject(m, names[i], ref((PyObject *)types[i])) < 0) {
            Py_DECREF(types[i]);
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
