/* hybridmpi._native._calls, shared by its files (one per object: hm_calls.c the operations'
 * tables, Calls, and the module; hm_calls_op.c the operations, Op; hm_calls_coll.c Coll, the
 * collectives; hm_calls_halo.c State and Hot, the Halo's; hm_calls_near.c Near, global
 * memory's): the helpers and the macros of its types, and what each file gives the others. */
#ifndef HM_CALLS_COMMON_H
#define HM_CALLS_COMMON_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <structmember.h>

#include "hm_core.h"

/* A new reference to o (Py_NewRef is 3.10+). */
static inline PyObject *ref(PyObject *o)
{
    Py_INCREF(o);
    return o;
}

/* The first n items of a sequence of ints as addresses (or counts): 0, or -1 with an error. */
static inline int read_words(PyObject *seq, Py_ssize_t n, unsigned long long *out)
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
static inline PyObject *ref_or_none(PyObject *o)
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


/* hm_calls.c: the tables' type; hm_calls_op.c: the operations' type, set_clock(begin,
 * end_bytes, abort), the module's function that gives it the profile's clock, and whether it
 * was given */
extern PyTypeObject CallsType, OpType;
PyObject *hm_calls_set_clock(PyObject *module, PyObject *args);
int hm_calls_clock_set(void);

/* The call objects that serve operations (Calls calls them directly: they decline before
 * running Python), and each file's part of the module's set-up: its types readied and its
 * interned names made (0, or -1 with an error). */
extern PyTypeObject CollType, HotType, NearType, StateType;
int hm_calls_coll_init(void);
int hm_calls_halo_init(void);
int hm_calls_near_init(void);

#endif
