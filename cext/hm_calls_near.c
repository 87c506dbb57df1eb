/* hybridmpi._native._calls: Near, what serves GlobalMemory.Put and Get on a part of this node
 * (a memcpy); it declines anything else, which the method checks (hm_calls_common.h). */
#include "hm_calls_common.h"

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

static PyObject *dtype_name;   /* "dtype", interned */

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

PyTypeObject NearType = {
    CALLABLE(Near, near, "Near",
             "Near(ndarray, dtype, bases, counts, itemsize, get): Put or Get on this node"),
    .tp_methods = near_methods,
};


int hm_calls_near_init(void)
{
    dtype_name = PyUnicode_InternFromString("dtype");
    return dtype_name == NULL || PyType_Ready(&NearType) < 0 ? -1 : 0;
}
