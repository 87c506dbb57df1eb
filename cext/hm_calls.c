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
 *   Hot: Halo.update or reverse of the arrays last exchanged (State: the Halo's epochs). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <structmember.h>

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
 * whose functions are PREFIX_new and PREFIX_dealloc). */
#define CALLABLE(T, PREFIX, NAME, DOC)                                                          \
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hybridmpi._native._calls." NAME,                         \
    .tp_basicsize = sizeof(T), .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,     \
    .tp_vectorcall_offset = offsetof(T, vectorcall), .tp_call = PyVectorcall_Call, .tp_doc = DOC, \
    .tp_new = PREFIX##_new, .tp_dealloc = (destructor)PREFIX##_dealloc

/* A new reference to `o`, or to None when it is NULL. */
static PyObject *ref_or_none(PyObject *o)
{
    if (o == NULL)
        Py_RETURN_NONE;
    Py_INCREF(o);
    return o;
}

/* PREFIX_dealloc of a type the garbage collector tracks: untrack, PREFIX_clear, free. */
#define GC_DEALLOC(T, PREFIX)                                                                   \
    static void PREFIX##_dealloc(T *t)                                                          \
    {                                                                                           \
        PyObject_GC_UnTrack(t);                                                                 \
        PREFIX##_clear(t);                                                                      \
        Py_TYPE(t)->tp_free((PyObject *)t);                                                     \
    }

/* PREFIX_traverse and PREFIX_clear of a type T whose object references are REFS(DO), which
 * applies DO (Py_VISIT or Py_CLEAR) to each of the object t's. */
#define GC_REFS(T, PREFIX, REFS)                                                                \
    static int PREFIX##_traverse(T *t, visitproc visit, void *arg)                              \
    {                                                                                           \
        REFS(Py_VISIT);                                                                         \
        return 0;                                                                               \
    }                                                                                           \
    static int PREFIX##_clear(T *t)                                                             \
    {                                                                                           \
        REFS(Py_CLEAR);                                                                         \
        return 0;                                                                               \
    }

/* The fields of a type the garbage collector tracks that is not called (its functions are
 * PREFIX_new, _dealloc, _traverse and _clear, its tables PREFIX_methods and _getset). */
#define GC_TYPE(T, PREFIX, NAME, DOC)                                                           \
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hybridmpi._native._calls." NAME,                 \
    .tp_basicsize = sizeof(T), .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,             \
    .tp_doc = DOC, .tp_new = PREFIX##_new, .tp_dealloc = (destructor)PREFIX##_dealloc,          \
    .tp_traverse = (traverseproc)PREFIX##_traverse, .tp_clear = (inquiry)PREFIX##_clear,        \
    .tp_methods = PREFIX##_methods, .tp_getset = PREFIX##_getset

/* close() (PREFIX_close) of a call object that has nothing more. */
#define CLOSE_ONLY(PREFIX)                                                                      \
    static PyMethodDef PREFIX##_methods[] = {                                                   \
        {"close", (PyCFunction)PREFIX##_close, METH_NOARGS,                                     \
         "decline every later call (the method serves it)"},                                    \
        {NULL}}

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

static PyTypeObject CollType, HotType, NearType;

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

typedef struct {
    PyObject_HEAD
    PyObject *ndarray;
    PyObject *dtype;
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
    if (kwnames != NULL || nargs < 3 || nargs > 4 || t->base == NULL)
        goto slow;
    PyObject *a = args[1];
    if ((PyObject *)Py_TYPE(a) != t->ndarray || !PyLong_CheckExact(args[2]) ||
        (nargs == 4 && !PyLong_CheckExact(args[3])))
        goto slow;
    long long rank = PyLong_AsLongLong(args[2]);
    long long off = nargs == 4 ? PyLong_AsLongLong(args[3]) : 0;
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
    Py_RETURN_NOTIMPLEMENTED;
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
    PyObject *nd, *dt, *bases, *counts;
    Py_ssize_t itemsize;
    int get;
    if (!PyArg_ParseTuple(args, "OOOOnp", &nd, &dt, &bases, &counts, &itemsize, &get))
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
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyObject *near_close(Near *t, PyObject *unused)
{
    near_release(t);
    Py_RETURN_NONE;
}

CLOSE_ONLY(near);

static PyTypeObject NearType = {
    CALLABLE(Near, near, "Near",
             "Near(ndarray, dtype, bases, counts, itemsize, get): Put or Get on this node"),
    .tp_methods = near_methods,
};

/* ------------------------------------------------------------------ collectives */

/* Coll(kind, st, fn, fail, ops[, arrays]): what serves, on one node or off a leader across
 * nodes, as one C call:
 *   kind 0: HybridComm.barrier() (fn = hm_barrier_dissemination or the node's tree; no
 *           arguments, or method="dissemination");
 *   kind 1: allreduce(x[, op]) of a float (fn = hm_allreduce_rd_f64 or hm_allreduce_f64) and,
 *           with `arrays`, of a numpy array (a new array back);
 *   kind 2: Allreduce(sendbuf, recvbuf[, op]) of numpy arrays (sendbuf may be MPI.IN_PLACE).
 * `arrays` = (node, any, ndarray, dtypes, in_place, mpi_ops): hm_allreduce_node's address and
 * its `any`, the ndarray type, a dict numpy dtype -> type code, MPI.IN_PLACE, and MPI.SUM,
 * PROD, MIN, MAX (taken by identity for codes 0-3).  An op is a key of `ops` (a name) or one
 * of those.  It declines any other call (keywords, another type, a buffer that is not
 * C-contiguous or writeable, min or max of complex, an unknown op: the method checks and
 * raises); a call the C core failed goes to fail(code), which raises its error.  close()
 * declines every later call (the comm freed or broken). */
typedef __typeof__(hm_barrier_dissemination) *barrier_fn;
typedef __typeof__(hm_allreduce_rd_f64) *allreduce_fn;
typedef __typeof__(hm_allreduce_node) *node_fn;

typedef struct {
    PyObject_HEAD
    hm_coll *st;          /* NULL once closed */
    void *fn;
    node_fn node;         /* NULL: no arrays */
    int kind, any;
    PyObject *fail;
    PyObject *ops;        /* dict: op name -> code */
    PyObject *ndarray, *dtypes, *in_place, *mpi_ops;
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

static PyObject *method_name, *dissemination_name, *copy_name;

/* Whether the keywords are method="dissemination" (value: the keyword's value). */
static int dissemination(PyObject *kwnames, PyObject *value)
{
    if (PyTuple_GET_SIZE(kwnames) != 1 || !PyUnicode_CheckExact(value))
        return 0;
    PyObject *key = PyTuple_GET_ITEM(kwnames, 0);
    return (key == method_name || PyUnicode_Compare(key, method_name) == 0) &&
           (value == dissemination_name || PyUnicode_Compare(value, dissemination_name) == 0);
}

/* The code of op `o` (a name in t->ops, or one of t->mpi_ops), or -1 (no error set). */
static int coll_op(Coll *t, PyObject *o)
{
    if (PyUnicode_CheckExact(o)) {
        PyObject *code = PyDict_GetItemWithError(t->ops, o);
        if (code == NULL) {
            PyErr_Clear();
            return -1;
        }
        return (int)PyLong_AsLong(code);
    }
    if (t->mpi_ops != NULL)
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t->mpi_ops); i++)
            if (PyTuple_GET_ITEM(t->mpi_ops, i) == o)
                return (int)i;
    return -1;
}

/* The type code of numpy array `a` (exactly an ndarray, of a dtype of t->dtypes that takes
 * `op`), or -1 (no error set). */
static int coll_dtype(Coll *t, PyObject *a, int op)
{
    if ((PyObject *)Py_TYPE(a) != t->ndarray)
        return -1;
    PyObject *dt = PyObject_GetAttr(a, dtype_name);
    if (dt == NULL) {
        PyErr_Clear();
        return -1;
    }
    PyObject *code = PyDict_GetItemWithError(t->dtypes, dt);
    Py_DECREF(dt);
    if (code == NULL) {
        PyErr_Clear();
        return -1;
    }
    int c = (int)PyLong_AsLong(code);
    return c == HM_C128 && op >= HM_MIN ? -1 : c;
}

/* The node's allreduce of numpy arrays `send` (NULL: in place) into `recv`, as one call of the
 * C core: None, NotImplemented (declined), or NULL with the call's error. */
static PyObject *coll_arrays(Coll *t, PyObject *send, PyObject *recv, int op)
{
    int dt = coll_dtype(t, recv, op);
    if (dt < 0 || (send != NULL && coll_dtype(t, send, op) != dt))
        Py_RETURN_NOTIMPLEMENTED;
    Py_buffer rv, sv;
    if (PyObject_GetBuffer(recv, &rv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    if (send != NULL) {
        if (PyObject_GetBuffer(send, &sv, PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Clear();
            PyBuffer_Release(&rv);
            Py_RETURN_NOTIMPLEMENTED;
        }
        /* sizes that differ, or buffers that overlap without being the same (MPI calls both
         * erroneous): the method raises on every rank */
        const char *sb = sv.buf, *rb = rv.buf;
        if (sv.len != rv.len || (sb != rb && sb < rb + rv.len && rb < sb + sv.len)) {
            PyBuffer_Release(&sv);
            PyBuffer_Release(&rv);
            Py_RETURN_NOTIMPLEMENTED;
        }
    }
    uint64_t count = rv.itemsize > 0 ? (uint64_t)rv.len / (uint64_t)rv.itemsize : 0;
    int rc;
    hm_coll *st = t->st;  /* close() may clear t->st meanwhile */
    const void *sbuf = send != NULL ? sv.buf : rv.buf;
    Py_BEGIN_ALLOW_THREADS
    rc = t->node(st, sbuf, rv.buf, count, dt, op, t->any);
    Py_END_ALLOW_THREADS
    if (send != NULL)
        PyBuffer_Release(&sv);
    PyBuffer_Release(&rv);
    if (rc)
        return coll_failed(t, rc);
    Py_RETURN_NONE;
}

static PyObject *coll_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames)
{
    Coll *t = (Coll *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (t->fail == NULL) {  /* cleared by the garbage collector */
        PyErr_SetString(PyExc_RuntimeError, "hybridmpi: the HybridComm of this call is gone");
        return NULL;
    }
    if (t->st == NULL)
        goto slow;
    if (t->kind == 0) {   /* barrier() or barrier(method="dissemination") */
        if (nargs != 1 || (kwnames != NULL && !dissemination(kwnames, args[1])))
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
    int first = t->kind == 2 ? 3 : 2;   /* the index of the op, if passed */
    if (kwnames != NULL || nargs < first || nargs > first + 1)
        goto slow;
    int op = nargs > first ? coll_op(t, args[first]) : HM_SUM;
    if (op < 0)
        goto slow;
    if (t->kind == 2) {   /* Allreduce(sendbuf, recvbuf[, op]) */
        if (t->node == NULL)
            goto slow;
        return coll_arrays(t, args[1] == t->in_place ? NULL : args[1], args[2], op);
    }
    if (!PyFloat_CheckExact(args[1])) {   /* allreduce(array[, op]): into a new array */
        if (t->node == NULL || (PyObject *)Py_TYPE(args[1]) != t->ndarray || coll_dtype(t, args[1], op) < 0)
            goto slow;
        PyObject *out = PyObject_CallMethodNoArgs(args[1], copy_name);   /* C order */
        if (out == NULL) {   /* (no memory): the method fails it on every rank */
            PyErr_Clear();
            goto slow;
        }
        PyObject *r = coll_arrays(t, NULL, out, op);
        if (r != Py_None) {   /* failed, or declined: the method reads the argument again */
            Py_DECREF(out);
            return r;
        }
        Py_DECREF(r);
        return out;
    }
    double x = PyFloat_AS_DOUBLE(args[1]), r;
    hm_coll *st = t->st;  /* close() may clear t->st meanwhile */
    Py_BEGIN_ALLOW_THREADS
    r = ((allreduce_fn)t->fn)(st, x, op);
    Py_END_ALLOW_THREADS
    if (r != r && st->err.code)
        return coll_failed(t, st->err.code);
    return PyFloat_FromDouble(r);
slow:
    Py_RETURN_NOTIMPLEMENTED;
}

static PyObject *coll_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    int kind;
    unsigned long long st, fn;
    PyObject *fail, *ops, *arrays = Py_None;
    if (!PyArg_ParseTuple(args, "iKKOO!|O", &kind, &st, &fn, &fail, &PyDict_Type, &ops, &arrays))
        return NULL;
    if (kind < 0 || kind > 2) {
        PyErr_Format(PyExc_ValueError, "Coll: kind must be 0 (barrier), 1 (allreduce) or 2 "
                                       "(Allreduce), got %d", kind);
        return NULL;
    }
    unsigned long long node = 0;
    int any = 0;
    PyObject *nd = NULL, *dtypes = NULL, *in_place = NULL, *mpi_ops = NULL;
    if (arrays != Py_None &&
        !PyArg_ParseTuple(arrays, "KpOO!OO!:Coll arrays", &node, &any, &nd, &PyDict_Type, &dtypes,
                          &in_place, &PyTuple_Type, &mpi_ops))
        return NULL;
    if (st == 0 || (fn == 0 && kind != 2) || (arrays != Py_None && node == 0) ||
        (kind == 2 && arrays == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "Coll: st, fn (kinds 0, 1) and the arrays' node "
                                          "function (kind 2) must be addresses");
        return NULL;
    }
    Coll *t = (Coll *)type->tp_alloc(type, 0);
    if (t == NULL)
        return NULL;
    t->st = (hm_coll *)(uintptr_t)st;
    t->fn = (void *)(uintptr_t)fn;
    t->node = (node_fn)(uintptr_t)node;
    t->kind = kind;
    t->any = any;
    t->fail = ref(fail);
    t->ops = ref(ops);
    if (arrays != Py_None) {
        t->ndarray = ref(nd);
        t->dtypes = ref(dtypes);
        t->in_place = ref(in_place);
        t->mpi_ops = ref(mpi_ops);
    }
    t->vectorcall = coll_vectorcall;
    return (PyObject *)t;
}

/* fail reaches the comm's Collectives, whose comm's _calls table holds this object: a cycle,
 * which the garbage collector sees through these. */
#define COLL_REFS(DO) DO(t->fail); DO(t->ops); DO(t->ndarray); DO(t->dtypes); DO(t->in_place); \
    DO(t->mpi_ops)
static int coll_traverse(Coll *t, visitproc visit, void *arg)
{
    COLL_REFS(Py_VISIT);
    return 0;
}

static int coll_clear(Coll *t)
{
    t->st = NULL;
    COLL_REFS(Py_CLEAR);
    return 0;
}

GC_DEALLOC(Coll, coll);

static PyObject *coll_close(Coll *t, PyObject *unused)
{
    t->st = NULL;
    Py_RETURN_NONE;
}

CLOSE_ONLY(coll);

static PyTypeObject CollType = {
    CALLABLE(Coll, coll, "Coll",
             "Coll(kind, st, fn, fail, ops[, arrays]): barrier(), allreduce(x[, op]) of a float "
             "or an array, or Allreduce(sendbuf, recvbuf[, op]) as one C call"),
    .tp_methods = coll_methods,
    .tp_traverse = (traverseproc)coll_traverse,
    .tp_clear = (inquiry)coll_clear,
};

/* ------------------------------------------------------------------ Halo hot paths */

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

static PyTypeObject StateType = {
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

static PyTypeObject HotType = {
    CALLABLE(Hot, hot, "Hot",
             "Hot(state, x, buf, error, plan): what serves Halo.update or reverse of one array, as "
             "one C call; plan = (kind, d, opcode, op, fn, addrs, tag)"),
    .tp_traverse = (traverseproc)hot_traverse,
    .tp_clear = (inquiry)hot_clear,
    .tp_methods = hot_methods,
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
    HotType.tp_flags |= Py_TPFLAGS_HAVE_GC;
    CollType.tp_flags |= Py_TPFLAGS_HAVE_GC;
    OpType.tp_flags |= Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_METHOD_DESCRIPTOR;
    PyTypeObject *types[] = {&OpType, &CallsType, &NearType, &HotType, &StateType, &CollType};
    const char *names[] = {"Op", "Calls", "Near", "Hot", "State", "Coll"};
    for (int i = 0; i < 6; i++)
        if (PyType_Ready(types[i]) < 0)
            return NULL;
    dtype_name = PyUnicode_InternFromString("dtype");
    method_name = PyUnicode_InternFromString("method");
    dissemination_name = PyUnicode_InternFromString("dissemination");
    copy_name = PyUnicode_InternFromString("copy");
    if (!dtype_name || !method_name || !dissemination_name || !copy_name)
        return NULL;
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
