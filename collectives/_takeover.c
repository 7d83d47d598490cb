/* The takeover thread's clock, without the GIL (see takeover.py).
 *
 * A communicator that starts a call on its caller's thread whose later barriers need this rank
 * again marks its slot with the call's sequence number. A plain C thread looks at the slots every
 * period; a slot that holds the same number at two looks in a row, not marked again between them,
 * is reported once, by writing (slot, number) to a pipe that takeover.py's Python thread reads.
 * Looking costs the ranks nothing: the thread never takes the GIL, where a Python thread waking
 * every millisecond would take it from the caller's thread each time (on a machine with more
 * ranks than cores, a wait of the scheduler's time slice). The thread sleeps on a condition while
 * no slot is marked.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

enum { SLOTS = 4096 };

static _Atomic long long marked[SLOTS]; /* each slot's started call to watch (0: none) */
static atomic_ullong marks[SLOTS];      /* how many times each slot was marked */
static long long seen[SLOTS];           /* the clock thread's: what it saw at its last look, */
static unsigned long long seen_marks[SLOTS];  /* and after how many marks */
static atomic_int high;                 /* slots in use lie below this */
static atomic_int idle;                 /* the clock thread waits on `wake` */
static int started, pipe_fd = -1;
static long period_ns;
static pthread_t clock_thread;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;

static int
any_marked(void)
{
    int n = atomic_load(&high);
    for (int i = 0; i < n; i++)
        if (atomic_load(&marked[i]))
            return 1;
    return 0;
}

/* One look: report a slot whose mark is the one seen a look ago and was not made again since
 * (a caller that polls its call unmarks it while it drives and marks the same call again after:
 * that call was driven, not left alone). Taken off first, so that it is reported once; a new
 * mark made meanwhile stays. */
static void
look(void)
{
    int n = atomic_load(&high);
    for (int i = 0; i < n; i++) {
        long long seq = atomic_load(&marked[i]);
        unsigned long long count = atomic_load(&marks[i]);
        int same = seq && seq == seen[i] && count == seen_marks[i];
        seen_marks[i] = count;
        if (same && atomic_compare_exchange_strong(&marked[i], &seq, 0)) {
            long long report[2] = {i, seq};
            ssize_t left = (ssize_t)sizeof report;
            char *at = (char *)report;
            while (left > 0) {  /* 16 bytes: atomic on a pipe; retried on a signal */
                ssize_t w = write(pipe_fd, at, (size_t)left);
                if (w < 0 && errno == EINTR)
                    continue;
                if (w < 0)
                    break;      /* the reader is gone (exit): nothing to hand over to */
                at += w;
                left -= w;
            }
            seen[i] = 0;
        } else {
            seen[i] = seq;
        }
    }
}

static void *
clock_loop(void *unused)
{
    (void)unused;
    struct timespec nap = {period_ns / 1000000000L, period_ns % 1000000000L};
    pthread_mutex_lock(&lock);
    for (;;) {                  /* until the process ends: it never takes the GIL */
        atomic_store(&idle, 1);  /* then look again: a mark made before this is seen, one */
        if (!any_marked()) {     /* made after it sees idle and signals */
            pthread_cond_wait(&wake, &lock);
            atomic_store(&idle, 0);
            continue;
        }
        atomic_store(&idle, 0);
        pthread_mutex_unlock(&lock);
        while (nanosleep(&nap, &nap) < 0 && errno == EINTR)
            ;
        nap.tv_sec = period_ns / 1000000000L;
        nap.tv_nsec = period_ns % 1000000000L;
        look();
        pthread_mutex_lock(&lock);
    }
    return NULL;
}

/* start(fd, period_ns): start the clock thread, reporting to pipe `fd` (once per process). */
static PyObject *
start(PyObject *self, PyObject *args)
{
    (void)self;
    int fd;
    long long period;
    if (!PyArg_ParseTuple(args, "iL", &fd, &period))
        return NULL;
    if (period <= 0) {
        PyErr_SetString(PyExc_ValueError, "the period must be positive");
        return NULL;
    }
    if (started)
        Py_RETURN_FALSE;
    pipe_fd = fd;
    period_ns = (long)period;
    sigset_t all, before;       /* born with every signal blocked: none is delivered to it */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &before);
    int failed = pthread_create(&clock_thread, NULL, clock_loop, NULL);
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    if (failed) {
        PyErr_SetString(PyExc_OSError, "could not start the takeover clock thread");
        return NULL;
    }
    started = 1;
    Py_RETURN_TRUE;
}

/* mark(slot, seq): watch call `seq` in `slot` (0: none); wakes the clock thread if it waits. */
static PyObject *
mark(PyObject *self, PyObject *const *argv, Py_ssize_t argc)
{
    (void)self;
    if (argc != 2) {
        PyErr_SetString(PyExc_TypeError, "mark(slot, seq)");
        return NULL;
    }
    long slot = PyLong_AsLong(argv[0]);
    long long seq = PyLong_AsLongLong(argv[1]);
    if (PyErr_Occurred())
        return NULL;
    if (slot < 0 || slot >= SLOTS || seq < 0) {
        PyErr_Format(PyExc_ValueError, "mark(%ld, %lld): slot out of range or negative seq",
                     slot, seq);
        return NULL;
    }
    if (slot >= atomic_load(&high))
        atomic_store(&high, (int)slot + 1);
    atomic_fetch_add(&marks[slot], 1);  /* before the mark: a look that reads the new mark */
    atomic_store(&marked[slot], seq);   /* reads this count or a later one */
    if (seq && atomic_load(&idle)) {
        pthread_mutex_lock(&lock);
        pthread_cond_signal(&wake);
        pthread_mutex_unlock(&lock);
    }
    Py_RETURN_NONE;
}

/* marked(slot): the mark in `slot` (tests). */
static PyObject *
marked_in(PyObject *self, PyObject *arg)
{
    (void)self;
    long slot = PyLong_AsLong(arg);
    if (slot == -1 && PyErr_Occurred())
        return NULL;
    if (slot < 0 || slot >= SLOTS) {
        PyErr_Format(PyExc_ValueError, "slot %ld out of range", slot);
        return NULL;
    }
    return PyLong_FromLongLong(atomic_load(&marked[slot]));
}

static PyMethodDef methods[] = {
    {"start", start, METH_VARARGS,
     "start(fd, period_ns) -> whether it started the clock thread (once per process)."},
    {"mark", (PyCFunction)(void (*)(void))mark, METH_FASTCALL,
     "mark(slot, seq) -> None: watch started call seq in slot (0: nothing to watch)."},
    {"marked", marked_in, METH_O, "marked(slot) -> the mark in slot (0: none)."},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_takeover",
    "The takeover thread's clock, without the GIL (see takeover.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__takeover(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "SLOTS", SLOTS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
