/* The prepared shared-memory run of a small collective in C: publish, raise the flag, wait for
 * the peers' flags, compare signatures, copy out or reduce. The same protocol, memory layout and
 * rank-order arithmetic as shm.prepare's Python run (which stays as the fallback and is what
 * this module is tested against); compiled because the Python run alone costs more than MPI's
 * whole call at 8 bytes. Its reduction loop (reduce_buffers) also serves the larger calls'
 * chunks from Python (reduce_into): one pass per three inputs where numpy makes one per input.
 * Memory order: release store of the flag after the data, acquire loads
 * of the peers' flags before reading theirs (a fence where the CPU needs one, none on x86).
 *
 * Built when a C compiler is present (optional extension); without it the Python run is used.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>

enum { DONE = 1, FINISH_IN_PYTHON = 2, SYNC_AGAIN = 3, NOT_YET = 0, MISMATCH = -1 };
enum { OP_SUM, OP_PROD, OP_MIN, OP_MAX, OP_BAND, OP_BOR, OP_BXOR };

typedef struct {
    char *dst;
    const char *src;
    Py_ssize_t n;
} Copy;

typedef struct {
    PyObject_HEAD
    int ranks;
    int64_t *counters;          /* the arena's (step, published, epoch), stepped per run */
    int64_t mark;               /* the run begun last: the step to rewind to, */
    int half, area;             /* its data half and publication area, */
    int64_t epoch;              /* and its barrier's epoch */
    int64_t *my_flag;
    int64_t **flags;            /* every rank's flag */
    const char *sig;            /* this call's signature bytes (kept alive by sig_obj) */
    Py_ssize_t sig_len;
    char *my_sig[2];            /* this rank's signature words, per publication area */
    const char **every_sig[2];  /* every rank's, per area */
    const char *gate;           /* the registration gate's words of an unregistered rank */
    Py_ssize_t gate_len;        /* (0: the call has no gate) */
    char *my_gate[2];           /* this rank's gate words, per area */
    const char **every_gate[2]; /* every rank's, per area */
    char *publish[2];           /* this rank's slot, per half (NULL: publishes nothing) */
    const char *source;
    Py_ssize_t source_len;
    Copy *copies[2];            /* what moves after the barrier, per half */
    Py_ssize_t n_copies;
    char dtype;                 /* reduce: numpy type char, 0 for none */
    int numpy_reduces;          /* the reduction is left to Python (numpy): FINISH_IN_PYTHON */
    int op;
    char *out;
    const char **inputs[2];     /* every rank's slot to reduce, per half */
    Py_ssize_t count;
    PyObject *keep;             /* every buffer object above, kept alive */
    PyObject *finish;           /* go(): finish(plan, code) where the run isn't done in C */
    int spins;                  /* go(): polls before handing the wait to finish */
    Py_buffer *views;
    Py_ssize_t n_views, max_views;
} Plan;

/* Borrow obj's memory for the plan's lifetime: its address, at least `need` bytes. */
static int
addr(Plan *p, PyObject *obj, int writable, Py_ssize_t need, char **out)
{
    if (p->n_views >= p->max_views) {
        PyErr_SetString(PyExc_ValueError, "more buffers than the plan has room for");
        return -1;
    }
    Py_buffer *v = &p->views[p->n_views];
    if (PyObject_GetBuffer(obj, v, (writable ? PyBUF_WRITABLE : PyBUF_SIMPLE)) < 0)
        return -1;
    p->n_views++;
    if (v->len < need) {
        PyErr_Format(PyExc_ValueError, "a buffer of %zd bytes where %zd are needed", v->len, need);
        return -1;
    }
    *out = (char *)v->buf;
    return 0;
}

static Py_ssize_t
itemsize(char type)
{
    switch (type) {
    case 'b': case 'B': return 1;
    case 'h': case 'H': return 2;
    case 'i': case 'I': case 'f': return 4;
    case 'l': case 'L': return sizeof(long);
    case 'q': case 'Q': case 'd': return 8;
    }
    return 0;
}

/* out = in[0] (op) in[1] (op) ... (op) in[k-1], element by element in that order (k >= 2),
 * whatever the blocking: every rank that reduces a region gets numpy's pairwise-in-order result
 * bit for bit. In blocks that stay in L1, up to four inputs per pass over a block, so a region
 * is stored once per three inputs rather than once per input. out may be in[0]. */
enum { BLOCK = 4096 };

#define PASS(T, EXPR, base, m)                                                 \
    switch (m) {                                                               \
    case 3: {                                                                  \
        const T *u = (const T *)in[q], *v = (const T *)in[q + 1], *w = (const T *)in[q + 2]; \
        for (Py_ssize_t i = s; i < e; i++) {                                   \
            T x = base[i], y = u[i]; x = (EXPR); y = v[i]; x = (EXPR); y = w[i]; o[i] = (EXPR); \
        }                                                                      \
        break;                                                                 \
    }                                                                          \
    case 2: {                                                                  \
        const T *u = (const T *)in[q], *v = (const T *)in[q + 1];              \
        for (Py_ssize_t i = s; i < e; i++) {                                   \
            T x = base[i], y = u[i]; x = (EXPR); y = v[i]; o[i] = (EXPR);      \
        }                                                                      \
        break;                                                                 \
    }                                                                          \
    default: {                                                                 \
        const T *u = (const T *)in[q];                                         \
        for (Py_ssize_t i = s; i < e; i++) { T x = base[i], y = u[i]; o[i] = (EXPR); } \
    }                                                                          \
    }

#define REDUCE_LOOP(T, EXPR)                                                   \
    do {                                                                       \
        T *o = (T *)out;                                                       \
        const T *first = (const T *)in[0];                                     \
        for (Py_ssize_t s = 0; s < n; s += BLOCK) {                            \
            Py_ssize_t e = n - s < BLOCK ? n : s + BLOCK;                      \
            int q = 1, m = k - 1 < 3 ? k - 1 : 3;                              \
            PASS(T, EXPR, first, m);                                           \
            for (q += m; q < k; q += m) {                                      \
                m = k - q < 3 ? k - q : 3;                                     \
                PASS(T, EXPR, o, m);                                           \
            }                                                                  \
        }                                                                      \
    } while (0)

/* Integers wrap as numpy's do: signed sums and products go through the unsigned type (products
 * from 1u, so types narrower than int are not promoted to a signed int that could overflow). */
#define INT_OPS(S, U)                                                          \
    switch (op) {                                                              \
    case OP_SUM: REDUCE_LOOP(S, (S)((U)x + (U)y)); break;                      \
    case OP_PROD: REDUCE_LOOP(S, (S)(U)(1u * (U)x * (U)y)); break;                     \
    case OP_MIN: REDUCE_LOOP(S, x < y ? x : y); break;                         \
    case OP_MAX: REDUCE_LOOP(S, x > y ? x : y); break;                         \
    case OP_BAND: REDUCE_LOOP(S, (S)((U)x & (U)y)); break;                     \
    case OP_BOR: REDUCE_LOOP(S, (S)((U)x | (U)y)); break;                      \
    default: REDUCE_LOOP(S, (S)((U)x ^ (U)y));                                 \
    }

/* Floats: sum and product only (numpy's min/max NaN and signed-zero rules stay with numpy). */
#define FLOAT_OPS(T)                                                           \
    switch (op) {                                                              \
    case OP_SUM: REDUCE_LOOP(T, x + y); break;                                 \
    default: REDUCE_LOOP(T, x * y);                                            \
    }

/* Whether there is a loop for numpy type char `type` (a one-character string) and `op`; Python
 * asks the same through has_loop (compiled.reduces). */
static int
has_loop(const char *type, int op)
{
    if (type[0] == '\0' || type[1] != '\0' || op < OP_SUM || op > OP_BXOR || itemsize(type[0]) == 0)
        return 0;
    return (type[0] != 'f' && type[0] != 'd') || op == OP_SUM || op == OP_PROD;
}

static void
reduce_buffers(char *out, const char **in, int k, Py_ssize_t n, char type, int op)
{
    if (k == 1) {
        memmove(out, in[0], n * itemsize(type));
        return;
    }
    switch (type) {
    case 'b': INT_OPS(int8_t, uint8_t); break;
    case 'B': INT_OPS(uint8_t, uint8_t); break;
    case 'h': INT_OPS(int16_t, uint16_t); break;
    case 'H': INT_OPS(uint16_t, uint16_t); break;
    case 'i': INT_OPS(int32_t, uint32_t); break;
    case 'I': INT_OPS(uint32_t, uint32_t); break;
    case 'q': INT_OPS(int64_t, uint64_t); break;
    case 'Q': INT_OPS(uint64_t, uint64_t); break;
    case 'l':
        if (sizeof(long) == 8) INT_OPS(int64_t, uint64_t) else INT_OPS(int32_t, uint32_t)
        break;
    case 'L':
        if (sizeof(long) == 8) INT_OPS(uint64_t, uint64_t) else INT_OPS(uint32_t, uint32_t)
        break;
    case 'f': FLOAT_OPS(float); break;
    case 'd': FLOAT_OPS(double); break;
    }
}

static void
reduce(Plan *p, int half)
{
    reduce_buffers(p->out, p->inputs[half], p->ranks, p->count, p->dtype, p->op);
}

static int
arrived(Plan *p, int64_t epoch)
{
    for (int q = 0; q < p->ranks; q++)
        if (__atomic_load_n(p->flags[q], __ATOMIC_ACQUIRE) < epoch)
            return 0;
    return 1;
}

/* Begin a run: step the arena's counters as SharedArena.begin and arrive do, and remember
 * where this run is (mark, half, area, epoch). */
static void
begin(Plan *p)
{
    int64_t *c = p->counters;
    p->mark = c[0]++;
    c[1]++;
    p->epoch = ++c[2];
    p->half = (int)(c[0] & 1);
    p->area = (int)(c[1] & 1);
}

static void
start(Plan *p)
{
    if (p->sig_len)
        memcpy(p->my_sig[p->area], p->sig, p->sig_len);
    if (p->gate_len)
        memcpy(p->my_gate[p->area], p->gate, p->gate_len);
    if (p->publish[p->half])
        memcpy(p->publish[p->half], p->source, p->source_len);
    __atomic_store_n(p->my_flag, p->epoch, __ATOMIC_RELEASE);
}

/* After the barrier (and the gate's second one, if any): the copies and the reduction. */
static int
after(Plan *p)
{
    int half = p->half;
    for (Py_ssize_t k = 0; k < p->n_copies; k++) {
        Copy *c = &p->copies[half][k];
        memcpy(c->dst, c->src, c->n);
    }
    if (!p->dtype)
        return p->numpy_reduces ? FINISH_IN_PYTHON : DONE;
    reduce(p, half);
    return DONE;
}

/* After the barrier: the signatures; then, where a peer's gate words say its buffer is
 * registered, SYNC_AGAIN (it copies in only after this barrier: Python syncs, then after());
 * else after(). */
static int
finish(Plan *p)
{
    int area = p->area;
    for (int q = 0; q < p->ranks; q++)
        if (p->sig_len && memcmp(p->every_sig[area][q], p->sig, p->sig_len) != 0)
            return MISMATCH;
    for (int q = 0; q < p->ranks; q++)
        if (p->gate_len && memcmp(p->every_gate[area][q], p->gate, p->gate_len) != 0)
            return SYNC_AGAIN;
    return after(p);
}

/* Poll the flags a little (yielding the core: ranks may share it); NOT_YET hands the wait
 * to Python, which sleeps and enforces the deadline. */
static int
complete(Plan *p, int spins)
{
    int ok = arrived(p, p->epoch);
    if (!ok && spins) {
        Py_BEGIN_ALLOW_THREADS
        for (int i = 0; i < spins && !(ok = arrived(p, p->epoch)); i++)
            sched_yield();
        Py_END_ALLOW_THREADS
    }
    return ok ? finish(p) : NOT_YET;
}

/* complete()'s and run()'s argument: how many polls before handing the wait to Python. */
static int
spins_arg(PyObject *arg, int *spins)
{
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return -1;
    *spins = n < 0 ? 0 : (n > 1 << 20 ? 1 << 20 : (int)n);
    return 0;
}

static PyObject *
plan_start(Plan *p, PyObject *unused)
{
    begin(p);
    start(p);
    Py_RETURN_NONE;
}

static PyObject *
plan_complete(Plan *p, PyObject *arg)
{
    int spins;
    if (spins_arg(arg, &spins) < 0)
        return NULL;
    return PyLong_FromLong(complete(p, spins));
}

/* The Python finish bound by on_wait, called for a run that did not end in C: its result. */
static PyObject *
call_finish(Plan *p, int code)
{
    PyObject *c = PyLong_FromLong(code);
    if (!c)
        return NULL;
    PyObject *r = PyObject_CallFunctionObjArgs(p->finish, (PyObject *)p, c, NULL);
    Py_DECREF(c);
    return r;
}

/* The whole run, blocking, in one call from Python: start, complete within the spins bound
 * with on_wait, then the Python finish bound there (a longer wait, a mismatch, the gate's second
 * barrier, a reduction left to numpy) only where the run did not end in C. */
static PyObject *
plan_go(Plan *p, PyObject *unused)
{
    if (!p->finish) {
        PyErr_SetString(PyExc_RuntimeError, "go() before on_wait()");
        return NULL;
    }
    begin(p);
    start(p);
    int code = complete(p, p->spins);
    if (code == DONE)
        Py_RETURN_NONE;
    return call_finish(p, code);
}

/* complete(block) for a started run, as its handle waits or tests: poll (the on_wait spins if
 * block, else once), then the Python finish where the run did not end in C. Whether it is
 * done: False only where block is false and a peer has not arrived. how >= 2 polls up to that
 * many times, yielding between, and never waits longer: an async call issued while the one
 * before it is still out finishes that one this way, in C, before its own Python time-bound
 * spin (a started call must not block its successor's issue on a late peer). */
static PyObject *
plan_wait(Plan *p, PyObject *arg)
{
    long how = PyLong_AsLong(arg);  /* False 0, True 1 */
    if (how == -1 && PyErr_Occurred())
        return NULL;
    if (!p->finish) {
        PyErr_SetString(PyExc_RuntimeError, "wait() before on_wait()");
        return NULL;
    }
    int spins = how == 1 ? p->spins : how > 1 ? (how > 1 << 20 ? 1 << 20 : (int)how) : 0;
    int code = complete(p, spins);
    if (code == NOT_YET && how != 1)
        Py_RETURN_FALSE;
    if (code != DONE) {
        PyObject *r = call_finish(p, code);
        if (!r)
            return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_TRUE;
}

static PyObject *
plan_on_wait(Plan *p, PyObject *args)
{
    PyObject *finish;
    int spins;
    if (!PyArg_ParseTuple(args, "Oi", &finish, &spins))
        return NULL;
    Py_XSETREF(p->finish, Py_NewRef(finish));
    p->spins = spins < 0 ? 0 : spins;
    Py_RETURN_NONE;
}

static PyObject *
plan_after(Plan *p, PyObject *unused)
{
    return PyLong_FromLong(after(p));
}

static PyObject *
plan_state(Plan *p, PyObject *unused)
{
    return Py_BuildValue("(LiiL)", (long long)p->mark, p->half, p->area, (long long)p->epoch);
}

static void
plan_dealloc(Plan *p)
{
    for (Py_ssize_t i = 0; i < p->n_views; i++)
        PyBuffer_Release(&p->views[i]);
    PyMem_Free(p->views);
    PyMem_Free(p->flags);
    for (int h = 0; h < 2; h++) {
        PyMem_Free(p->every_sig[h]);
        PyMem_Free(p->every_gate[h]);
        PyMem_Free(p->copies[h]);
        PyMem_Free(p->inputs[h]);
    }
    Py_XDECREF(p->keep);
    Py_XDECREF(p->finish);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

#define LAST_LEN(p) ((p)->views[(p)->n_views - 1].len)

/* The gate's words: (words, (mine per area), ([every rank's] per area)), or None. */
static int
gate_fill(Plan *p, PyObject *gate)
{
    PyObject *words, *mine, *every;
    if (gate == Py_None)
        return 0;
    if (!PyArg_ParseTuple(gate, "OO!O!", &words, &PyTuple_Type, &mine, &PyTuple_Type, &every))
        return -1;
    if (PyTuple_GET_SIZE(mine) != 2 || PyTuple_GET_SIZE(every) != 2) {
        PyErr_SetString(PyExc_ValueError, "gate words: two areas");
        return -1;
    }
    if (addr(p, words, 0, 0, (char **)&p->gate) < 0)
        return -1;
    p->gate_len = LAST_LEN(p);
    for (int h = 0; h < 2; h++) {
        PyObject *all = PyTuple_GET_ITEM(every, h);
        if (!PyList_Check(all) || PyList_GET_SIZE(all) != p->ranks) {
            PyErr_SetString(PyExc_ValueError, "gate words: one per rank");
            return -1;
        }
        p->every_gate[h] = PyMem_Calloc(p->ranks, sizeof(char *));
        if (!p->every_gate[h])
            return PyErr_NoMemory(), -1;
        if (addr(p, PyTuple_GET_ITEM(mine, h), 1, p->gate_len, &p->my_gate[h]) < 0)
            return -1;
        for (int q = 0; q < p->ranks; q++)
            if (addr(p, PyList_GET_ITEM(all, q), 0, p->gate_len,
                     (char **)&p->every_gate[h][q]) < 0)
                return -1;
    }
    return 0;
}

static int
plan_fill(Plan *p, PyObject *flags, int rank, PyObject *counters, PyObject *sig,
          PyObject *my_sig, PyObject *every_sig, PyObject *publish, PyObject *source,
          PyObject *copies, PyObject *reduction)
{
    int ranks = (int)PyList_GET_SIZE(flags);
    Py_ssize_t n_copies = PyList_GET_SIZE(PyTuple_GET_ITEM(copies, 0));
    p->ranks = ranks;
    p->n_copies = n_copies;
    /* flags, signatures, gate words and reduction inputs: at most 7 per rank; 4 per copy */
    p->max_views = 8 * (Py_ssize_t)ranks + 4 * n_copies + 16;
    p->views = PyMem_Calloc(p->max_views, sizeof(Py_buffer));
    p->flags = PyMem_Calloc(ranks, sizeof(int64_t *));
    if (!p->views || !p->flags)
        return PyErr_NoMemory(), -1;
    if (rank < 0 || rank >= ranks) {
        PyErr_SetString(PyExc_ValueError, "rank out of range");
        return -1;
    }
    for (int q = 0; q < ranks; q++)
        if (addr(p, PyList_GET_ITEM(flags, q), q == rank, 8, (char **)&p->flags[q]) < 0)
            return -1;
    p->my_flag = p->flags[rank];
    if (addr(p, counters, 1, 3 * sizeof(int64_t), (char **)&p->counters) < 0)
        return -1;
    if (addr(p, sig, 0, 0, (char **)&p->sig) < 0)
        return -1;
    p->sig_len = LAST_LEN(p);
    if (addr(p, source, 0, 0, (char **)&p->source) < 0)
        return -1;
    p->source_len = LAST_LEN(p);
    for (int h = 0; h < 2; h++) {
        PyObject *every = PyTuple_GET_ITEM(every_sig, h), *pairs = PyTuple_GET_ITEM(copies, h);
        p->every_sig[h] = PyMem_Calloc(ranks, sizeof(char *));
        p->copies[h] = PyMem_Calloc(n_copies + 1, sizeof(Copy));
        p->inputs[h] = PyMem_Calloc(ranks, sizeof(char *));
        if (!p->every_sig[h] || !p->copies[h] || !p->inputs[h])
            return PyErr_NoMemory(), -1;
        if (p->sig_len) {
            if (addr(p, PyTuple_GET_ITEM(my_sig, h), 1, p->sig_len, &p->my_sig[h]) < 0)
                return -1;
            for (int q = 0; q < ranks; q++)
                if (addr(p, PyList_GET_ITEM(every, q), 0, p->sig_len,
                         (char **)&p->every_sig[h][q]) < 0)
                    return -1;
        }
        if (publish != Py_None &&
            addr(p, PyTuple_GET_ITEM(publish, h), 1, p->source_len, &p->publish[h]) < 0)
            return -1;
        for (Py_ssize_t k = 0; k < n_copies; k++) {
            PyObject *pair = PyList_GET_ITEM(pairs, k);
            Copy *c = &p->copies[h][k];
            if (addr(p, PyTuple_GET_ITEM(pair, 1), 0, 0, (char **)&c->src) < 0)
                return -1;
            c->n = LAST_LEN(p);
            if (addr(p, PyTuple_GET_ITEM(pair, 0), 1, c->n, &c->dst) < 0)
                return -1;
        }
    }
    if (PyUnicode_Check(reduction)) {
        if (PyUnicode_CompareWithASCIIString(reduction, "numpy") != 0) {
            PyErr_SetString(PyExc_ValueError, "reduction: None, a tuple or \"numpy\"");
            return -1;
        }
        p->numpy_reduces = 1;
    } else if (reduction != Py_None) {
        const char *type;
        PyObject *out, *ins;
        if (!PyArg_ParseTuple(reduction, "siOOn", &type, &p->op, &out, &ins, &p->count))
            return -1;
        Py_ssize_t need = p->count * itemsize(type[0]);
        if (!has_loop(type, p->op) || p->count < 0) {
            PyErr_Format(PyExc_ValueError, "no compiled reduction for type '%s', op %d", type,
                         p->op);
            return -1;
        }
        if (addr(p, out, 1, need, &p->out) < 0)
            return -1;
        for (int h = 0; h < 2; h++)
            for (int q = 0; q < ranks; q++)
                if (addr(p, PyList_GET_ITEM(PyTuple_GET_ITEM(ins, h), q), 0, need,
                         (char **)&p->inputs[h][q]) < 0)
                    return -1;
        p->dtype = type[0];
    }
    return 0;
}

static PyObject *
plan_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *flags, *counters, *sig, *my_sig, *every_sig, *publish, *source, *copies;
    PyObject *reduction, *gate = Py_None;
    int rank;
    if (!PyArg_ParseTuple(args, "O!iOOOOOOOO|O", &PyList_Type, &flags, &rank, &counters, &sig,
                          &my_sig, &every_sig, &publish, &source, &copies, &reduction, &gate))
        return NULL;
    Plan *p = (Plan *)type->tp_alloc(type, 0);
    if (!p)
        return NULL;
    p->keep = Py_NewRef(args);
    if (plan_fill(p, flags, rank, counters, sig, my_sig, every_sig, publish, source, copies,
                  reduction) < 0 || gate_fill(p, gate) < 0) {
        Py_DECREF(p);
        return NULL;
    }
    return (PyObject *)p;
}

static PyMethodDef plan_methods[] = {
    {"start", (PyCFunction)plan_start, METH_NOARGS,
     "start(): step the arena's counters, publish the signature and this rank's part, raise "
     "the flag."},
    {"complete", (PyCFunction)plan_complete, METH_O,
     "complete(spins) -> 1 done, 2 barrier passed (the reduction is numpy's), 3 a peer's "
     "buffer is registered (sync again, then after()), 0 peers not all arrived, -1 signatures "
     "differ."},
    {"go", (PyCFunction)plan_go, METH_NOARGS,
     "go(): start, complete, then finish(plan, code) unless done (spins and finish bound by "
     "on_wait)."},
    {"wait", (PyCFunction)plan_wait, METH_O,
     "wait(how) -> bool: complete a started run (how 1 or True: the on_wait spins, then "
     "finish(plan, code) waits; 0 or False: one poll; n >= 2: up to n polls, no longer wait); "
     "False only where it did not wait and peers are missing."},
    {"on_wait", (PyCFunction)plan_on_wait, METH_VARARGS,
     "on_wait(finish, spins): what go() polls, and calls where the run is not done in C "
     "(finish must not hold the plan: it is passed in)."},
    {"after", (PyCFunction)plan_after, METH_NOARGS,
     "after() -> 1 or 2, as complete(): the copies and the reduction alone (after the gate's "
     "second barrier)."},
    {"state", (PyCFunction)plan_state, METH_NOARGS,
     "state() -> (mark, half, area, epoch) of the run begun last."},
    {NULL},
};

/* reduce_into(out, ins, type, op): out = ins[0] (op) ins[1] ... in rank order (reduce_buffers),
 * without the GIL; every input at least as long as out. out may be ins[0] itself, but must not
 * overlap any input otherwise (numpy would copy; the collectives never pass such buffers). */
static PyObject *
reduce_into(PyObject *module, PyObject *args)
{
    PyObject *out_obj, *ins;
    const char *type;
    int op;
    if (!PyArg_ParseTuple(args, "OO!si", &out_obj, &PyTuple_Type, &ins, &type, &op))
        return NULL;
    Py_ssize_t k = PyTuple_GET_SIZE(ins), size = itemsize(type[0]);
    if (!has_loop(type, op)) {
        PyErr_Format(PyExc_ValueError, "no compiled reduction for type '%s', op %d", type, op);
        return NULL;
    }
    if (k < 1 || k > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "reduce_into takes at least one input, not %zd", k);
        return NULL;
    }
    Py_buffer *views = PyMem_Calloc(k + 1, sizeof(Py_buffer));
    const char **bufs = PyMem_Calloc(k, sizeof(char *));
    Py_ssize_t held = 0;
    PyObject *result = NULL;
    if (views == NULL || bufs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (PyObject_GetBuffer(out_obj, &views[0], PyBUF_WRITABLE) < 0)
        goto done;
    held = 1;
    Py_ssize_t n = views[0].len / size;
    if (views[0].len % size) {
        PyErr_Format(PyExc_ValueError, "an output of %zd bytes is no whole number of '%s' items",
                     views[0].len, type);
        goto done;
    }
    for (Py_ssize_t q = 0; q < k; q++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(ins, q), &views[held], PyBUF_SIMPLE) < 0)
            goto done;
        held++;
        if (views[held - 1].len < views[0].len) {
            PyErr_Format(PyExc_ValueError, "input %zd has %zd bytes where %zd are needed", q,
                         views[held - 1].len, views[0].len);
            goto done;
        }
        bufs[q] = (const char *)views[held - 1].buf;
    }
    Py_BEGIN_ALLOW_THREADS
    reduce_buffers((char *)views[0].buf, bufs, (int)k, n, type[0], op);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    while (held > 0)
        PyBuffer_Release(&views[--held]);
    PyMem_Free(views);
    PyMem_Free(bufs);
    return result;
}

/* has_loop(type, op): whether reduce_into and a Plan's reduction have a loop for numpy type char
 * `type` and op code `op` (compiled.reduces asks here, so the answer is written once). */
static PyObject *
py_has_loop(PyObject *module, PyObject *args)
{
    const char *type;
    int op;
    if (!PyArg_ParseTuple(args, "si", &type, &op))
        return NULL;
    return PyBool_FromLong(has_loop(type, op));
}

static PyMethodDef module_methods[] = {
    {"has_loop", py_has_loop, METH_VARARGS,
     "has_loop(type, op): whether the compiled reduction has a loop for numpy type char `type` "
     "and op code `op`: integers 0 sum, 1 prod, 2 min, 3 max, 4 band, 5 bor, 6 bxor; "
     "float32/float64 sum and prod."},
    {"reduce_into", reduce_into, METH_VARARGS,
     "reduce_into(out, ins, type, op): out = ins[0] (op) ins[1] (op) ... element by element in "
     "that order, numpy type char `type`, op code as in has_loop."},
    {NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "topocoll.collectives.algorithms._shmrun.Plan",
    .tp_doc = "Plan(flags, rank, counters, sig, my_sig, every_sig, publish, source, copies, "
              "reduction, gate=None); reduction: None (nothing to reduce), (type, op, out, ins, "
              "count), or 'numpy' (complete returns 2 for Python to reduce)",
    .tp_basicsize = sizeof(Plan),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = plan_new,
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_methods = plan_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_shmrun",
    "The prepared shared-memory run of small collectives, compiled (see shm.prepare), and its "
    "reduction loop for the slot steps and single-copy reads (reduce_into).", -1, module_methods,
};

PyMODINIT_FUNC
PyInit__shmrun(void)
{
    if (PyType_Ready(&PlanType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddObjectRef(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
