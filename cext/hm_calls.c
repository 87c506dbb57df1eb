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
 * One file per object: this one the operations (Op, Calls) and the module; hm_calls_coll.c,
 * hm_calls_halo.c, hm_calls_near.c what serves them (hm_calls.h: what they share). */
#include "hm_calls.h"

/* The profile's clock: hm_prof_begin, hm_prof_end_bytes and hm_prof_abort of the C core (they
 * live in hybridmpi._native._core), given once by set_clock when the package loads. */
typedef __typeof__(hm_prof_begin) *begin_fn;
typedef __typeof__(hm_prof_end_bytes) *end_fn;
static begin_fn prof_begin, prof_abort;
static end_fn prof_end;

/* set_clock(begin, end_bytes, abort): the profile clock's functions, by address. */
static PyObject *set_clock(PyObject *module, PyObject *args)
{
    unsigned long long b, e, a;
    if (!PyArg_ParseTuple(args, "KKK:set_clock", &b, &e, &a))
        return NULL;
    if (b == 0 || e == 0 || a == 0) {
        PyErr_SetString(PyExc_ValueError, "set_clock: three function addresses");
        return NULL;
    }
    prof_begin = (begin_fn)(uintptr_t)b;
    prof_end = (end_fn)(uintptr_t)e;
    prof_abort = (begin_fn)(uintptr_t)a;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ operations */

/* The most operations one class declares (GlobalMemory: 9). */
#define CALLS_MAX 12

/* What a profile records of one operation: its log, and how a call's record ends. */
typedef struct {
    hm_prof_log *log;     /* NULL: not recorded */
    PyObject *finish;     /* finish(out, *args, **kw): the call's bytes (None, or NULL: the log's) */
    PyObject *keep;       /* what owns the log's memory */
} recording;

/* Calls(names): one object's table of its operations, held in its `_calls` slot: the C call
 * object that serves each (or none), what runs it otherwise (a method of an object the owner
 * holds, or the class's method), and what a profile records of each.  The object edits it
 * (serve, delegate, close); the profile records through it (record, unrecord). */
typedef struct {
    PyObject_HEAD
    PyObject *names;             /* tuple of str, in the operations' index order */
    Py_ssize_t n;
    PyObject *fast[CALLS_MAX];   /* serves the operation (returns NotImplemented to decline) */
    vectorcallfunc own[CALLS_MAX];  /* fast's function when it is this module's (Coll, Hot,
                                     * Near: called directly; they decline before running Python) */
    PyObject *then[CALLS_MAX];   /* runs it when nothing serves it, without the object (else
                                  * the class's method runs it, with the object) */
    recording rec[CALLS_MAX];
} Calls;

static PyTypeObject CallsType;

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
    if (log <= 0 || prof_begin == NULL || (finish != Py_None && !PyCallable_Check(finish))) {
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

static PyTypeObject CallsType = {
    GC_TYPE(Calls, calls, "Calls",
            "Calls(names): an object's operations: what serves each, what a profile records"),
};

/* Op(owner, method, index): operation `index` of class `owner` (HybridComm.barrier,
 * Halo.update, ...), a method of the class: obj.op(*args) is one C call.  It goes to the call
 * object that serves the operation in obj's `_calls` table, then (none, or it declined) to
 * what the table delegates it to, else to `method`, the Python function; while a profile
 * records the operation, the call is timed into its log: one load and branch when it does
 * not. */
typedef struct {
    PyObject_HEAD
    PyTypeObject *owner;
    PyObject *method;
    Py_ssize_t offset;    /* of the `_calls` slot in owner's instances */
    Py_ssize_t index;
    vectorcallfunc vectorcall;
} Op;

static PyTypeObject OpType;

/* Run a call of op with obj's table c (held: a call may replace obj's table). */
static PyObject *op_serve(Op *op, Calls *c, int declined, PyObject *const *args, size_t nargsf,
                          PyObject *kwnames)
{
    PyObject *fast = c->fast[op->index];
    vectorcallfunc own = c->own[op->index];
    if (fast != NULL && !(declined && own != NULL)) {   /* (declined: own's, just now) */
        Py_INCREF(fast);   /* served to the end even when its object closes it meanwhile */
        PyObject *out = own != NULL ? own(fast, args, nargsf, kwnames)
                                    : PyObject_Vectorcall(fast, args, nargsf, kwnames);
        Py_DECREF(fast);
        if (out != Py_NotImplemented)
            return out;
        Py_DECREF(out);
    }
    PyObject *then = c->then[op->index];
    if (then != NULL) {
        Py_INCREF(then);
        PyObject *out = PyObject_Vectorcall(then, args + 1, PyVectorcall_NARGS(nargsf) - 1, kwnames);
        Py_DECREF(then);
        return out;
    }
    return PyObject_Vectorcall(op->method, args, nargsf, kwnames);
}

/* finish(out, *args[1:], **kw) of a recorded call. */
static PyObject *op_finish(PyObject *finish, PyObject *out, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames)
{
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0, n = nargs + nk;
    PyObject *small[16], **stack = n <= 16 ? small : PyMem_Malloc((size_t)n * sizeof(PyObject *));
    if (stack == NULL)
        return PyErr_NoMemory();
    stack[0] = out;
    for (Py_ssize_t i = 1; i < n; i++)
        stack[i] = args[i];
    PyObject *r = PyObject_Vectorcall(finish, stack, (size_t)nargs, kwnames);
    if (stack != small)
        PyMem_Free(stack);
    return r;
}

/* A recorded call of op: timed into the log of r (what the record needs stays alive if the
 * profile ends inside the call). */
static PyObject *op_recorded(Op *op, Calls *c, recording *r, PyObject *const *args, size_t nargsf,
                             PyObject *kwnames)
{
    hm_prof_log *log = r->log;
    PyObject *finish = r->finish, *keep = r->keep;
    Py_XINCREF(finish);
    Py_XINCREF(keep);
    prof_begin();
    PyObject *out = op_serve(op, c, 0, args, nargsf, kwnames);
    int64_t nbytes = log->nbytes;
    if (out != NULL && finish != NULL) {
        PyObject *n = op_finish(finish, out, args, PyVectorcall_NARGS(nargsf), kwnames);
        if (n != NULL && n != Py_None)
            nbytes = PyLong_AsLongLong(n);
        if (n == NULL || (nbytes == -1 && PyErr_Occurred()))
            Py_CLEAR(out);
        Py_XDECREF(n);
    }
    if (out == NULL)
        prof_abort();   /* the clock's depth stays right whatever failed */
    else
        prof_end(log, nbytes);
    Py_XDECREF(finish);
    Py_XDECREF(keep);
    return out;
}

static PyObject *op_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames)
{
    Op *op = (Op *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 1 || !PyObject_TypeCheck(args[0], op->owner))
        return PyObject_Vectorcall(op->method, args, nargsf, kwnames);
    Calls *c = *(Calls **)((char *)args[0] + op->offset);
    if (c == NULL || !Py_IS_TYPE(c, &CallsType) || op->index >= c->n)
        return PyObject_Vectorcall(op->method, args, nargsf, kwnames);
    recording *r = &c->rec[op->index];
    vectorcallfunc own = c->own[op->index];
    PyObject *fast = c->fast[op->index];
    int declined = 0;
    if (r->log == NULL && own != NULL && fast != NULL) {
        /* the hot path: this module's call object, called directly */
        Py_INCREF(fast);   /* its object may close it while the call waits without the GIL */
        PyObject *out = own(fast, args, nargsf, kwnames);
        Py_DECREF(fast);
        if (out != Py_NotImplemented)
            return out;
        Py_DECREF(out);
        /* it declined: the table again (it runs no Python before it declines today, but the
         * buffer protocol may one day), without that object if it still serves */
        c = *(Calls **)((char *)args[0] + op->offset);
        if (c == NULL || !Py_IS_TYPE(c, &CallsType) || op->index >= c->n)
            return PyObject_Vectorcall(op->method, args, nargsf, kwnames);
        r = &c->rec[op->index];
        declined = c->fast[op->index] == fast && c->own[op->index] == own;
    }
    if (Py_EnterRecursiveCall(" in a hybridmpi operation"))
        return NULL;
    Py_INCREF(c);
    PyObject *out = r->log == NULL ? op_serve(op, c, declined, args, nargsf, kwnames)
                                   : op_recorded(op, c, r, args, nargsf, kwnames);
    Py_DECREF(c);
    Py_LeaveRecursiveCall();
    return out;
}

static PyObject *op_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyTypeObject *owner;
    PyObject *method;
    Py_ssize_t index;
    if (!PyArg_ParseTuple(args, "O!On:Op", &PyType_Type, &owner, &method, &index))
        return NULL;
    if (!PyCallable_Check(method) || index < 0 || index >= CALLS_MAX) {
        PyErr_SetString(PyExc_ValueError, "Op: a callable method and an index below CALLS_MAX");
        return NULL;
    }
    /* the `_calls` slot: a member of owner's instances (declared in its __slots__) */
    PyObject *slot = PyObject_GetAttrString((PyObject *)owner, "_calls");
    if (slot == NULL)
        return NULL;
    /* ... of owner or a base (a slot of another class would be read past its instances' end) */
    int ok = Py_IS_TYPE(slot, &PyMemberDescr_Type) &&
             ((PyMemberDescrObject *)slot)->d_member->type == T_OBJECT_EX &&
             PyType_IsSubtype(owner, ((PyMemberDescrObject *)slot)->d_common.d_type);
    Py_ssize_t offset = ok ? ((PyMemberDescrObject *)slot)->d_member->offset : 0;
    Py_DECREF(slot);
    if (!ok) {
        PyErr_SetString(PyExc_TypeError, "Op: the owner declares `_calls` in its __slots__");
        return NULL;
    }
    Op *op = (Op *)type->tp_alloc(type, 0);
    if (op == NULL)
        return NULL;
    op->owner = (PyTypeObject *)ref((PyObject *)owner);
    op->method = ref(method);
    op->offset = offset;
    op->index = index;
    op->vectorcall = op_vectorcall;
    return (PyObject *)op;
}

/* obj.op: bound to obj (the class's attribute: the Op itself). */
static PyObject *op_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return ref(self);
    return PyMethod_New(self, obj);
}

#define OP_REFS(DO) DO(t->owner); DO(t->method)
GC_REFS(Op, op, OP_REFS)

GC_DEALLOC(Op, op);

/* __doc__, __name__, __qualname__ and __module__: the method's (docs, help(), inspect). */
static PyObject *op_attr(Op *op, void *name)
{
    if (op->method == NULL)
        Py_RETURN_NONE;
    return PyObject_GetAttrString(op->method, (const char *)name);
}

static PyObject *op_wrapped(Op *op, void *closure) { return ref_or_none(op->method); }

static PyGetSetDef op_getset[] = {
    {"__doc__", (getter)op_attr, NULL, NULL, "__doc__"},
    {"__name__", (getter)op_attr, NULL, NULL, "__name__"},
    {"__qualname__", (getter)op_attr, NULL, NULL, "__qualname__"},
    {"__module__", (getter)op_attr, NULL, NULL, "__module__"},
    {"__wrapped__", (getter)op_wrapped, NULL, "the Python method", NULL},
    {NULL}
};

static PyTypeObject OpType = {
    CALLABLE(Op, op, "Op", "Op(owner, method, index): an operation of owner, served by its _calls"),
    .tp_descr_get = op_get,
    .tp_getset = op_getset,
    .tp_traverse = (traverseproc)op_traverse,
    .tp_clear = (inquiry)op_clear,
};

static PyMethodDef module_functions[] = {
    {"set_clock", set_clock, METH_VARARGS, "set_clock(begin, end_bytes, abort): the profile clock"},
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
