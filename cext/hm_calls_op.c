/* hybridmpi._native._calls: Op, the library's operations as C call objects (hm_calls.c says what
 * they are), and the profile's clock they time recorded calls with. */
#include "hm_calls_common.h"

/* The profile's clock: hm_prof_begin, hm_prof_end_bytes and hm_prof_abort of the C core (they
 * live in hybridmpi._native._core), given once by set_clock when the package loads. */
typedef __typeof__(hm_prof_begin) *begin_fn;
typedef __typeof__(hm_prof_end_bytes) *end_fn;
static begin_fn prof_begin, prof_abort;
static end_fn prof_end;

/* set_clock(begin, end_bytes, abort): the profile clock's functions, by address. */
int hm_calls_clock_set(void) { return prof_begin != NULL; }

PyObject *hm_calls_set_clock(PyObject *module, PyObject *args)
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

PyTypeObject OpType = {
    CALLABLE(Op, op, "Op", "Op(owner, method, index): an operation of owner, served by its _calls"),
    .tp_descr_get = op_get,
    .tp_getset = op_getset,
    .tp_traverse = (traverseproc)op_traverse,
    .tp_clear = (inquiry)op_clear,
};
