/* hybridmpi._native._calls: Coll, what serves HybridComm.barrier, allreduce and Allreduce as
 * one C call (hm_calls_common.h). */
#include "hm_calls_common.h"

static PyObject *dtype_name;   /* "dtype", interned */

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

PyTypeObject CollType = {
    CALLABLE(Coll, coll, "Coll",
             "Coll(kind, st, fn, fail, ops[, arrays]): barrier(), allreduce(x[, op]) of a float "
             "or an array, or Allreduce(sendbuf, recvbuf[, op]) as one C call"),
    .tp_methods = coll_methods,
    .tp_traverse = (traverseproc)coll_traverse,
    .tp_clear = (inquiry)coll_clear,
};


int hm_calls_coll_init(void)
{
    CollType.tp_flags |= Py_TPFLAGS_HAVE_GC;
    dtype_name = PyUnicode_InternFromString("dtype");
    method_name = PyUnicode_InternFromString("method");
    dissemination_name = PyUnicode_InternFromString("dissemination");
    copy_name = PyUnicode_InternFromString("copy");
    if (!dtype_name || !method_name || !dissemination_name || !copy_name)
        return -1;
    return PyType_Ready(&CollType);
}
