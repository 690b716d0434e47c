/* tracer._ctrace: the compiled fast path of the trace writer's on_event (tracer/accel.py).
 *
 * WriterCore is a base type of tracer.accel.AcceleratedTraceWriter, which also derives from the
 * pure-Python tracer.writer.TraceWriter. The emitting state the Python writer keeps as instance
 * attributes lives here instead, exposed under the same names as member descriptors, so every
 * Python method of TraceWriter (slow path, seal, flusher, close, fork) reads and writes it
 * unchanged:
 *
 *     _buf  bytearray  active packet buffer      _off  Py_ssize_t  bytes used in _buf
 *     _seq  uint64     next sequence number      _ids  dict        string -> string id
 *     _tok  list       the token: [True] free, [] held by a thread in Python code
 *
 * on_event(event) packs the fixed 100 B event record (tracer/format.py EVENT with tag 0 and no
 * chain: the bytes EVENT_NO_CHAIN.pack_into writes) at _buf[_off:], stamps seq and
 * CLOCK_MONOTONIC ns, and advances _off and _seq. Anything else goes to the Python writer
 * (self._on_event_slow(event), i.e. TraceWriter.on_event, the reference), with nothing
 * committed here: an event that is not exactly hybridmem.events.Event, END, a chain, a field
 * that is not an int or is out of its range, a request id not yet in _ids (a string record must
 * be written first), a full or closed buffer (close() installs an empty one), or a token held
 * by another thread. Calling the slow path from here, instead of returning a sentinel to a
 * Python wrapper, saves the wrapper's frame, a quarter of the floor.
 *
 * Thread safety: the GIL is the synchronization. Everything that may run Python code (reading
 * and converting fields, dict lookups, a test clock) happens first; then, with the GIL held and
 * no Python code, no allocation and no call that could release the GIL until the function
 * returns, it checks that no thread holds the token and that the buffer has room, writes the
 * record and advances _off and _seq. Another thread can only run between bytecodes or while a
 * thread waits, so it sees either none or all of a record, exactly as if this call had taken
 * and given back the token. A free-threaded build (no GIL) is refused at compile time, so the
 * writer falls back to the pure-Python path there.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#ifdef Py_GIL_DISABLED
#error "tracer._ctrace relies on the GIL for its synchronization; use the pure-Python writer"
#endif

#define RECORD_SIZE 100

enum {
    F_KIND, F_STEP, F_REQUEST_ID, F_PREEMPTION_COUNT, F_HASH, F_DEPTH, F_STATE_KIND, F_PAGE,
    F_LINE, F_CAUSE, F_REQUESTER, F_NEED, F_FREE, F_OUTCOME, F_CHAIN, F_RECURRENT_CHAIN,
    N_FIELDS
};
static const char *FIELD_NAMES[N_FIELDS] = {
    "kind", "step", "request_id", "preemption_count", "hash", "depth", "state_kind", "page",
    "line", "cause", "requester", "need", "free", "outcome", "chain", "recurrent_chain",
};

/* Bound once by bind(): the Event class, where each of its slots lives, EventKind.END, (). */
static PyTypeObject *g_event_type = NULL;
static Py_ssize_t g_offsets[N_FIELDS];
static PyObject *g_end = NULL;
static PyObject *g_empty = NULL;
static PyObject *g_clock = NULL; /* a test clock (callable returning int ns), or NULL */
static PyObject *g_slow_name = NULL;

typedef struct {
    PyObject_HEAD
    PyObject *buf;
    Py_ssize_t off;
    unsigned long long seq;
    PyObject *ids;
    PyObject *tok;
} WriterCore;

/* ------------------------------------------------------------------ little-endian stores */
static inline void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16); p[3] = (unsigned char)(v >> 24);
}
static inline void put_u64(unsigned char *p, uint64_t v) {
    put_u32(p, (uint32_t)v);
    put_u32(p + 4, (uint32_t)(v >> 32));
}

/* ------------------------------------------------------------------ field conversion
 * Each returns 0 and sets *out for an int (IntEnum and bool included, as struct accepts them)
 * within the struct code's range; -1 otherwise, with no exception set (the Python path then
 * decides: it may accept an __index__ object such as a numpy integer, or raise ValueError). */
static inline int as_i64(PyObject *o, int64_t lo, int64_t hi, int64_t *out) {
    if (!PyLong_Check(o)) return -1;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) { PyErr_Clear(); return -1; }
    if (v < lo || v > hi) return -1;
    *out = (int64_t)v;
    return 0;
}

static inline int as_u64(PyObject *o, uint64_t *out) {
    if (!PyLong_Check(o)) return -1;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (!overflow) {
        if (v == -1 && PyErr_Occurred()) { PyErr_Clear(); return -1; }
        if (v < 0) return -1;
        *out = (uint64_t)v;
        return 0;
    }
    if (overflow < 0) return -1;
    unsigned long long u = PyLong_AsUnsignedLongLong(o); /* 2**63 .. 2**64-1, else OverflowError */
    if (u == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); return -1; }
    *out = (uint64_t)u;
    return 0;
}

/* The string id of an exact str already in ids, else -1 (the Python path adds it). */
static inline int64_t string_id(PyObject *ids, PyObject *s) {
    if (!PyUnicode_CheckExact(s)) return -1;
    PyObject *v = PyDict_GetItemWithError(ids, s); /* borrowed */
    if (v == NULL) { PyErr_Clear(); return -1; }
    int64_t sid;
    if (as_i64(v, 0, UINT32_MAX, &sid) < 0) return -1;
    return sid;
}

static inline int monotonic_ns(int64_t *out) {
    if (g_clock != NULL) {
        PyObject *r = PyObject_CallNoArgs(g_clock);
        if (r == NULL) return -1;
        int rc = as_i64(r, INT64_MIN, INT64_MAX, out);
        Py_DECREF(r);
        if (rc < 0) PyErr_SetString(PyExc_ValueError, "test clock must return an int64");
        return rc;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* what time.monotonic_ns() reads on Linux */
    *out = (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
    return 0;
}

/* Room for one record in the active buffer, and no thread holds the token. */
static inline unsigned char *record_slot(WriterCore *self) {
    PyObject *tok = self->tok, *buf = self->buf;
    if (tok == NULL || !PyList_CheckExact(tok) || PyList_GET_SIZE(tok) != 1) return NULL;
    if (buf == NULL || !PyByteArray_CheckExact(buf)) return NULL;
    Py_ssize_t off = self->off;
    if (off < 0 || off > PyByteArray_GET_SIZE(buf) - RECORD_SIZE) return NULL;
    return (unsigned char *)PyByteArray_AS_STRING(buf) + off;
}

static PyObject *slow(WriterCore *self, PyObject *event) {
    return PyObject_CallMethodOneArg((PyObject *)self, g_slow_name, event);
}

static PyObject *core_on_event(WriterCore *self, PyObject *event) {
    if (Py_TYPE(event) != g_event_type || self->ids == NULL || !PyDict_CheckExact(self->ids))
        return slow(self, event);
    PyObject *f[N_FIELDS];
    for (int i = 0; i < N_FIELDS; i++) {
        f[i] = *(PyObject **)((char *)event + g_offsets[i]);
        if (f[i] == NULL) return slow(self, event); /* unset slot: let Python raise */
    }
    if (f[F_KIND] == g_end || f[F_CHAIN] != g_empty || f[F_RECURRENT_CHAIN] != g_empty)
        return slow(self, event);

    int64_t kind, state_kind, cause, outcome, step, pc, depth, page, line, need, free_;
    uint64_t hash;
    if (as_i64(f[F_KIND], 0, 255, &kind) < 0 || as_i64(f[F_STATE_KIND], 0, 255, &state_kind) < 0
        || as_i64(f[F_CAUSE], 0, 255, &cause) < 0 || as_i64(f[F_OUTCOME], 0, 255, &outcome) < 0
        || as_i64(f[F_STEP], INT64_MIN, INT64_MAX, &step) < 0
        || as_i64(f[F_PREEMPTION_COUNT], INT32_MIN, INT32_MAX, &pc) < 0
        || as_u64(f[F_HASH], &hash) < 0
        || as_i64(f[F_DEPTH], INT64_MIN, INT64_MAX, &depth) < 0
        || as_i64(f[F_PAGE], INT64_MIN, INT64_MAX, &page) < 0
        || as_i64(f[F_LINE], INT64_MIN, INT64_MAX, &line) < 0
        || as_i64(f[F_NEED], INT64_MIN, INT64_MAX, &need) < 0
        || as_i64(f[F_FREE], INT64_MIN, INT64_MAX, &free_) < 0)
        return slow(self, event);
    /* A lookup may run Python code only if a str subclass with its own __eq__ became a key;
     * keep the second key alive through the first lookup all the same. */
    PyObject *requester = Py_NewRef(f[F_REQUESTER]);
    int64_t rid = string_id(self->ids, f[F_REQUEST_ID]);
    int64_t qid = rid < 0 ? -1 : string_id(self->ids, requester);
    Py_DECREF(requester);
    if (qid < 0 || record_slot(self) == NULL)
        return slow(self, event);

    int64_t ts;
    if (monotonic_ns(&ts) < 0) return NULL;
    /* ---- from here to the return: no Python code, no allocation, the GIL is not released ---- */
    unsigned char *p = record_slot(self); /* again: a test clock may have run Python code */
    if (p == NULL) return slow(self, event);
    p[0] = 0; /* TAG_EVENT */
    p[1] = (unsigned char)kind; p[2] = (unsigned char)state_kind;
    p[3] = (unsigned char)cause; p[4] = (unsigned char)outcome;
    p[5] = p[6] = p[7] = 0;
    put_u64(p + 8, self->seq);
    put_u64(p + 16, (uint64_t)ts);
    put_u64(p + 24, (uint64_t)step);
    put_u32(p + 32, (uint32_t)rid);
    put_u32(p + 36, (uint32_t)qid);
    put_u32(p + 40, (uint32_t)(int32_t)pc);
    put_u64(p + 44, hash);
    put_u64(p + 52, (uint64_t)depth);
    put_u64(p + 60, (uint64_t)page);
    put_u64(p + 68, (uint64_t)line);
    put_u64(p + 76, (uint64_t)need);
    put_u64(p + 84, (uint64_t)free_);
    memset(p + 92, 0, 8); /* n_chain, n_recurrent_chain */
    self->off += RECORD_SIZE;
    self->seq += 1;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ the type */
static int core_traverse(WriterCore *self, visitproc visit, void *arg) {
    Py_VISIT(self->buf);
    Py_VISIT(self->ids);
    Py_VISIT(self->tok);
    return 0;
}

static int core_clear(WriterCore *self) {
    Py_CLEAR(self->buf);
    Py_CLEAR(self->ids);
    Py_CLEAR(self->tok);
    return 0;
}

static void core_dealloc(WriterCore *self) {
    PyObject_GC_UnTrack(self);
    core_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef core_members[] = {
    {"_buf", T_OBJECT_EX, offsetof(WriterCore, buf), 0, "active packet buffer (bytearray)"},
    {"_off", T_PYSSIZET, offsetof(WriterCore, off), 0, "bytes used in _buf"},
    {"_seq", T_ULONGLONG, offsetof(WriterCore, seq), 0, "next event sequence number"},
    {"_ids", T_OBJECT_EX, offsetof(WriterCore, ids), 0, "string -> string id"},
    {"_tok", T_OBJECT_EX, offsetof(WriterCore, tok), 0, "the emitting token ([True] = free)"},
    {NULL},
};

static PyMethodDef core_methods[] = {
    {"on_event", (PyCFunction)core_on_event, METH_O,
     "Observer entry point: one event record (compiled fast path; see tracer/accel.py)."},
    {NULL},
};

static PyTypeObject WriterCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracer._ctrace.WriterCore",
    .tp_basicsize = sizeof(WriterCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Emitting state and compiled on_event of the trace writer (tracer/accel.py).",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_traverse = (traverseproc)core_traverse,
    .tp_clear = (inquiry)core_clear,
    .tp_members = core_members,
    .tp_methods = core_methods,
};

/* ------------------------------------------------------------------ module functions */
static PyObject *mod_bind(PyObject *Py_UNUSED(mod), PyObject *args) {
    PyObject *event_type, *end;
    if (!PyArg_ParseTuple(args, "O!O:bind", &PyType_Type, &event_type, &end)) return NULL;
    Py_ssize_t offsets[N_FIELDS];
    for (int i = 0; i < N_FIELDS; i++) {
        PyObject *d = PyObject_GetAttrString(event_type, FIELD_NAMES[i]);
        if (d == NULL) return NULL;
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type)
                 && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX
                 && PyDescr_TYPE(d) == (PyTypeObject *)event_type;
        if (ok) offsets[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!ok)
            return PyErr_Format(PyExc_TypeError, "%R.%s is not a __slots__ member",
                                event_type, FIELD_NAMES[i]);
    }
    memcpy(g_offsets, offsets, sizeof offsets);
    Py_INCREF(event_type);
    Py_XSETREF(g_event_type, (PyTypeObject *)event_type);
    Py_INCREF(end);
    Py_XSETREF(g_end, end);
    Py_RETURN_NONE;
}

static PyObject *mod_set_clock(PyObject *Py_UNUSED(mod), PyObject *clock) {
    if (clock != Py_None && !PyCallable_Check(clock))
        return PyErr_Format(PyExc_TypeError, "clock must be callable or None, got %R", clock);
    Py_XSETREF(g_clock, clock == Py_None ? NULL : Py_NewRef(clock));
    Py_RETURN_NONE;
}

static PyMethodDef mod_methods[] = {
    {"bind", mod_bind, METH_VARARGS,
     "bind(Event, EventKind.END): where on_event reads each field of an event."},
    {"set_clock", mod_set_clock, METH_O,
     "set_clock(fn | None): a test clock for on_event's timestamps (None: CLOCK_MONOTONIC)."},
    {NULL},
};

static struct PyModuleDef ctrace_module = {
    PyModuleDef_HEAD_INIT, "tracer._ctrace",
    "Compiled fast path of the trace writer's on_event (tracer/accel.py).", -1, mod_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ctrace(void) {
    if (PyType_Ready(&WriterCoreType) < 0) return NULL;
    g_empty = PyTuple_New(0); /* the empty-tuple singleton: "no chain" */
    g_slow_name = PyUnicode_InternFromString("_on_event_slow");
    if (g_empty == NULL || g_slow_name == NULL) return NULL;
    PyObject *m = PyModule_Create(&ctrace_module);
    if (m == NULL) return NULL;
    Py_INCREF(&WriterCoreType);
    if (PyModule_AddObject(m, "WriterCore", (PyObject *)&WriterCoreType) < 0) {
        Py_DECREF(&WriterCoreType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "RECORD_SIZE", RECORD_SIZE);
    return m;
}
