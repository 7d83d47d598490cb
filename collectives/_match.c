/* Whether a collective call repeats a prepared one, in C: the same array objects, their layout
 * unchanged (data, shape, strides, dtype, writability), the same arguments. The same test as
 * PreparedCalls.find's Python (which stays as the fallback, and for anything that is not a plain
 * numpy array), at a fraction of its cost: reading an array's shape or strides from Python makes
 * a tuple each time, and every repeated call pays this test.
 *
 * Arrays are read through the head of numpy's PyArrayObject_fields, the layout numpy's own C
 * API macros read and so keeps frozen; prepared.py checks it against numpy's answers (layout())
 * before it uses this module.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

typedef struct {                /* numpy's PyArrayObject_fields, as far as it is read here */
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions;
    Py_ssize_t *strides;
    PyObject *base;
    PyObject *descr;
    int flags;
} ArrayHead;

enum { WRITEABLE = 0x0400, MAX_DIMS = 64 };  /* NPY_ARRAY_WRITEABLE, NPY_MAXDIMS */

typedef struct {                /* what an array must still be */
    PyObject *ref;              /* a weak reference to it (a new array at its address differs) */
    char *data;
    int nd;
    Py_ssize_t dims[MAX_DIMS];
    Py_ssize_t strides[MAX_DIMS];
    PyObject *descr;            /* its dtype, held: compared by identity */
    int writable;               /* it must still be writable */
} Snapshot;

typedef struct {
    PyObject_HEAD
    PyTypeObject *ndarray;
    Snapshot x, out;            /* out.ref NULL: the call has no out */
    PyObject *args;
    PyObject *check;
} Match;

static int
is_array(PyTypeObject *ndarray, PyObject *a)
{
    return Py_TYPE(a) == ndarray;  /* exactly: a subclass may override what is read here */
}

static int
snapshot(Snapshot *s, PyTypeObject *ndarray, PyObject *a, int writable)
{
    if (!is_array(ndarray, a)) {
        PyErr_SetString(PyExc_TypeError, "Match takes numpy arrays only");
        return -1;
    }
    ArrayHead *h = (ArrayHead *)a;
    if (h->nd < 0 || h->nd > MAX_DIMS) {
        PyErr_SetString(PyExc_ValueError, "an array of more dimensions than numpy allows");
        return -1;
    }
    s->ref = PyWeakref_NewRef(a, NULL);
    if (!s->ref)
        return -1;
    s->data = h->data;
    s->nd = h->nd;
    memcpy(s->dims, h->dimensions, h->nd * sizeof(Py_ssize_t));
    memcpy(s->strides, h->strides, h->nd * sizeof(Py_ssize_t));
    s->descr = Py_NewRef(h->descr);
    s->writable = writable;
    return 0;
}

/* Whether weak reference `ref` still refers to `a`. */
static int
refers_to(PyObject *ref, PyObject *a)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *now;
    if (PyWeakref_GetRef(ref, &now) < 0) {
        PyErr_Clear();
        return 0;
    }
    Py_XDECREF(now);            /* `a` is held by the caller: comparing the address is safe */
    return now == a;
#else
    return PyWeakref_GET_OBJECT(ref) == a;
#endif
}

static int
unchanged(const Snapshot *s, PyTypeObject *ndarray, PyObject *a)
{
    if (!refers_to(s->ref, a) || !is_array(ndarray, a))
        return 0;
    ArrayHead *h = (ArrayHead *)a;
    return h->data == s->data && h->nd == s->nd && h->descr == s->descr &&
        (!s->writable || (h->flags & WRITEABLE)) &&
        memcmp(h->dimensions, s->dims, s->nd * sizeof(Py_ssize_t)) == 0 &&
        memcmp(h->strides, s->strides, s->nd * sizeof(Py_ssize_t)) == 0;
}

/* matches(x, out, args, check) */
static PyObject *
match_matches(Match *m, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 4) {
        PyErr_SetString(PyExc_TypeError, "matches(x, out, args, check)");
        return NULL;
    }
    PyObject *x = argv[0], *out = argv[1];
    if (argv[3] != m->check || !unchanged(&m->x, m->ndarray, x))
        Py_RETURN_FALSE;
    if (m->out.ref ? (out == Py_None || !unchanged(&m->out, m->ndarray, out)) : out != Py_None)
        Py_RETURN_FALSE;
    int same = PyObject_RichCompareBool(argv[2], m->args, Py_EQ);
    if (same < 0)
        return NULL;
    return PyBool_FromLong(same);
}

static void
match_dealloc(Match *m)
{
    Py_XDECREF(m->x.ref);
    Py_XDECREF(m->x.descr);
    Py_XDECREF(m->out.ref);
    Py_XDECREF(m->out.descr);
    Py_XDECREF(m->args);
    Py_XDECREF(m->check);
    Py_XDECREF(m->ndarray);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyObject *
match_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *ndarray, *x, *out, *call_args, *check;
    int x_written;
    if (!PyArg_ParseTuple(args, "O!OOO!Op", &PyType_Type, &ndarray, &x, &out, &PyTuple_Type,
                          &call_args, &check, &x_written))
        return NULL;
    Match *m = (Match *)type->tp_alloc(type, 0);
    if (!m)
        return NULL;
    m->ndarray = (PyTypeObject *)Py_NewRef(ndarray);
    m->args = Py_NewRef(call_args);
    m->check = Py_NewRef(check);
    if (snapshot(&m->x, m->ndarray, x, x_written) < 0 ||
            (out != Py_None && snapshot(&m->out, m->ndarray, out, 1) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return (PyObject *)m;
}

static PyMethodDef match_methods[] = {
    {"matches", (PyCFunction)(void (*)(void))match_matches, METH_FASTCALL,
     "matches(x, out, args, check) -> whether a call with these repeats the prepared one."},
    {NULL},
};

static PyTypeObject MatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "topocoll.collectives._match.Match",
    .tp_doc = "Match(ndarray, x, out, args, check, x_written): a prepared call's arrays, as "
              "they are now, and its arguments",
    .tp_basicsize = sizeof(Match),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = match_new,
    .tp_dealloc = (destructor)match_dealloc,
    .tp_methods = match_methods,
};

/* layout(ndarray, a) -> (data, nd, shape, strides, descr, writeable), read as matches() reads
 * them: prepared.py compares this with numpy's own answers before trusting the layout. */
static PyObject *
layout(PyObject *module, PyObject *args)
{
    PyObject *ndarray, *a;
    if (!PyArg_ParseTuple(args, "O!O", &PyType_Type, &ndarray, &a))
        return NULL;
    if (!is_array((PyTypeObject *)ndarray, a)) {
        PyErr_SetString(PyExc_TypeError, "layout takes a numpy array");
        return NULL;
    }
    ArrayHead *h = (ArrayHead *)a;
    if (h->nd < 0 || h->nd > MAX_DIMS) {
        PyErr_SetString(PyExc_ValueError, "not numpy's array layout");
        return NULL;
    }
    PyObject *shape = PyTuple_New(h->nd), *strides = PyTuple_New(h->nd);
    if (!shape || !strides) {
        Py_XDECREF(shape);
        Py_XDECREF(strides);
        return NULL;
    }
    for (int i = 0; i < h->nd; i++) {
        PyTuple_SET_ITEM(shape, i, PyLong_FromSsize_t(h->dimensions[i]));
        PyTuple_SET_ITEM(strides, i, PyLong_FromSsize_t(h->strides[i]));
    }
    return Py_BuildValue("(niNNOO)", (Py_ssize_t)h->data, h->nd, shape, strides, h->descr,
                         (h->flags & WRITEABLE) ? Py_True : Py_False);
}

static PyMethodDef module_methods[] = {
    {"layout", layout, METH_VARARGS,
     "layout(ndarray, a) -> (data, nd, shape, strides, dtype, writeable) as read in C."},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_match",
    "Whether a call repeats a prepared one, in C (see prepared.PreparedCalls.find).", -1,
    module_methods,
};

PyMODINIT_FUNC
PyInit__match(void)
{
    if (PyType_Ready(&MatchType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddObjectRef(m, "Match", (PyObject *)&MatchType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
