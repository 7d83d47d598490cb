/* Whether a collective call repeats a prepared one, in C: the same array objects, their layout
 * unchanged (data, shape, strides, dtype, writability), the same arguments. The same test as
 * PreparedCalls.find's Python (which stays as the fallback, and for anything that is neither a
 * plain numpy array nor a torch tensor), at a fraction of its cost: reading an array's shape or
 * strides from Python makes a tuple each time, and every repeated call pays this test. A
 * tensor's form is read through its Python attributes, as prepared._form reads it (shape,
 * dtype, stride(), data_ptr()), then compared here.
 *
 * Arrays are read through the head of numpy's PyArrayObject_fields, the layout numpy's own C
 * API macros read and so keeps frozen; prepared.py checks it against numpy's answers (layout())
 * before it uses this module.
 *
 * The Lane below takes a repeated blocking call from the front method to its prepared run with
 * no Python in between (Communicator._lane).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <sched.h>
#include <string.h>
#include <structmember.h>
#include <time.h>

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

enum { C_CONTIGUOUS = 0x0001, WRITEABLE = 0x0400, MAX_DIMS = 64 };
                    /* NPY_ARRAY_C_CONTIGUOUS, NPY_ARRAY_WRITEABLE, NPY_MAXDIMS */

typedef struct {                /* what an array must still be */
    PyObject *ref;              /* a weak reference to it (a new array at its address differs) */
    char *data;
    int nd;
    Py_ssize_t dims[MAX_DIMS];
    Py_ssize_t strides[MAX_DIMS];
    PyObject *descr;            /* its dtype, held: compared by identity */
    int writable;               /* it must still be writable */
    PyTypeObject *type;         /* NULL: a numpy array, read above; else a torch tensor's type, */
    PyObject *shape, *stride, *ptr;  /* and its shape, stride() and data_ptr() (dtype: descr) */
} Snapshot;

static PyObject *s_shape, *s_dtype, *s_stride, *s_data_ptr;  /* a tensor's, interned */

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

/* A tensor's form as prepared._form reads it: shape, dtype, stride(), data_ptr() (set_ can
 * swap its storage under the same object). 0, or -1 with an error. */
static int
tensor_form(PyObject *a, PyObject **shape, PyObject **dtype, PyObject **stride, PyObject **ptr)
{
    *dtype = *stride = *ptr = NULL;
    *shape = PyObject_GetAttr(a, s_shape);
    *dtype = *shape ? PyObject_GetAttr(a, s_dtype) : NULL;
    *stride = *dtype ? PyObject_CallMethodNoArgs(a, s_stride) : NULL;
    *ptr = *stride ? PyObject_CallMethodNoArgs(a, s_data_ptr) : NULL;
    if (*ptr)
        return 0;
    Py_CLEAR(*shape);
    Py_CLEAR(*dtype);
    Py_CLEAR(*stride);
    return -1;
}

static int
snapshot(Snapshot *s, PyTypeObject *ndarray, PyObject *a, int writable)
{
    if (!is_array(ndarray, a)) {  /* a tensor (Python makes a Match only for these two) */
        if (tensor_form(a, &s->shape, &s->descr, &s->stride, &s->ptr) < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "Match takes numpy arrays and torch tensors, not %s",
                         Py_TYPE(a)->tp_name);
            return -1;
        }
        s->ref = PyWeakref_NewRef(a, NULL);
        if (!s->ref)
            return -1;
        s->type = (PyTypeObject *)Py_NewRef(Py_TYPE(a));
        return 0;               /* (a tensor has no writable flag: any is written) */
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

/* Whether tensor `a` still has the form `s` holds (an error reading it: no, cleared; the
 * Python way then meets it again and raises it). */
static int
tensor_unchanged(const Snapshot *s, PyObject *a)
{
    if (Py_TYPE(a) != s->type)
        return 0;
    PyObject *shape, *dtype, *stride, *ptr;
    if (tensor_form(a, &shape, &dtype, &stride, &ptr) < 0) {
        PyErr_Clear();
        return 0;
    }
    int same = dtype == s->descr;
    PyObject *now[3] = {shape, stride, ptr}, *then[3] = {s->shape, s->stride, s->ptr};
    for (int i = 0; i < 3 && same > 0; i++)
        same = PyObject_RichCompareBool(now[i], then[i], Py_EQ);
    Py_DECREF(shape);
    Py_DECREF(dtype);
    Py_DECREF(stride);
    Py_DECREF(ptr);
    if (same < 0) {
        PyErr_Clear();
        return 0;
    }
    return same;
}

static int
unchanged(const Snapshot *s, PyTypeObject *ndarray, PyObject *a)
{
    if (!refers_to(s->ref, a))
        return 0;
    if (s->type)
        return tensor_unchanged(s, a);
    if (!is_array(ndarray, a))
        return 0;
    ArrayHead *h = (ArrayHead *)a;
    return h->data == s->data && h->nd == s->nd && h->descr == s->descr &&
        (!s->writable || (h->flags & WRITEABLE)) &&
        memcmp(h->dimensions, s->dims, s->nd * sizeof(Py_ssize_t)) == 0 &&
        memcmp(h->strides, s->strides, s->nd * sizeof(Py_ssize_t)) == 0;
}

/* Whether a call's arguments are the kept ones: equal, and of the same types all the way down
 * through tuples and lists (so a root of True or 1.0 is not taken for 1: the general path
 * refuses those, and so must a repeat). 1, 0, -1 on error. */
static int
same_args(PyObject *a, PyObject *b)
{
    if (Py_TYPE(a) != Py_TYPE(b))
        return 0;
    if (!PyTuple_CheckExact(a) && !PyList_CheckExact(a))
        return PyObject_RichCompareBool(a, b, Py_EQ);
    if (Py_EnterRecursiveCall(" comparing a call's arguments"))
        return -1;
    int same = 1;
    /* a list's items are held while compared, and its size read again each time: an item's
     * __eq__ may change either list, as CPython's own list comparison allows for */
    for (Py_ssize_t i = 0; same == 1; i++) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(a);
        if (n != PySequence_Fast_GET_SIZE(b)) {
            same = 0;
            break;
        }
        if (i >= n)
            break;
        PyObject *x = Py_NewRef(PySequence_Fast_GET_ITEM(a, i));
        PyObject *y = Py_NewRef(PySequence_Fast_GET_ITEM(b, i));
        same = same_args(x, y);
        Py_DECREF(x);
        Py_DECREF(y);
    }
    Py_LeaveRecursiveCall();
    return same;
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
    int same = same_args(argv[2], m->args);
    if (same < 0)
        return NULL;
    return PyBool_FromLong(same);
}

static void
match_dealloc(Match *m)
{
    Snapshot *both[2] = {&m->x, &m->out};
    for (int i = 0; i < 2; i++) {
        Py_XDECREF(both[i]->ref);
        Py_XDECREF(both[i]->descr);
        Py_XDECREF(both[i]->type);
        Py_XDECREF(both[i]->shape);
        Py_XDECREF(both[i]->stride);
        Py_XDECREF(both[i]->ptr);
    }
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

/* ---- The lane: a repeated call from the front method straight to its run ----
 *
 * Communicator's front methods (all_reduce, ...) call lane.run(kind, x, out, args, check,
 * async_op). For a repeat on numpy arrays or torch tensors this does what
 * prepared.PreparedCalls.find and Communicator._repeat do, guard for guard: find the entry (the
 * Match test above); where the call may run inline (nothing queued, the owning thread, not
 * broken, not closed, not traced, no async repeat out, the flight record extends; async, a run
 * that starts inline or one the takeover watches, comm._watched), number it in the flight
 * record, then run the prepared run's go() and return the entry's result, or (async) start it,
 * make its StartedHandle and poll once (a watched run: no poll, comm._watch), as _repeat does.
 * lane.complete(block, soon) is Communicator._complete, what a StartedHandle's wait and test and
 * the next operation call; lane.repeat(entry, async_op) is the same run for an entry already
 * known (a persistent call). Everything else is Python's: a failed guard goes to
 * comm._repeat(entry, async_op); no entry, or one only Python can test (an array subclass's), to
 * comm._lane_slow(kind, x, out, args, check, async_op), the pure-Python lane; a blocking run
 * that raises to comm._repeat_failed(entry, record, err), an async one to comm._settle(started,
 * err), which classify it.
 *
 * What it reads, it reads the way Python's attribute lookup would find it, only directly: the
 * communicator's, executor's and flight recorder's attributes in their __dict__ (none of these
 * names is a property or slot of their classes), and the slots of Prepared, Repeats and Run
 * (classes with __slots__, checked by exact type) at their member descriptors' offsets. An
 * attribute lookup costs a type lookup and a descriptor call; a lane call reads twenty.
 * All of it relies on the GIL (released only inside the run's own spins and a blocking lock
 * acquire): the module declares no Py_mod_gil, so a free-threaded build keeps the GIL on. */

typedef struct {                /* offsets of the __slots__ read and written here */
    Py_ssize_t matches, lean, result, kind, what;   /* Prepared's */
    Py_ssize_t r_what, r_name, r_last, r_running;   /* Repeats' */
    Py_ssize_t go, start, complete, soon, starts_inline;   /* Run's */
    Py_ssize_t h_name, h_completion, h_done, h_claimed, h_result, h_error, h_callbacks;
                                                    /* StartedHandle's */
    Py_ssize_t p_name, p_comm, p_backend, p_receives, p_peer, p_limit, p_ctx, p_result,
        p_expect, p_statuses, p_reqs, p_entry, p_posting, p_driving, p_driver, p_done, p_error,
        p_callbacks;                                /* p2p.Posted's */
    Py_ssize_t e_seq, e_name, e_what, e_state, e_issued, e_started, e_ended;  /* FlightEntry's */
} Offsets;

typedef struct {
    PyObject_HEAD
    PyObject *comm;             /* the communicator (its Python methods) */
    PyObject *guards;           /* its __dict__: _owner, _broken, _closed, _started */
    PyObject *by_kind;          /* its PreparedCalls' entries: {kind: {id(x): [Prepared]}} */
    PyObject *executor;         /* its Executor's __dict__ (_pending) */
    PyObject *flight;           /* its FlightRecorder's __dict__ (_seq, _repeats) */
    PyObject *state;            /* log's flags (trace) */
    PyTypeObject *prepared, *repeats, *run, *handle;   /* the classes whose slots are read */
    PyTypeObject *posted, *entry;   /* p2p.Posted and FlightEntry, made here for async p2p */
    PyObject *settling;         /* p2p.SETTLING: the lock over every Posted's outcome */
    PyObject *new_lock;         /* threading.Lock: a Posted's driving lock */
    PyObject *driver;           /* this lane's p2p_drive (bound), made at the first post */
    Offsets at;
} Lane;

static PyObject *s_pending, *s_owner, *s_broken, *s_closed, *s_started, *s_seq, *s_repeats,
    *s_trace, *s_lane_slow, *s_repeat, *s_repeat_failed, *s_completion, *s_completing,
    *s_acquire, *s_release, *s_settle, *s_run_callbacks, *s_lean, *s_watched, *s_watch, *s_zero;

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))  /* borrowed; NULL: unset */

/* Replace a slot's value, as setting the attribute does. */
static void
set_slot(PyObject *obj, Py_ssize_t offset, PyObject *value)
{
    PyObject *old = SLOT(obj, offset);
    SLOT(obj, offset) = Py_NewRef(value);
    Py_XDECREF(old);
}

/* The offset of slot `name` of class `type` (an object slot's member descriptor), or -1. */
static Py_ssize_t
slot_offset(PyTypeObject *type, const char *name)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)type, name);
    if (!d)
        return -1;
    Py_ssize_t offset = -1;
    if (Py_TYPE(d) == &PyMemberDescr_Type && ((PyMemberDescrObject *)d)->d_member->type ==
            T_OBJECT_EX)
        offset = ((PyMemberDescrObject *)d)->d_member->offset;
    else
        PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", type->tp_name, name);
    Py_DECREF(d);
    return offset;
}

/* Match.matches' test without the call: 1 repeats, 0 not, -1 error. */
static int
match_test(Match *m, PyObject *x, PyObject *out, PyObject *args, PyObject *check)
{
    if (check != m->check || !unchanged(&m->x, m->ndarray, x))
        return 0;
    if (m->out.ref ? (out == Py_None || !unchanged(&m->out, m->ndarray, out)) : out != Py_None)
        return 0;
    return same_args(args, m->args);
}

/* The kept entry of `kind` the call repeats (a new reference); NULL without an error where C
 * can't tell of one: none kept, none matching, or one that only Python tests. */
static PyObject *
lane_find(Lane *l, PyObject *kind, PyObject *x, PyObject *out, PyObject *args, PyObject *check)
{
    PyObject *entries = PyDict_GetItemWithError(l->by_kind, kind);  /* borrowed */
    if (!entries || !PyDict_Check(entries))
        return NULL;
    PyObject *key = PyLong_FromVoidPtr(x);
    if (!key)
        return NULL;
    PyObject *list = PyDict_GetItemWithError(entries, key);  /* borrowed */
    Py_DECREF(key);
    if (!list || !PyList_Check(list))
        return NULL;
    Py_INCREF(list);            /* a comparison below may run Python that replaces it */
    PyObject *found = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++) {
        PyObject *entry = PyList_GET_ITEM(list, i);
        /* matches: a Match's bound method, or None where Python tests (a tensor's entry) */
        PyObject *m = Py_TYPE(entry) == l->prepared ? SLOT(entry, l->at.matches) : NULL;
        PyObject *match = m && PyCFunction_Check(m) ? PyCFunction_GET_SELF(m) : NULL;
        if (!match || Py_TYPE(match) != &MatchType)
            break;              /* Python's find decides */
        Py_INCREF(entry);
        Py_INCREF(match);
        int same = match_test((Match *)match, x, out, args, check);
        Py_DECREF(match);
        if (same > 0) {
            found = entry;
            break;
        }
        Py_DECREF(entry);
        if (same < 0)
            break;
    }
    Py_DECREF(list);
    return found;
}

/* Whether `dict[name]` is true (1), false or missing (0), or -1 on error. */
static int
item_true(PyObject *dict, PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(dict, name);  /* borrowed */
    return v ? PyObject_IsTrue(v) : PyErr_Occurred() ? -1 : 0;
}

/* Whether `dict[name]` is None (1), something else or missing (0), or -1 on error. */
static int
item_none(PyObject *dict, PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(dict, name);  /* borrowed */
    return v ? v == Py_None : PyErr_Occurred() ? -1 : 0;
}

/* Whether the calling thread owns the communicator (its _owner is threading.get_ident()). */
static int
owned_here(PyObject *guards)
{
    PyObject *owner = PyDict_GetItemWithError(guards, s_owner);  /* borrowed */
    if (!owner || !PyLong_Check(owner))
        return PyErr_Occurred() ? -1 : 0;
    unsigned long id = PyLong_AsUnsignedLong(owner);
    if (id == (unsigned long)-1 && PyErr_Occurred()) {
        PyErr_Clear();          /* not a thread's ident: not this thread */
        return 0;
    }
    return id == PyThread_get_thread_ident();
}

/* Communicator._repeat's guards: whether a repeat may run inline now (1), may once the async
 * repeat still out completes (2), must go through _repeat (0), or -1 on error. */
static int
inline_now(Lane *l)
{
    int t;
    if ((t = item_true(l->executor, s_pending)) != 0)
        return t < 0 ? -1 : 0;
    if ((t = owned_here(l->guards)) != 1)
        return t;
    if ((t = item_none(l->guards, s_broken)) != 1 || (t = item_true(l->guards, s_closed)) != 0 ||
            (t = item_true(l->state, s_trace)) != 0)
        return t < 0 ? -1 : 0;
    t = item_none(l->guards, s_started);
    return t < 0 ? -1 : t ? 1 : 2;
}

static int complete_started(Lane *l, int block, int soon, PyObject *handle);

/* lock.release(), keeping the error being raised, if any (release's own error replaces it):
 * 0, or -1 with an error. */
static int
release_keeping_error(PyObject *lock)
{
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    PyObject *released = PyObject_CallMethodNoArgs(lock, s_release);
    if (!released) {
        Py_XDECREF(et);
        Py_XDECREF(ev);
        Py_XDECREF(etb);
        return -1;
    }
    Py_DECREF(released);
    PyErr_Restore(et, ev, etb);
    return 0;
}

/* The flight record a run of the call `what`, `name` extends (borrowed): FlightRecorder's
 * newest, where it is that call's (issue_running's test: the same objects); NULL where a new
 * record is needed, which Python makes (with an error set only where reading failed). */
static PyObject *
extended_record(Lane *l, PyObject *what, PyObject *name)
{
    PyObject *record = PyDict_GetItemWithError(l->flight, s_repeats);  /* borrowed */
    if (!record || Py_TYPE(record) != l->repeats)
        return NULL;
    PyObject *was = SLOT(record, l->at.r_what), *called = SLOT(record, l->at.r_name);
    return was && called && was == what && called == name ? record : NULL;
}


/* The recorder's next sequence number, now its last (a new reference), or NULL. */
static PyObject *
next_seq(Lane *l)
{
    PyObject *seq = PyDict_GetItemWithError(l->flight, s_seq);  /* borrowed */
    if (!seq) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_SystemError, "a FlightRecorder without _seq");
        return NULL;
    }
    long long n = PyLong_AsLongLong(seq);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    PyObject *next = PyLong_FromLongLong(n + 1);
    if (next && PyDict_SetItem(l->flight, s_seq, next) < 0)
        Py_CLEAR(next);
    return next;
}

/* Number the next run in `record` (issue_running's extension): its last, now running; -1 with
 * an error. */
static int
extend_record(Lane *l, PyObject *record)
{
    PyObject *seq = next_seq(l);
    if (!seq)
        return -1;
    set_slot(record, l->at.r_last, seq);
    set_slot(record, l->at.r_running, seq);
    Py_DECREF(seq);
    return 0;
}

/* The exception being raised, taken out of the error indicator with its traceback, as an
 * `except BaseException as err` holds it (a new reference; never NULL). */
static PyObject *
caught(void)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb && value)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value ? value : PyObject_CallNoArgs(PyExc_SystemError);
}

/* Hand the exception being raised to comm.<method>(call, record, err), which raises it
 * classified (_repeat_failed for a run, _inline_failed for a send or recv); NULL. */
static PyObject *
hand_failure(Lane *l, PyObject *method, PyObject *call, PyObject *record)
{
    PyObject *value = caught();
    if (!value)
        return NULL;
    PyObject *raised = PyObject_CallMethodObjArgs(l->comm, method, call, record, value, NULL);
    Py_DECREF(value);
    if (raised) {               /* it always raises */
        Py_DECREF(raised);
        PyErr_Format(PyExc_SystemError, "%U returned", method);
    }
    return NULL;
}

/* Settle a started repeat that completed (Communicator._settle without an error, and
 * StartedHandle.settle): the done-callbacks to run (a new reference, None: none), or NULL. Where
 * the three are not the kinds it knows (a one-off template's entry), Python's _settle. */
static PyObject *
settle_done(Lane *l, PyObject *started)
{
    PyObject *handle = PyTuple_GET_ITEM(started, 0), *entry = PyTuple_GET_ITEM(started, 1),
        *record = PyTuple_GET_ITEM(started, 2);
    if (Py_TYPE(handle) != l->handle || Py_TYPE(entry) != l->prepared ||
            Py_TYPE(record) != l->repeats || !SLOT(entry, l->at.result))
        return PyObject_CallMethodObjArgs(l->comm, s_settle, started, Py_None, NULL);
    set_slot(record, l->at.r_running, s_zero);
    set_slot(handle, l->at.h_result, SLOT(entry, l->at.result));
    set_slot(handle, l->at.h_error, Py_None);
    set_slot(handle, l->at.h_done, Py_True);
    PyObject *callbacks = SLOT(handle, l->at.h_callbacks);
    if (!callbacks || callbacks == Py_None)
        Py_RETURN_NONE;
    Py_INCREF(callbacks);
    PyObject *none_yet = PyList_New(0);
    if (!none_yet) {
        Py_DECREF(callbacks);
        return NULL;
    }
    set_slot(handle, l->at.h_callbacks, none_yet);
    Py_DECREF(none_yet);
    return callbacks;
}

/* `handle` (owned), or NULL where `r` (owned, a call's result, dropped) is NULL: the call
 * failed and its error stands. */
static PyObject *
handle_unless_failed(PyObject *handle, PyObject *r)
{
    if (!r) {
        Py_DECREF(handle);
        return NULL;
    }
    Py_DECREF(r);
    return handle;
}

/* Start a repeat of `entry` with async_op=True inline, as _repeat does: publish (the run's
 * start), make its StartedHandle, poll once; done already, the handle is settled; else it is the
 * communicator's started call. `watched` (a run with barriers after the first): no poll (it
 * could wait at those); it is the started call at once, watched by the takeover (comm._watch).
 * The handle, or NULL with start's error. */
static PyObject *
start_inline(Lane *l, PyObject *entry, PyObject *run, PyObject *record, int watched)
{
    PyObject *start = SLOT(run, l->at.start), *complete = SLOT(run, l->at.complete);
    if (!start || !complete || !SLOT(entry, l->at.result)) {
        PyErr_SetString(PyExc_SystemError, "a prepared run without start, complete or result");
        return NULL;
    }
    Py_INCREF(start);
    Py_INCREF(complete);
    PyObject *r = PyObject_CallNoArgs(start);  /* publishes and enters the barrier */
    Py_DECREF(start);
    PyObject *handle = r ? l->handle->tp_alloc(l->handle, 0) : NULL;  /* object.__new__ */
    Py_XDECREF(r);
    PyObject *completion = handle ? PyDict_GetItemWithError(l->guards, s_completion) : NULL;
    if (!completion) {          /* (borrowed, and set at once) */
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_SystemError, "a communicator without its Completion");
        Py_XDECREF(handle);
        Py_DECREF(complete);
        return NULL;
    }
    set_slot(handle, l->at.h_completion, completion);
    set_slot(handle, l->at.h_name, SLOT(entry, l->at.kind));
    set_slot(handle, l->at.h_done, Py_False);
    set_slot(handle, l->at.h_claimed, Py_False);
    set_slot(handle, l->at.h_callbacks, Py_None);
    PyObject *started = PyTuple_Pack(3, handle, entry, record);
    if (watched && started) {   /* wait() or the next call drives it, else the progress thread */
        Py_DECREF(complete);    /* once the takeover hands it over */
        PyObject *w = PyDict_SetItem(l->guards, s_started, started) < 0 ? NULL :
            PyObject_CallMethodObjArgs(l->comm, s_watch, run, SLOT(record, l->at.r_last), NULL);
        Py_DECREF(started);
        return handle_unless_failed(handle, w);
    }
    PyObject *done = started ? PyObject_CallOneArg(complete, Py_False) : NULL;  /* one poll */
    Py_DECREF(complete);
    int t = done ? PyObject_IsTrue(done) : -1;
    Py_XDECREF(done);
    if (t == 0 && PyDict_SetItem(l->guards, s_started, started) == 0) {
        Py_DECREF(started);     /* its peers are not all in: completed by wait, test or the */
        return handle;          /* next operation */
    }
    if (t > 0) {                /* every peer was in: done already (no callbacks yet) */
        PyObject *none = settle_done(l, started);
        Py_DECREF(started);
        return handle_unless_failed(handle, none);
    }
    if (!started) {
        Py_DECREF(handle);
        return NULL;
    }
    PyObject *value = caught();  /* the poll raised: _settle classifies it into the handle */
    PyObject *settled = value ? PyObject_CallMethodObjArgs(l->comm, s_settle, started, value,
                                                           NULL) : NULL;
    Py_XDECREF(value);
    Py_DECREF(started);
    return handle_unless_failed(handle, settled);
}

/* A repeat of `entry` run inline, as _repeat runs one: blocking, its result, or NULL with the
 * (classified) error; async, its handle. *ran 0 where it may not run inline (nothing done;
 * NULL, maybe an error). */
static PyObject *
run_inline(Lane *l, PyObject *entry, int async_op, int *ran)
{
    *ran = 0;
    PyObject *run = SLOT(entry, l->at.lean);
    PyObject *go = run && Py_TYPE(run) == l->run ? SLOT(run, l->at.go) : NULL;
    if (!go)
        return NULL;            /* no prepared run: _repeat submits the general one */
    int watched = 0;            /* barriers follow the first: inline only where the takeover */
    if (async_op && SLOT(run, l->at.starts_inline) != Py_True) {   /* watches (comm._watched) */
        PyObject *w = PyObject_CallMethodOneArg(l->comm, s_watched, entry);
        watched = w ? PyObject_IsTrue(w) : -1;
        Py_XDECREF(w);
        if (watched <= 0)
            return NULL;        /* (an error, or _repeat submits it) */
    }
    Py_INCREF(run);             /* held: finishing the call still out below runs Python */
    Py_INCREF(go);
    int ok = inline_now(l);
    if (ok == 2)                /* one is out: finish it if its peers arrive within the run's */
        ok = complete_started(l, 0, 1, NULL);  /* own spin (_complete_soon's first), else Python */
    PyObject *record = ok == 1 ?
        extended_record(l, SLOT(entry, l->at.what), SLOT(entry, l->at.kind)) : NULL;
    if (!record || extend_record(l, record) < 0) {
        Py_DECREF(run);
        Py_DECREF(go);
        return NULL;
    }
    Py_INCREF(record);
    *ran = 1;
    PyObject *done = async_op ? start_inline(l, entry, run, record, watched) :
        PyObject_CallNoArgs(go);
    Py_DECREF(run);
    Py_DECREF(go);
    if (async_op) {
        Py_DECREF(record);
        return done;            /* the handle */
    }
    if (!done) {
        hand_failure(l, s_repeat_failed, entry, record);
        Py_DECREF(record);
        return NULL;
    }
    Py_DECREF(done);
    set_slot(record, l->at.r_running, s_zero);  /* done */
    Py_DECREF(record);
    PyObject *result = SLOT(entry, l->at.result);
    if (!result)
        PyErr_SetString(PyExc_AttributeError, "a prepared call without its result");
    return Py_XNewRef(result);
}

/* A repeat of `entry` (borrowed): inline where it may, else comm._repeat(entry, async_op). */
static PyObject *
lane_repeat_entry(Lane *l, PyObject *entry, PyObject *async_op)
{
    PyObject *result = NULL;
    int ran = 0;
    Py_INCREF(entry);
    if ((async_op == Py_False || async_op == Py_True) && Py_TYPE(entry) == l->prepared)
        result = run_inline(l, entry, async_op == Py_True, &ran);
    if (!ran && !PyErr_Occurred())
        result = PyObject_CallMethodObjArgs(l->comm, s_repeat, entry, async_op, NULL);
    Py_DECREF(entry);
    return result;
}

/* repeat(entry, async_op): Communicator._repeat, inline in C where it may (a persistent
 * collective's start and call, whose entry is known). */
static PyObject *
lane_repeat(Lane *l, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 2) {
        PyErr_SetString(PyExc_TypeError, "repeat(entry, async_op)");
        return NULL;
    }
    return lane_repeat_entry(l, argv[0], argv[1]);
}

/* lane(kind, x, out, args, check, async_op): the call's result (or Handle), or what
 * _lane_slow returns where there is no entry (its sentinel for the general path). */
static PyObject *
lane_call(Lane *l, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 6) {
        PyErr_SetString(PyExc_TypeError, "lane(kind, x, out, args, check, async_op)");
        return NULL;
    }
    PyObject *kind = argv[0], *x = argv[1], *out = argv[2], *args = argv[3], *check = argv[4],
        *async_op = argv[5];
    PyObject *entry = lane_find(l, kind, x, out, args, check);
    if (!entry) {
        if (PyErr_Occurred())
            return NULL;
        PyObject *call[7] = {l->comm, kind, x, out, args, check, async_op};
        return PyObject_VectorcallMethod(s_lane_slow, call, 7, NULL);
    }
    PyObject *result = lane_repeat_entry(l, entry, async_op);
    Py_DECREF(entry);
    return result;
}

/* One completion step of `run` (a started call's): soon() where asked and it has one, else
 * complete(block). */
static PyObject *
poll_run(Lane *l, PyObject *run, int block, int soon)
{
    if (Py_TYPE(run) == l->run) {
        PyObject *fast = SLOT(run, l->at.soon), *complete = SLOT(run, l->at.complete);
        PyObject *call = soon && fast && fast != Py_None ? fast : complete;
        if (call) {
            Py_INCREF(call);
            PyObject *r = call == fast ? PyObject_CallNoArgs(call) :
                PyObject_CallOneArg(call, block ? Py_True : Py_False);
            Py_DECREF(call);
            return r;
        }
    }
    PyObject *fast = soon ? PyObject_GetAttrString(run, "soon") : Py_NewRef(Py_None);
    if (!fast)
        return NULL;
    PyObject *r = fast != Py_None ? PyObject_CallNoArgs(fast) :
        PyObject_CallMethod(run, "complete", "O", block ? Py_True : Py_False);
    Py_DECREF(fast);
    return r;
}

/* How long a waiter for one handle's call blocks on the completion lock before it looks again
 * whether that call is still the started one (complete_started). */
#define OWN_CALL_LOOK_SECONDS 1e-3

/* Communicator._complete in C: complete the started repeat, if one is (waiting for its peers if
 * block; soon: within the run's own short spin); 1 where none is left, 0 where its peers are not
 * all in yet, -1 on error. Its error goes to its handle; its callbacks run here, outside the
 * lock. `handle` (or NULL: whichever is started): only the call of that StartedHandle; 1 where
 * another, or none, is started (it was completed, and settled, already), and a blocking wait
 * for the lock gives up once that is so (the lock may then be held for a newer call, whose
 * peers may wait for this very thread). */
static int
complete_started(Lane *l, int block, int soon, PyObject *handle)
{
    PyObject *started = PyDict_GetItemWithError(l->guards, s_started);  /* borrowed */
    if (!started || started == Py_None)
        return PyErr_Occurred() ? -1 : 1;
    if (!PyTuple_Check(started) || PyTuple_GET_SIZE(started) != 3) {
        PyErr_SetString(PyExc_SystemError, "a started call that is not (handle, entry, record)");
        return -1;
    }
    if (handle && PyTuple_GET_ITEM(started, 0) != handle)
        return 1;
    Py_INCREF(started);
    PyObject *lock = Py_XNewRef(PyDict_GetItemWithError(l->guards, s_completing));
    /* not blocking: another thread completing it (the progress thread, handed it) is "not yet" */
    PyObject *got = !lock ? NULL : block && !handle ? PyObject_CallMethodNoArgs(lock, s_acquire) :
        PyObject_CallMethodOneArg(lock, s_acquire, Py_False);
    while (got == Py_False && block && handle) {   /* in slices, looking between them */
        Py_DECREF(got);
        PyObject *now = PyDict_GetItemWithError(l->guards, s_started);  /* borrowed */
        if (now != started) {
            Py_DECREF(lock);
            Py_DECREF(started);
            return PyErr_Occurred() ? -1 : 1;
        }
        got = PyObject_CallMethod(lock, "acquire", "Od", Py_True, OWN_CALL_LOOK_SECONDS);
    }
    if (!got) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_SystemError, "a communicator without its completion lock");
        Py_XDECREF(lock);
        Py_DECREF(started);
        return -1;
    }
    int locked = got == Py_True;
    Py_DECREF(got);
    if (!locked) {
        Py_DECREF(lock);
        Py_DECREF(started);
        return 0;
    }
    int result = -1;
    PyObject *callbacks = NULL;
    PyObject *now = PyDict_GetItemWithError(l->guards, s_started);  /* borrowed */
    if (now != started) {       /* another thread completed it meanwhile */
        result = PyErr_Occurred() ? -1 : 1;
        goto unlock;
    }
    PyObject *entry = PyTuple_GET_ITEM(started, 1);
    PyObject *run = Py_TYPE(entry) == l->prepared ? Py_XNewRef(SLOT(entry, l->at.lean)) :
        PyObject_GetAttr(entry, s_lean);  /* a template's entry is its own run */
    PyObject *r = run ? poll_run(l, run, block, soon) : NULL;
    Py_XDECREF(run);
    int done = r ? PyObject_IsTrue(r) : -1;
    Py_XDECREF(r);
    if (done == 0) {
        result = 0;
        goto unlock;
    }
    PyObject *value = NULL;
    if (done < 0 && !(value = caught()))  /* the run raised: to the handle, via _settle */
        goto unlock;
    callbacks = done > 0 ? settle_done(l, started) :
        PyObject_CallMethodObjArgs(l->comm, s_settle, started, value, NULL);
    Py_XDECREF(value);
    /* only now, settled or not: a thread that finds another (or none) started reads a settled
     * handle (a waiter on it returns at once) */
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    if (PyDict_SetItem(l->guards, s_started, Py_None) < 0) {
        Py_XDECREF(et);
        Py_XDECREF(ev);
        Py_XDECREF(etb);
        Py_CLEAR(callbacks);
        goto unlock;
    }
    PyErr_Restore(et, ev, etb);
    if (callbacks)
        result = 1;
unlock:
    if (release_keeping_error(lock) < 0)  /* release whatever happened */
        result = -1;
    Py_DECREF(lock);
    int some = result == 1 && callbacks && callbacks != Py_None ? PyObject_IsTrue(callbacks) : 0;
    if (some < 0)
        result = -1;
    else if (some) {
        PyObject *ran = PyObject_CallMethodObjArgs(PyTuple_GET_ITEM(started, 0),
                                                   s_run_callbacks, callbacks, NULL);
        if (!ran)
            result = -1;
        Py_XDECREF(ran);
    }
    Py_XDECREF(callbacks);
    Py_DECREF(started);
    return result;
}

/* complete(block, soon=False, handle=None) -> whether no started repeat is left (with handle:
 * whether that handle's call is not the started one, completed now or before;
 * complete_started). */
static PyObject *
lane_complete(Lane *l, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc < 1 || argc > 3) {
        PyErr_SetString(PyExc_TypeError, "complete(block, soon=False, handle=None)");
        return NULL;
    }
    int block = PyObject_IsTrue(argv[0]), soon = argc > 1 ? PyObject_IsTrue(argv[1]) : 0;
    if (block < 0 || soon < 0)
        return NULL;
    PyObject *handle = argc > 2 && argv[2] != Py_None ? argv[2] : NULL;
    int done = complete_started(l, block, soon, handle);
    return done < 0 ? NULL : PyBool_FromLong(done);
}

/* ---- Point to point: a send or recv on the calling thread ----
 *
 * lane.p2p(receives, x, peer, tag, async_op, timeout) is Communicator.send's (receives 0) and
 * recv's (1) first step. Where Communicator._p2p_inline would run the call inline (a
 * C-contiguous numpy array, writable to receive into, not of Python objects; an int peer and
 * tag in range; host memory; the same guards as a repeat's), the call has no timeout of its
 * own (Python checks one) and the backend hands over its raw objects
 * (comm._p2p_raw: Backend.raw_p2p), it numbers the call in the flight record (extending the
 * newest record where that is the same send or recv, else by FlightRecorder.issue_running) and
 * makes the MPI calls that _send and _recv make through the backend, on mpi4py's objects
 * directly: Isend; or Iprobe, Get_count and Irecv; then Test. Iprobe and
 * Test poll a bounded while here (P2P_SPINS, yielding the core), so a transfer done by then
 * (an eager send, a receive whose message comes in) never reaches Python. The rest
 * goes on in Python: a call the lane doesn't take to comm._p2p_slow; one it began to
 * comm._p2p_now with its record, and its posted request to wait for (or the error testing it
 * raised), or without a request where a receive's message isn't in yet or has another size
 * (Python probes again); a post that raised to comm._inline_failed, which classifies it as the
 * Python path's failures are. An async call (async_op=True) it posts the same way and makes its
 * handle (p2p.Posted, slot by slot) and flight entry itself; the handle's waits and tests come
 * back to p2p_drive, which completes the transfer as Posted._drive_py does, up to P2P_SPINS
 * polls (a longer wait, with its timeout, is Python's); a post that raised goes to
 * comm._p2p_post. Before taking a call it lets go of the backend's kept requests that completed
 * (prune_kept), as isend/irecv do. */

enum { P2P_SPINS = 256 };  /* polls after the first before Python waits (COMPILED_SPINS') */
enum {                      /* comm._p2p_raw: the array type, then Backend.raw_p2p()'s */
    RAW_NDARRAY, RAW_COMM, RAW_BYTE, RAW_STATUS, RAW_ORPHANED, RAW_POSTED, RAW_REQUEST,
    RAW_MPI_ERROR, RAW_KEPT_LOCK, RAW_SIZE
};

static PyObject *s_p2p_raw, *s_p2p_bounds, *s_p2p_names, *s_host_p2p, *s_p2p_slow, *s_p2p_now,
    *s_inline_failed, *s_flight, *s_issue_running, *s_Isend, *s_Irecv, *s_Iprobe, *s_Test,
    *s_Get_count, *s_nbytes, *s_hasobject, *s_p2p_post, *s_entries, *s_append, *s_Testall,
    *s_limit, *s_backend, *s_running, *s_done, *s_test_failed, *s_finished, *s_drive_py,
    *s_p2p_drive;

/* Whether `v` is an int with lo <= v <= hi (both ints; 0 where any is not one). */
static int
int_within(PyObject *v, long lo, PyObject *hi, long below)
{
    if (!PyLong_CheckExact(v) || !PyLong_CheckExact(hi))
        return 0;
    int over_v, over_hi;
    long n = PyLong_AsLongAndOverflow(v, &over_v), top = PyLong_AsLongAndOverflow(hi, &over_hi);
    if ((n == -1 || top == -1) && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return !over_v && !over_hi && n >= lo && n <= top - below;
}

/* Let go of the backend's kept requests (its _ORPHANED: dropped handles' and timed-out
 * transfers') that completed since, as mpi._keep(()) does before each isend/irecv: each is
 * tested (which also drives MPI's progress for it) and, done or failed in MPI (MPI is then done
 * with its buffer: `mpi_error`, MPI.Exception; any other error stands), taken out of the
 * list. One that never completes (its peer is gone) stays, tested at every call. Only the
 * thread holding `lock` (mpi._PRUNING, taken without waiting) tests them: MPI must not
 * complete one request on two threads at once; another thread's turn skips it. 0, or -1
 * with an error. */
static int
prune_kept(PyObject *kept, PyObject *mpi_error, PyObject *lock)
{
    if (PyList_GET_SIZE(kept) == 0)
        return 0;
    PyObject *got = PyObject_CallMethodOneArg(lock, s_acquire, Py_False);
    int mine = got ? PyObject_IsTrue(got) : -1;
    Py_XDECREF(got);
    if (mine <= 0)
        return mine;            /* another thread is letting go of them (or an error) */
    PyObject *snapshot = PyList_GetSlice(kept, 0, PY_SSIZE_T_MAX);  /* Test may run Python */
    int result = snapshot ? 0 : -1;
    for (Py_ssize_t i = 0; snapshot && i < PyList_GET_SIZE(snapshot) && result == 0; i++) {
        PyObject *r = PyList_GET_ITEM(snapshot, i);
        PyObject *t = PyObject_CallMethodNoArgs(r, s_Test);
        int done = t ? PyObject_IsTrue(t) : 1;
        Py_XDECREF(t);
        if (!t) {
            if (!PyErr_ExceptionMatches(mpi_error)) {  /* ^C and the like stand */
                result = -1;
                break;
            }
            PyErr_Clear();      /* completed in error (MPI.Exception) */
        }
        if (done < 0) {
            result = -1;
            break;
        }
        for (Py_ssize_t j = 0; done && j < PyList_GET_SIZE(kept); j++)
            if (PyList_GET_ITEM(kept, j) == r) {  /* the live list: others may have added */
                result = PyList_SetSlice(kept, j, j + 1, NULL);
                break;
            }
    }
    Py_XDECREF(snapshot);
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);  /* release even after an error, which then stands */
    PyObject *released = PyObject_CallMethodNoArgs(lock, s_release);
    Py_XDECREF(released);
    if (et)
        PyErr_Restore(et, ev, etb);
    else if (!released)
        result = -1;
    return result;
}

/* Communicator._p2p_inline's test: 1 where the lane takes the call (`*name` set, and, where
 * `record` is given (a blocking call), `*record` to the flight recorder's newest record where
 * it is this call's to extend, else NULL; both borrowed from the communicator's and the
 * recorder's dicts), 0 where Python does, -1 on error. */
static int
p2p_takes(Lane *l, PyObject *raw, int receives, PyObject *x, PyObject *peer, PyObject *tag,
          PyObject **name, PyObject **record)
{
    if (!PyTuple_CheckExact(raw) || PyTuple_GET_SIZE(raw) != RAW_SIZE ||
            Py_TYPE(x) != (PyTypeObject *)PyTuple_GET_ITEM(raw, RAW_NDARRAY))
        return 0;
    int flags = ((ArrayHead *)x)->flags;
    if (!(flags & C_CONTIGUOUS) || (receives && !(flags & WRITEABLE)))
        return 0;
    PyObject *objects = PyObject_GetAttr(((ArrayHead *)x)->descr, s_hasobject);
    int pointers = objects ? PyObject_IsTrue(objects) : -1;
    Py_XDECREF(objects);
    if (pointers != 0)          /* Python objects (their bytes are pointers): Python refuses */
        return pointers < 0 ? -1 : 0;
    PyObject *bounds = PyDict_GetItemWithError(l->guards, s_p2p_bounds);  /* borrowed */
    if (!bounds || !PyTuple_CheckExact(bounds) || PyTuple_GET_SIZE(bounds) != 2)
        return PyErr_Occurred() ? -1 : 0;
    if (!int_within(peer, 0, PyTuple_GET_ITEM(bounds, 0), 1) ||
            !int_within(tag, 0, PyTuple_GET_ITEM(bounds, 1), 0))
        return 0;
    PyObject *orphaned = PyTuple_GET_ITEM(raw, RAW_ORPHANED);
    if (!PyList_CheckExact(orphaned))
        return 0;
    if (prune_kept(orphaned, PyTuple_GET_ITEM(raw, RAW_MPI_ERROR),
                   PyTuple_GET_ITEM(raw, RAW_KEPT_LOCK)) < 0)
        return -1;              /* (first, as isend/irecv: its tests let go of the GIL) */
    int t;
    if ((t = item_true(l->guards, s_host_p2p)) != 1 || (t = inline_now(l)) != 1)
        return t < 0 ? -1 : 0;
    PyObject *names = PyDict_GetItemWithError(l->guards, s_p2p_names);  /* borrowed */
    if (!names || !PyTuple_CheckExact(names) || PyTuple_GET_SIZE(names) != 2)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *by_peer = PyTuple_GET_ITEM(names, receives);
    Py_ssize_t q = PyLong_AsSsize_t(peer);
    if (!PyList_CheckExact(by_peer) || q >= PyList_GET_SIZE(by_peer))
        return 0;
    *name = PyList_GET_ITEM(by_peer, q);
    if (record)                 /* a blocking call's; an async one's handle makes its own */
        *record = extended_record(l, Py_None, *name);  /* else the recorder makes the next one */
    return PyErr_Occurred() ? -1 : 1;
}

/* Whether calling `method` of `obj` with `args` (nargs of them, obj first) returns true: 1, 0,
 * -1 on error; polled up to `spins` more times while false (P2P_SPINS, or 0: once), yielding
 * the core in between (ranks may share it; the GIL is let go meanwhile), as OpContext.poll's
 * spin does. */
static int
p2p_poll(PyObject *method, PyObject *const *args, size_t nargs, int spins)
{
    for (int i = 0;; i++) {
        PyObject *r = PyObject_VectorcallMethod(method, args, nargs, NULL);
        int ok = r ? PyObject_IsTrue(r) : -1;
        Py_XDECREF(r);
        if (ok != 0 || i == spins)
            return ok;
        Py_BEGIN_ALLOW_THREADS
        sched_yield();
        Py_END_ALLOW_THREADS
    }
}

/* The call's result once its posted `req` (owned) is tested: done, `x` (recv) or None (send);
 * else what comm._p2p_now returns, given the request and the test's error, if any. */
static PyObject *
p2p_finish(Lane *l, int receives, PyObject *const *argv, PyObject *record, PyObject *req)
{
    PyObject *test[1] = {req};
    int ok = p2p_poll(s_Test, test, 1, P2P_SPINS);
    if (ok == 1) {
        Py_DECREF(req);
        set_slot(record, l->at.r_running, s_zero);
        return Py_NewRef(receives ? argv[1] : Py_None);
    }
    PyObject *err = ok < 0 ? caught() : Py_NewRef(Py_None);
    PyObject *call[9] = {l->comm, argv[0], argv[1], argv[2], argv[3], argv[5], record, req, err};
    PyObject *result = PyObject_VectorcallMethod(s_p2p_now, call, 9, NULL);
    Py_DECREF(err);
    Py_DECREF(req);
    return result;
}

/* `method` of `obj` called with [x, byte], peer, tag (Isend, Irecv). */
static PyObject *
p2p_post(PyObject *obj, PyObject *method, PyObject *x, PyObject *byte, PyObject *peer,
         PyObject *tag)
{
    PyObject *msg = PyList_New(2);
    if (!msg)
        return NULL;
    PyList_SET_ITEM(msg, 0, Py_NewRef(x));
    PyList_SET_ITEM(msg, 1, Py_NewRef(byte));
    PyObject *call[4] = {obj, msg, peer, tag};
    PyObject *req = PyObject_VectorcallMethod(method, call, 4, NULL);
    Py_DECREF(msg);
    return req;
}

/* Whether the message that `status` (filled by Iprobe) describes has x's size: 1, 0, -1. */
static int
p2p_fits(PyObject *status, PyObject *byte, PyObject *x)
{
    PyObject *count = PyObject_CallMethodOneArg(status, s_Get_count, byte);
    PyObject *nbytes = count ? PyObject_GetAttr(x, s_nbytes) : NULL;
    int same = nbytes ? PyObject_RichCompareBool(count, nbytes, Py_EQ) : -1;
    Py_XDECREF(count);
    Py_XDECREF(nbytes);
    return same;
}

/* The taken call, numbered in its flight `record` (held, as `name` is): posted, tested. */
static PyObject *
p2p_run(Lane *l, int receives, PyObject *const *argv, PyObject *raw, PyObject *name,
        PyObject *record)
{
    PyObject *x = argv[1], *peer = argv[2], *tag = argv[3];
    PyObject *comm = PyTuple_GET_ITEM(raw, RAW_COMM), *byte = PyTuple_GET_ITEM(raw, RAW_BYTE);
    if (!receives) {
        PyObject *req = p2p_post(comm, s_Isend, x, byte, peer, tag);
        return req ? p2p_finish(l, 0, argv, record, req) :
            hand_failure(l, s_inline_failed, name, record);
    }
    PyObject *status = PyObject_CallNoArgs(PyTuple_GET_ITEM(raw, RAW_STATUS));
    PyObject *call[4] = {comm, peer, tag, status};
    int in = status ? p2p_poll(s_Iprobe, call, 4, P2P_SPINS) : -1;
    int fits = in == 1 ? p2p_fits(status, byte, x) : in;
    Py_XDECREF(status);
    if (fits < 0)
        return hand_failure(l, s_inline_failed, name, record);
    if (!fits) {                /* not in yet, or another size: Python probes (and waits) */
        PyObject *rest[9] = {l->comm, argv[0], x, peer, tag, argv[5], record, Py_None, Py_None};
        return PyObject_VectorcallMethod(s_p2p_now, rest, 9, NULL);
    }
    PyObject *req = p2p_post(comm, s_Irecv, x, byte, peer, tag);
    return req ? p2p_finish(l, 1, argv, record, req) :
        hand_failure(l, s_inline_failed, name, record);
}

/* time.monotonic(): CLOCK_MONOTONIC, the clock Python's reads on Linux. */
static double
monotonic(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* FlightRecorder.issue(name) and the entry's start(), as one: a new FlightEntry, running, the
 * recorder's newest (a new reference), or NULL. */
static PyObject *
issue_started(Lane *l, PyObject *name)
{
    PyObject *entries = PyDict_GetItemWithError(l->flight, s_entries);  /* borrowed */
    if (!entries) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_SystemError, "a FlightRecorder without _entries");
        return NULL;
    }
    Py_INCREF(entries);
    PyObject *seq = next_seq(l);
    PyObject *entry = seq ? l->entry->tp_alloc(l->entry, 0) : NULL;  /* object.__new__ */
    PyObject *now = entry ? PyFloat_FromDouble(monotonic()) : NULL;
    if (now) {
        Offsets *at = &l->at;
        set_slot(entry, at->e_seq, seq);
        set_slot(entry, at->e_name, name);
        set_slot(entry, at->e_what, Py_None);
        set_slot(entry, at->e_state, s_running);
        set_slot(entry, at->e_issued, now);
        set_slot(entry, at->e_started, now);
        set_slot(entry, at->e_ended, Py_None);
    }
    PyObject *added = now && PyDict_SetItem(l->flight, s_repeats, Py_None) == 0 ?
        PyObject_CallMethodOneArg(entries, s_append, entry) : NULL;
    Py_XDECREF(seq);
    Py_XDECREF(now);
    Py_DECREF(entries);
    if (!added) {
        Py_XDECREF(entry);
        return NULL;
    }
    Py_DECREF(added);
    return entry;
}

/* The Posted handle of the async send or recv whose request `req` (borrowed) was just posted,
 * as comm._p2p_post makes it (its flight entry, running; counted in the backend's posted
 * transfers); its driver is this lane's p2p_drive. NULL with an error. */
static PyObject *
p2p_handle(Lane *l, int receives, PyObject *const *argv, PyObject *raw, PyObject *name,
           PyObject *req)
{
    Offsets *at = &l->at;
    PyObject *x = argv[1];
    if (!l->driver && !(l->driver = PyObject_GetAttr((PyObject *)l, s_p2p_drive)))
        return NULL;
    PyObject *backend = Py_XNewRef(PyDict_GetItemWithError(l->guards, s_backend));
    PyObject *limit = backend ? Py_XNewRef(PyDict_GetItemWithError(l->guards, s_limit)) : NULL;
    if (!limit) {               /* (both held: what follows may run Python that replaces them) */
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_SystemError, "a communicator without backend or _limit");
        Py_XDECREF(backend);
        return NULL;
    }
    PyObject *h = l->posted->tp_alloc(l->posted, 0);  /* object.__new__ */
    if (!h) {
        Py_DECREF(backend);
        Py_DECREF(limit);
        return NULL;
    }
    set_slot(h, at->p_done, Py_True);  /* first: dropped on an error below, __del__ keeps out */
    PyObject *expect = Py_NewRef(Py_None), *statuses = Py_NewRef(Py_None);
    if (receives) {
        Py_DECREF(expect);
        Py_DECREF(statuses);
        PyObject *nbytes = PyObject_GetAttr(x, s_nbytes);
        PyObject *shape = nbytes ? PyObject_GetAttr(x, s_shape) : NULL;
        PyObject *status = shape ? PyObject_CallNoArgs(PyTuple_GET_ITEM(raw, RAW_STATUS)) : NULL;
        expect = nbytes && shape ? PyTuple_Pack(3, nbytes, ((ArrayHead *)x)->descr, shape) : NULL;
        statuses = status ? PyList_New(1) : NULL;
        if (statuses)
            PyList_SET_ITEM(statuses, 0, Py_NewRef(status));
        Py_XDECREF(nbytes);
        Py_XDECREF(shape);
        Py_XDECREF(status);
    }
    PyObject *reqs = PyList_New(1), *callbacks = PyList_New(0);
    if (reqs)
        PyList_SET_ITEM(reqs, 0, Py_NewRef(req));
    PyObject *lock = reqs && callbacks && expect && statuses ?
        PyObject_CallNoArgs(l->new_lock) : NULL;
    PyObject *entry = lock ? issue_started(l, name) : NULL;
    PyObject *counted = entry ?
        PyObject_CallMethodOneArg(PyTuple_GET_ITEM(raw, RAW_POSTED), s_append, Py_None) : NULL;
    if (counted) {              /* posted (counted), now in the handle's care */
        set_slot(h, at->p_name, name);
        set_slot(h, at->p_comm, l->comm);
        set_slot(h, at->p_backend, backend);
        set_slot(h, at->p_receives, argv[0]);
        set_slot(h, at->p_peer, argv[2]);
        set_slot(h, at->p_limit, limit);
        set_slot(h, at->p_ctx, Py_None);
        set_slot(h, at->p_result, receives ? x : Py_None);
        set_slot(h, at->p_expect, expect);
        set_slot(h, at->p_statuses, statuses);
        set_slot(h, at->p_reqs, reqs);
        set_slot(h, at->p_entry, entry);
        set_slot(h, at->p_posting, Py_None);
        set_slot(h, at->p_driving, lock);
        set_slot(h, at->p_driver, l->driver);
        set_slot(h, at->p_error, Py_None);
        set_slot(h, at->p_callbacks, callbacks);
        set_slot(h, at->p_done, Py_False);
        Py_DECREF(counted);
    }
    Py_XDECREF(expect);
    Py_XDECREF(statuses);
    Py_XDECREF(reqs);
    Py_XDECREF(callbacks);
    Py_XDECREF(lock);
    Py_XDECREF(entry);
    Py_DECREF(backend);
    Py_DECREF(limit);
    if (!counted)
        Py_CLEAR(h);
    return h;
}

/* An async call, posted here: its handle (p2p_handle), or, where posting raised, what
 * comm._p2p_post makes of the error (it classifies and raises it). Should making the handle
 * fail, the request is kept (the backend's kept requests) with its buffer until it completes. */
static PyObject *
p2p_start(Lane *l, int receives, PyObject *const *argv, PyObject *raw, PyObject *name)
{
    PyObject *req = p2p_post(PyTuple_GET_ITEM(raw, RAW_COMM), receives ? s_Irecv : s_Isend,
                             argv[1], PyTuple_GET_ITEM(raw, RAW_BYTE), argv[2], argv[3]);
    if (req) {
        PyObject *handle = p2p_handle(l, receives, argv, raw, name, req);
        if (!handle) {
            PyObject *et, *ev, *etb;
            PyErr_Fetch(&et, &ev, &etb);
            if (PyList_Append(PyTuple_GET_ITEM(raw, RAW_ORPHANED), req) < 0)
                PyErr_Clear();  /* (the first error stands) */
            PyErr_Restore(et, ev, etb);
        }
        Py_DECREF(req);
        return handle;
    }
    PyObject *err = caught();
    PyObject *call[11] = {l->comm, argv[0], argv[1], argv[1], name, argv[2], argv[3], Py_None,
                          Py_False, Py_None, err};
    PyObject *handle = PyObject_VectorcallMethod(s_p2p_post, call, 11, NULL);
    Py_DECREF(err);
    return handle;
}

/* handle._drive_py(block): Python's way to drive a Posted handle. */
static PyObject *
drive_py(PyObject *h, int block)
{
    return PyObject_CallMethodOneArg(h, s_drive_py, block ? Py_True : Py_False);
}

/* Settle a Posted handle whose transfer completed, as Posted._finished does where the
 * message had the right size: under SETTLING its outcome set, its flight entry done, counted
 * off; the done-callbacks to run (a new reference, maybe empty), or NULL (nothing changed where
 * SETTLING couldn't be taken). */
static PyObject *
p2p_settle_done(Lane *l, PyObject *h, PyObject *raw)
{
    Offsets *at = &l->at;
    PyObject *now = PyFloat_FromDouble(monotonic()), *none_yet = now ? PyList_New(0) : NULL;
    PyObject *got = none_yet ? PyObject_CallMethodNoArgs(l->settling, s_acquire) : NULL;
    if (!got) {
        Py_XDECREF(now);
        Py_XDECREF(none_yet);
        return NULL;
    }
    Py_DECREF(got);
    PyObject *callbacks = Py_XNewRef(SLOT(h, at->p_callbacks));
    set_slot(h, at->p_error, Py_None);
    set_slot(h, at->p_done, Py_True);
    set_slot(h, at->p_callbacks, none_yet);
    Py_DECREF(none_yet);
    PyObject *entry = SLOT(h, at->p_entry);
    if (entry && Py_TYPE(entry) == l->entry) {
        set_slot(entry, at->e_state, s_done);
        set_slot(entry, at->e_ended, now);
    }
    Py_DECREF(now);
    PyObject *posted = PyTuple_GET_ITEM(raw, RAW_POSTED);  /* backend.posted(-1) */
    Py_ssize_t n = PyList_Check(posted) ? PyList_GET_SIZE(posted) : 0;
    int ok = n == 0 || PyList_SetSlice(posted, n - 1, n, NULL) == 0;
    if (!callbacks && ok) {
        PyErr_SetString(PyExc_SystemError, "a Posted handle without _callbacks");
        ok = 0;
    }
    if (release_keeping_error(l->settling) < 0 || !ok) {
        Py_XDECREF(callbacks);
        return NULL;
    }
    return callbacks;
}

/* The driven part of p2p_drive, `lock` (the handle's driving lock) held: test the transfer
 * (blocking: poll P2P_SPINS times more) and settle it where done; 1 done (settled), 0 not
 * done (the lock still held: the caller lets go), -1 error. The done-callbacks to run go to
 * *callbacks. */
static int
p2p_drive_held(Lane *l, PyObject *h, PyObject *raw, int block, PyObject **callbacks)
{
    Offsets *at = &l->at;
    if (SLOT(h, at->p_done) == Py_True)
        return 1;
    PyObject *reqs = Py_XNewRef(SLOT(h, at->p_reqs)), *stats = Py_XNewRef(SLOT(h, at->p_statuses));
    if (!reqs || !stats) {
        Py_XDECREF(reqs);
        Py_XDECREF(stats);
        PyErr_SetString(PyExc_SystemError, "a Posted handle without _reqs or _statuses");
        return -1;
    }
    PyObject *call[3] = {PyTuple_GET_ITEM(raw, RAW_REQUEST), reqs, stats};
    int ok = p2p_poll(s_Testall, call, 3, block ? P2P_SPINS : 0);
    int result = ok;
    if (ok < 0) {               /* MPI's error: classified and settled by Python */
        PyObject *value = caught();
        PyObject *r = PyObject_CallMethodOneArg(h, s_test_failed, value);
        Py_DECREF(value);
        result = r ? 1 : -1;
        Py_XDECREF(r);
    }
    else if (ok == 1) {
        PyObject *expect = SLOT(h, at->p_expect);
        int fits = 1;
        if (expect && expect != Py_None) {  /* a receive: the message's size, as _finished */
            fits = -1;
            if (PyTuple_Check(expect) && PyTuple_GET_SIZE(expect) == 3 && PyList_Check(stats) &&
                    PyList_GET_SIZE(stats) == 1) {
                PyObject *count = PyObject_CallMethodOneArg(
                    PyList_GET_ITEM(stats, 0), s_Get_count, PyTuple_GET_ITEM(raw, RAW_BYTE));
                fits = count ? PyObject_RichCompareBool(count, PyTuple_GET_ITEM(expect, 0),
                                                        Py_EQ) : -1;
                Py_XDECREF(count);
            }
            else
                PyErr_SetString(PyExc_SystemError, "a Posted receive without its expect");
        }
        if (fits == 1)
            result = (*callbacks = p2p_settle_done(l, h, raw)) ? 1 : -1;
        else if (fits == 0) {   /* another size: Python's MismatchError */
            PyObject *r = PyObject_CallMethodNoArgs(h, s_finished);
            result = r ? 1 : -1;
            Py_XDECREF(r);
        }
        else
            result = -1;
    }
    Py_DECREF(reqs);
    Py_DECREF(stats);
    return result;
}

/* p2p_drive(handle, block) -> whether the Posted handle's transfer is done: Posted._drive_py
 * in C for a handle this lane posted, as far as it goes without waiting long (what is left,
 * Python's: a post queued behind other calls, a wait past P2P_SPINS polls, with its timeout). */
static PyObject *
lane_p2p_drive(Lane *l, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 2) {
        PyErr_SetString(PyExc_TypeError, "p2p_drive(handle, block)");
        return NULL;
    }
    PyObject *h = argv[0];
    int block = PyObject_IsTrue(argv[1]);
    if (block < 0)
        return NULL;
    if (Py_TYPE(h) != l->posted)
        return drive_py(h, block);
    if (SLOT(h, l->at.p_done) == Py_True)
        Py_RETURN_TRUE;
    PyObject *raw = PyDict_GetItemWithError(l->guards, s_p2p_raw);  /* borrowed */
    PyObject *lock = SLOT(h, l->at.p_driving);
    if (!raw || !PyTuple_CheckExact(raw) || PyTuple_GET_SIZE(raw) != RAW_SIZE || !lock ||
            SLOT(h, l->at.p_posting) != Py_None)
        return PyErr_Occurred() ? NULL : drive_py(h, block);
    Py_INCREF(raw);
    Py_INCREF(lock);
    PyObject *got = PyObject_CallMethodOneArg(lock, s_acquire, Py_False);
    int held = got ? got == Py_True : -1;
    Py_XDECREF(got);
    PyObject *callbacks = NULL;
    int done = held == 1 ? p2p_drive_held(l, h, raw, block, &callbacks) : held;
    if (held == 1 && release_keeping_error(lock) < 0)  /* let go whatever happened */
        done = -1;
    Py_DECREF(lock);
    Py_DECREF(raw);
    if (done == 0)              /* not done (or another thread drives it): Python waits */
        return block ? drive_py(h, 1) : Py_NewRef(Py_False);
    if (done < 0) {
        Py_XDECREF(callbacks);
        return NULL;
    }
    if (callbacks && PyList_GET_SIZE(callbacks)) {  /* Posted.run_callbacks: each one's error
                                                      * logged, the rest run */
        PyObject *r = PyObject_CallMethodOneArg(h, s_run_callbacks, callbacks);
        Py_DECREF(callbacks);
        if (!r)
            return NULL;
        Py_DECREF(r);
    }
    else
        Py_XDECREF(callbacks);
    Py_RETURN_TRUE;
}

static PyObject *
lane_p2p(Lane *l, PyObject *const *argv, Py_ssize_t argc)
{
    if (argc != 6) {
        PyErr_SetString(PyExc_TypeError, "p2p(receives, x, peer, tag, async_op, timeout)");
        return NULL;
    }
    int receives = PyObject_IsTrue(argv[0]);
    if (receives < 0)
        return NULL;
    PyObject *raw = PyDict_GetItemWithError(l->guards, s_p2p_raw);  /* borrowed */
    if (!raw && PyErr_Occurred())
        return NULL;
    Py_XINCREF(raw);            /* the guards and the run may run Python that replaces it */
    PyObject *name = NULL, *record = NULL;
    int async_op = argv[4] == Py_True;
    int t = raw && (async_op || argv[4] == Py_False) && argv[5] == Py_None ?
        p2p_takes(l, raw, receives, argv[1], argv[2], argv[3], &name,
                  async_op ? NULL : &record) : 0;
    if (t <= 0) {
        Py_XDECREF(raw);
        if (t < 0)
            return NULL;
        PyObject *call[7] = {l->comm, argv[0], argv[1], argv[2], argv[3], argv[4], argv[5]};
        return PyObject_VectorcallMethod(s_p2p_slow, call, 7, NULL);
    }
    Py_INCREF(name);
    if (async_op) {
        PyObject *handle = p2p_start(l, receives, argv, raw, name);
        Py_DECREF(name);
        Py_DECREF(raw);
        return handle;
    }
    if (record) {
        Py_INCREF(record);
        if (extend_record(l, record) < 0)
            Py_CLEAR(record);
    }
    else {
        PyObject *flight = PyDict_GetItemWithError(l->guards, s_flight);  /* borrowed */
        record = flight ? PyObject_CallMethodOneArg(flight, s_issue_running, name) : NULL;
        if (!record && !PyErr_Occurred())
            PyErr_SetString(PyExc_SystemError, "a Communicator without _flight");
    }
    PyObject *result = record ? p2p_run(l, receives, argv, raw, name, record) : NULL;
    Py_XDECREF(record);
    Py_DECREF(name);
    Py_DECREF(raw);
    return result;
}

static int
lane_traverse(Lane *l, visitproc visit, void *arg)
{
    Py_VISIT(l->comm);
    Py_VISIT(l->guards);
    Py_VISIT(l->by_kind);
    Py_VISIT(l->executor);
    Py_VISIT(l->flight);
    Py_VISIT(l->state);
    Py_VISIT(l->prepared);
    Py_VISIT(l->repeats);
    Py_VISIT(l->run);
    Py_VISIT(l->handle);
    Py_VISIT(l->posted);
    Py_VISIT(l->entry);
    Py_VISIT(l->settling);
    Py_VISIT(l->new_lock);
    Py_VISIT(l->driver);
    return 0;
}

static int
lane_clear(Lane *l)
{
    Py_CLEAR(l->comm);
    Py_CLEAR(l->guards);
    Py_CLEAR(l->by_kind);
    Py_CLEAR(l->executor);
    Py_CLEAR(l->flight);
    Py_CLEAR(l->state);
    Py_CLEAR(l->prepared);
    Py_CLEAR(l->repeats);
    Py_CLEAR(l->run);
    Py_CLEAR(l->handle);
    Py_CLEAR(l->posted);
    Py_CLEAR(l->entry);
    Py_CLEAR(l->settling);
    Py_CLEAR(l->new_lock);
    Py_CLEAR(l->driver);
    return 0;
}

static void
lane_dealloc(Lane *l)
{
    PyObject_GC_UnTrack(l);
    lane_clear(l);
    Py_TYPE(l)->tp_free((PyObject *)l);
}

/* Whether `type` declares exactly `count` slots (__slots__): the lane makes its objects slot
 * by slot, so a slot added to the class must be added here too. 0, or -1 with an error. */
static int
slot_count(PyTypeObject *type, Py_ssize_t count)
{
    PyObject *slots = PyObject_GetAttrString((PyObject *)type, "__slots__");
    Py_ssize_t n = slots ? PyObject_Length(slots) : -1;
    Py_XDECREF(slots);
    if (n == count)
        return 0;
    if (n >= 0)
        PyErr_Format(PyExc_TypeError, "%s has %zd slots, the compiled lane makes %zd",
                     type->tp_name, n, count);
    return -1;
}

static int
lane_offsets(Lane *l)
{
    Offsets *at = &l->at;
    return (at->matches = slot_offset(l->prepared, "matches")) < 0 ||
        (at->lean = slot_offset(l->prepared, "lean")) < 0 ||
        (at->result = slot_offset(l->prepared, "result")) < 0 ||
        (at->kind = slot_offset(l->prepared, "kind")) < 0 ||
        (at->what = slot_offset(l->prepared, "what")) < 0 ||
        (at->r_what = slot_offset(l->repeats, "what")) < 0 ||
        (at->r_name = slot_offset(l->repeats, "name")) < 0 ||
        (at->r_last = slot_offset(l->repeats, "last")) < 0 ||
        (at->r_running = slot_offset(l->repeats, "running")) < 0 ||
        (at->go = slot_offset(l->run, "go")) < 0 ||
        (at->start = slot_offset(l->run, "start")) < 0 ||
        (at->complete = slot_offset(l->run, "complete")) < 0 ||
        (at->soon = slot_offset(l->run, "soon")) < 0 ||
        (at->starts_inline = slot_offset(l->run, "starts_inline")) < 0 ||
        (at->h_name = slot_offset(l->handle, "name")) < 0 ||
        (at->h_completion = slot_offset(l->handle, "_completion")) < 0 ||
        (at->h_done = slot_offset(l->handle, "_done")) < 0 ||
        (at->h_claimed = slot_offset(l->handle, "_claimed")) < 0 ||
        (at->h_result = slot_offset(l->handle, "_result")) < 0 ||
        (at->h_error = slot_offset(l->handle, "_error")) < 0 ||
        (at->h_callbacks = slot_offset(l->handle, "_callbacks")) < 0 ||
        (at->p_name = slot_offset(l->posted, "name")) < 0 ||
        (at->p_comm = slot_offset(l->posted, "_comm")) < 0 ||
        (at->p_backend = slot_offset(l->posted, "_backend")) < 0 ||
        (at->p_receives = slot_offset(l->posted, "_receives")) < 0 ||
        (at->p_peer = slot_offset(l->posted, "_peer")) < 0 ||
        (at->p_limit = slot_offset(l->posted, "_limit")) < 0 ||
        (at->p_ctx = slot_offset(l->posted, "_ctx")) < 0 ||
        (at->p_result = slot_offset(l->posted, "_result")) < 0 ||
        (at->p_expect = slot_offset(l->posted, "_expect")) < 0 ||
        (at->p_statuses = slot_offset(l->posted, "_statuses")) < 0 ||
        (at->p_reqs = slot_offset(l->posted, "_reqs")) < 0 ||
        (at->p_entry = slot_offset(l->posted, "_entry")) < 0 ||
        (at->p_posting = slot_offset(l->posted, "_posting")) < 0 ||
        (at->p_driving = slot_offset(l->posted, "_driving")) < 0 ||
        (at->p_driver = slot_offset(l->posted, "_driver")) < 0 ||
        (at->p_done = slot_offset(l->posted, "_done")) < 0 ||
        (at->p_error = slot_offset(l->posted, "_error")) < 0 ||
        (at->p_callbacks = slot_offset(l->posted, "_callbacks")) < 0 ||
        (at->e_seq = slot_offset(l->entry, "seq")) < 0 ||
        (at->e_name = slot_offset(l->entry, "name")) < 0 ||
        (at->e_what = slot_offset(l->entry, "what")) < 0 ||
        (at->e_state = slot_offset(l->entry, "state")) < 0 ||
        (at->e_issued = slot_offset(l->entry, "issued")) < 0 ||
        (at->e_started = slot_offset(l->entry, "started")) < 0 ||
        (at->e_ended = slot_offset(l->entry, "ended")) < 0 ||
        slot_count(l->posted, 18) < 0 || slot_count(l->entry, 7) < 0 ? -1 : 0;
}

static PyObject *
lane_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *comm, *by_kind, *executor, *flight, *state, *prepared, *repeats, *run, *handle;
    PyObject *posted, *entry, *settling, *new_lock;
    if (!PyArg_ParseTuple(args, "OO!OOO!O!O!O!O!(O!O!OO)", &comm, &PyDict_Type, &by_kind,
                          &executor, &flight, &PyDict_Type, &state, &PyType_Type, &prepared,
                          &PyType_Type, &repeats, &PyType_Type, &run, &PyType_Type, &handle,
                          &PyType_Type, &posted, &PyType_Type, &entry, &settling, &new_lock))
        return NULL;
    Lane *l = (Lane *)type->tp_alloc(type, 0);
    if (!l)
        return NULL;
    l->comm = Py_NewRef(comm);
    l->by_kind = Py_NewRef(by_kind);
    l->state = Py_NewRef(state);
    l->prepared = (PyTypeObject *)Py_NewRef(prepared);
    l->repeats = (PyTypeObject *)Py_NewRef(repeats);
    l->run = (PyTypeObject *)Py_NewRef(run);
    l->handle = (PyTypeObject *)Py_NewRef(handle);
    l->posted = (PyTypeObject *)Py_NewRef(posted);
    l->entry = (PyTypeObject *)Py_NewRef(entry);
    l->settling = Py_NewRef(settling);
    l->new_lock = Py_NewRef(new_lock);
    l->guards = PyObject_GenericGetDict(comm, NULL);
    l->executor = l->guards ? PyObject_GenericGetDict(executor, NULL) : NULL;
    l->flight = l->executor ? PyObject_GenericGetDict(flight, NULL) : NULL;
    if (!l->flight || lane_offsets(l) < 0) {
        Py_DECREF(l);
        return NULL;
    }
    return (PyObject *)l;
}

static PyMethodDef lane_methods[] = {
    {"run", (PyCFunction)(void (*)(void))lane_call, METH_FASTCALL,
     "run(kind, x, out, args, check, async_op) -> the call's result (or Handle): a repeat on "
     "numpy arrays or torch tensors runs (or starts) here; anything else goes to the "
     "communicator's Python."},
    {"repeat", (PyCFunction)(void (*)(void))lane_repeat, METH_FASTCALL,
     "repeat(entry, async_op) -> Communicator._repeat(entry, async_op), inline in C where it "
     "may."},
    {"complete", (PyCFunction)(void (*)(void))lane_complete, METH_FASTCALL,
     "complete(block, soon=False) -> whether no started repeat is left: "
     "Communicator._complete in C."},
    {"p2p", (PyCFunction)(void (*)(void))lane_p2p, METH_FASTCALL,
     "p2p(receives, x, peer, tag, async_op, timeout) -> Communicator.send's (receives 0) or "
     "recv's result: one on a numpy array runs (blocking) or is posted (async) here; anything "
     "else goes to the communicator's Python (_p2p_slow)."},
    {"p2p_drive", (PyCFunction)(void (*)(void))lane_p2p_drive, METH_FASTCALL,
     "p2p_drive(handle, block) -> whether the async send's or recv's transfer is done: "
     "Posted._drive_py in C for a handle p2p posted (what waits long, Python's)."},
    {NULL},
};

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "topocoll.collectives._match.Lane",
    .tp_doc = "Lane(comm, by_kind, executor, flight, log_flags, Prepared, Repeats, Run, "
              "StartedHandle, (Posted, FlightEntry, SETTLING, Lock)): a communicator's way to "
              "its repeated calls and its send and recv (see _match.c)",
    .tp_basicsize = sizeof(Lane),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = lane_new,
    .tp_dealloc = (destructor)lane_dealloc,
    .tp_traverse = (traverseproc)lane_traverse,
    .tp_clear = (inquiry)lane_clear,
    .tp_methods = lane_methods,
};

static int
intern_names(void)
{
    struct { PyObject **s; const char *name; } names[] = {
        {&s_pending, "_pending"}, {&s_owner, "_owner"}, {&s_broken, "_broken"},
        {&s_closed, "_closed"}, {&s_started, "_started"}, {&s_seq, "_seq"},
        {&s_repeats, "_repeats"}, {&s_trace, "trace"}, {&s_lane_slow, "_lane_slow"},
        {&s_repeat, "_repeat"}, {&s_repeat_failed, "_repeat_failed"},
        {&s_completion, "_completion"}, {&s_completing, "_completing"},
        {&s_acquire, "acquire"}, {&s_release, "release"}, {&s_settle, "_settle"},
        {&s_run_callbacks, "run_callbacks"}, {&s_lean, "lean"}, {&s_watched, "_watched"},
        {&s_watch, "_watch"}, {&s_shape, "shape"}, {&s_dtype, "dtype"}, {&s_stride, "stride"},
        {&s_data_ptr, "data_ptr"}, {&s_p2p_raw, "_p2p_raw"}, {&s_p2p_bounds, "_p2p_bounds"},
        {&s_p2p_names, "_p2p_names"}, {&s_host_p2p, "_host_p2p"}, {&s_p2p_slow, "_p2p_slow"},
        {&s_p2p_now, "_p2p_now"}, {&s_inline_failed, "_inline_failed"}, {&s_flight, "_flight"},
        {&s_issue_running, "issue_running"}, {&s_Isend, "Isend"},
        {&s_Irecv, "Irecv"}, {&s_Iprobe, "Iprobe"}, {&s_Test, "Test"},
        {&s_Get_count, "Get_count"}, {&s_nbytes, "nbytes"}, {&s_hasobject, "hasobject"},
        {&s_p2p_post, "_p2p_post"}, {&s_entries, "_entries"}, {&s_append, "append"},
        {&s_Testall, "Testall"}, {&s_limit, "_limit"}, {&s_backend, "backend"},
        {&s_running, "running"}, {&s_done, "done"}, {&s_test_failed, "_test_failed"},
        {&s_finished, "_finished"}, {&s_drive_py, "_drive_py"}, {&s_p2p_drive, "p2p_drive"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!(*names[i].s = PyUnicode_InternFromString(names[i].name)))
            return -1;
    return (s_zero = PyLong_FromLong(0)) ? 0 : -1;
}

/* layout(ndarray, a) -> (data, nd, shape, strides, descr, writeable, c_contiguous), read as
 * matches() and the lane read them: prepared.py compares this with numpy's own answers before
 * trusting the layout. */
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
    return Py_BuildValue("(niNNOOO)", (Py_ssize_t)h->data, h->nd, shape, strides, h->descr,
                         (h->flags & WRITEABLE) ? Py_True : Py_False,
                         (h->flags & C_CONTIGUOUS) ? Py_True : Py_False);
}

static PyMethodDef module_methods[] = {
    {"layout", layout, METH_VARARGS,
     "layout(ndarray, a) -> (data, nd, shape, strides, dtype, writeable, c_contiguous) as read "
     "in C."},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_match",
    "Whether a call repeats a prepared one, and the lane that runs it, in C (see "
    "prepared.PreparedCalls.find and Communicator._lane).", -1,
    module_methods,
};

PyMODINIT_FUNC
PyInit__match(void)
{
    if (PyType_Ready(&MatchType) < 0 || PyType_Ready(&LaneType) < 0 || intern_names() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddObjectRef(m, "Match", (PyObject *)&MatchType) < 0 ||
              PyModule_AddObjectRef(m, "Lane", (PyObject *)&LaneType) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
