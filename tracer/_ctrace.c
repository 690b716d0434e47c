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
 * on_event(event) writes at _buf[_off:] what TraceWriter.on_event would write: the dictionary
 * records of request strings not yet in _ids (ids len(_ids), len(_ids) + 1), then the 100 B
 * event record (tracer/format.py EVENT) stamped with _seq and CLOCK_MONOTONIC ns, then its
 * chain hashes (u64 each); then it advances _off and _seq. Anything else goes to the Python
 * writer (self._on_event_slow(event), i.e. TraceWriter.on_event, the reference) with nothing
 * committed here: an event that is not exactly hybridmem.events.Event, a field that is not an
 * int or is out of its range (an enum value outside its enum, END included), a chain that is
 * not a tuple, a request string that is not an exact str or not UTF-8, a full or closed buffer
 * (close() installs an empty one; a record larger than a packet needs a one-off buffer), or a
 * token held by another thread. Calling the slow path from here, instead of returning a
 * sentinel to a Python wrapper, saves the wrapper's frame (a quarter of the floor).
 *
 * Thread safety: the GIL is the synchronization. What may run Python code (reading fields,
 * dict lookups, UTF-8 encoding, a test clock) comes first. From the final check that no thread
 * holds the token and that the buffer has room, to the commit of _off and _seq, the function
 * runs no Python code and makes no call that releases the GIL (it writes bytes and inserts
 * exact-str keys with int values into _ids; the ids' int objects are made before). Another
 * thread runs only between bytecodes or while one waits, so it sees none or all of a record,
 * exactly as if this call had taken and given back the token. (The one way a dict insert could
 * run Python code is a str-subclass key with its own __eq__ and a colliding hash in _ids; the
 * writer only ever inserts exact str from here and str from TraceWriter._record_slow.) A
 * free-threaded build (no GIL) is refused at compile time, leaving the pure-Python writer.
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
#define CTRACE_API_VERSION 3 /* tracer/cext.py API_VERSION: bump both on any interface change */

enum {
    F_KIND, F_STEP, F_REQUEST_ID, F_PREEMPTION_COUNT, F_HASH, F_DEPTH, F_STATE_KIND, F_PAGE,
    F_LINE, F_CAUSE, F_REQUESTER, F_NEED, F_FREE, F_OUTCOME, F_CHAIN, F_RECURRENT_CHAIN,
    N_FIELDS
};
static const char *FIELD_NAMES[N_FIELDS] = {
    "kind", "step", "request_id", "preemption_count", "hash", "depth", "state_kind", "page",
    "line", "cause", "requester", "need", "free", "outcome", "chain", "recurrent_chain",
};

/* Bound once by bind(): the Event class, where each of its slots lives, the largest value of
 * each enum field (kind 1.., the others 0..; END is no event kind here: close() writes it). */
static PyTypeObject *g_event_type = NULL;
static Py_ssize_t g_offsets[N_FIELDS];
static long g_kind_max = 0, g_state_kind_max = 0, g_cause_max = 0, g_outcome_max = 0;
static PyObject *g_empty = NULL;
static PyObject *g_clock = NULL; /* a test clock (callable returning int ns), or NULL */
static PyObject *g_slow_name = NULL;
static PyObject *g_record_slow_name = NULL;
static PyObject *g_names[N_FIELDS];    /* interned field names: record()'s keywords */
static PyObject *g_defaults[N_FIELDS]; /* record()'s defaults; kind has none (NULL) */

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

/* The string id of s in ids: >= 0 when present, NEW when s is an exact str not yet there (its
 * string record goes before the event), BAD for anything the Python path must decide. */
#define NEW (-1)
#define BAD (-2)
static inline int64_t string_id(PyObject *ids, PyObject *s) {
    if (!PyUnicode_CheckExact(s)) return BAD;
    PyObject *v = PyDict_GetItemWithError(ids, s); /* borrowed */
    if (v == NULL) {
        if (PyErr_Occurred()) { PyErr_Clear(); return BAD; }
        return NEW;
    }
    int64_t sid;
    if (as_i64(v, 0, UINT32_MAX, &sid) < 0) return BAD;
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

/* Room for size bytes in the active buffer, and no thread holds the token; else NULL. */
static inline unsigned char *record_slot(WriterCore *self, Py_ssize_t size) {
    PyObject *tok = self->tok, *buf = self->buf;
    if (tok == NULL || !PyList_CheckExact(tok) || PyList_GET_SIZE(tok) != 1) return NULL;
    if (buf == NULL || !PyByteArray_CheckExact(buf)) return NULL;
    Py_ssize_t off = self->off;
    if (off < 0 || off > PyByteArray_GET_SIZE(buf) - size) return NULL;
    return (unsigned char *)PyByteArray_AS_STRING(buf) + off;
}

/* A dictionary record (tracer/format.py STRING, then the UTF-8 bytes); returns the end. */
static inline unsigned char *put_string(unsigned char *p, uint32_t sid, const char *utf8,
                                        Py_ssize_t len) {
    p[0] = 2; /* TAG_STRING */
    p[1] = p[2] = p[3] = 0;
    put_u32(p + 4, sid);
    put_u32(p + 8, (uint32_t)len);
    memcpy(p + 12, utf8, (size_t)len);
    return p + 12 + len;
}

/* u64 hashes of a tuple at p; -1 (bytes past the committed offset scribbled, harmless) when
 * one is not an int in range. */
static inline int put_hashes(unsigned char *p, PyObject *tuple) {
    Py_ssize_t n = PyTuple_GET_SIZE(tuple);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t h;
        if (as_u64(PyTuple_GET_ITEM(tuple, i), &h) < 0) return -1;
        put_u64(p + 8 * i, h);
    }
    return 0;
}

static PyObject *slow(WriterCore *self, PyObject *event) {
    return PyObject_CallMethodOneArg((PyObject *)self, g_slow_name, event);
}

#define STRING_HEAD 12

/* Pack one event given its fields in Event order (borrowed references, kept alive by the
 * caller). 1: packed and committed; 0: the Python path must decide, nothing committed; -1: an
 * exception is set (a test clock failed, or memory ran out), nothing committed. */
static int pack_event(WriterCore *self, PyObject *const *f) {
    PyObject *ids = self->ids;
    if (ids == NULL || !PyDict_CheckExact(ids)) return 0;
    PyObject *chain = f[F_CHAIN], *rchain = f[F_RECURRENT_CHAIN];
    if (!PyTuple_CheckExact(chain) || !PyTuple_CheckExact(rchain)) return 0;

    int64_t kind, state_kind, cause, outcome, step, pc, depth, page, line, need, free_;
    uint64_t hash;
    /* enum fields out of range (END included) go to Python, which refuses them */
    if (as_i64(f[F_KIND], 1, g_kind_max, &kind) < 0
        || as_i64(f[F_STATE_KIND], 0, g_state_kind_max, &state_kind) < 0
        || as_i64(f[F_CAUSE], 0, g_cause_max, &cause) < 0
        || as_i64(f[F_OUTCOME], 0, g_outcome_max, &outcome) < 0
        || as_i64(f[F_STEP], INT64_MIN, INT64_MAX, &step) < 0
        || as_i64(f[F_PREEMPTION_COUNT], INT32_MIN, INT32_MAX, &pc) < 0
        || as_u64(f[F_HASH], &hash) < 0
        || as_i64(f[F_DEPTH], INT64_MIN, INT64_MAX, &depth) < 0
        || as_i64(f[F_PAGE], INT64_MIN, INT64_MAX, &page) < 0
        || as_i64(f[F_LINE], INT64_MIN, INT64_MAX, &line) < 0
        || as_i64(f[F_NEED], INT64_MIN, INT64_MAX, &need) < 0
        || as_i64(f[F_FREE], INT64_MIN, INT64_MAX, &free_) < 0)
        return 0;

    /* Strings, as TraceWriter._record_slow does them: an unknown request id, then an unknown
     * requester (unless it is the same string), each get a dictionary record before the event;
     * ids are len(ids), len(ids) + 1. Held references: a lookup or the UTF-8 encoding could
     * only run Python code through a str-subclass key with its own __eq__ in ids, but the
     * request strings must survive even that. */
    PyObject *request_id = Py_NewRef(f[F_REQUEST_ID]), *requester = Py_NewRef(f[F_REQUESTER]);
    int result = -1;
    int64_t rid = string_id(ids, request_id), qid = string_id(ids, requester);
    int same = 0;
    const char *rb = NULL, *qb = NULL;
    Py_ssize_t rlen = 0, qlen = 0, strings_size = 0;
    Py_ssize_t n_chain = PyTuple_GET_SIZE(chain), n_rchain = PyTuple_GET_SIZE(rchain);
    if (rid == BAD || qid == BAD) goto slow_path;
    if (rid == NEW) {
        rb = PyUnicode_AsUTF8AndSize(request_id, &rlen); /* cached in the str; may fail */
        if (rb == NULL) { PyErr_Clear(); goto slow_path; }
        strings_size += STRING_HEAD + rlen;
    }
    if (qid == NEW) {
        same = rid == NEW && PyUnicode_Compare(requester, request_id) == 0;
        if (!same) {
            qb = PyUnicode_AsUTF8AndSize(requester, &qlen);
            if (qb == NULL) { PyErr_Clear(); goto slow_path; }
            strings_size += STRING_HEAD + qlen;
        }
    }
    if (n_chain > (PY_SSIZE_T_MAX / 16) || n_rchain > (PY_SSIZE_T_MAX / 16)) goto slow_path;
    Py_ssize_t size = strings_size + RECORD_SIZE + 8 * (n_chain + n_rchain);
    if (record_slot(self, size) == NULL) goto slow_path; /* full/closed buffer, token held */
    Py_ssize_t n_ids = PyDict_GET_SIZE(ids);

    int64_t ts;
    if (monotonic_ns(&ts) < 0) goto done;
    PyObject *rid_obj = NULL, *qid_obj = NULL;
    if (rid == NEW) {
        rid = n_ids;
        if ((rid_obj = PyLong_FromLongLong(rid)) == NULL) goto done;
    }
    if (qid == NEW) {
        qid = same ? rid : n_ids + (rid_obj != NULL);
        if (!same && (qid_obj = PyLong_FromLongLong(qid)) == NULL) {
            Py_XDECREF(rid_obj);
            goto done;
        }
    }
    /* ---- from here to the commit: no Python code (ints, bytes, a dict insert of exact str
     * keys), so no other thread runs and the GIL is not released ---- */
    unsigned char *p = record_slot(self, size); /* again: a test clock may have run Python */
    if (p == NULL || PyDict_GET_SIZE(ids) != n_ids || rid > UINT32_MAX || qid > UINT32_MAX)
        goto undo;
    unsigned char *ev = p + strings_size;
    if (put_hashes(ev + RECORD_SIZE, chain) < 0
        || put_hashes(ev + RECORD_SIZE + 8 * n_chain, rchain) < 0)
        goto undo;
    ev[0] = 0; /* TAG_EVENT */
    ev[1] = (unsigned char)kind; ev[2] = (unsigned char)state_kind;
    ev[3] = (unsigned char)cause; ev[4] = (unsigned char)outcome;
    ev[5] = ev[6] = ev[7] = 0;
    put_u64(ev + 8, self->seq);
    put_u64(ev + 16, (uint64_t)ts);
    put_u64(ev + 24, (uint64_t)step);
    put_u32(ev + 32, (uint32_t)rid);
    put_u32(ev + 36, (uint32_t)qid);
    put_u32(ev + 40, (uint32_t)(int32_t)pc);
    put_u64(ev + 44, hash);
    put_u64(ev + 52, (uint64_t)depth);
    put_u64(ev + 60, (uint64_t)page);
    put_u64(ev + 68, (uint64_t)line);
    put_u64(ev + 76, (uint64_t)need);
    put_u64(ev + 84, (uint64_t)free_);
    put_u32(ev + 92, (uint32_t)n_chain);
    put_u32(ev + 96, (uint32_t)n_rchain);
    if (rid_obj != NULL) {
        p = put_string(p, (uint32_t)rid, rb, rlen);
        if (PyDict_SetItem(ids, request_id, rid_obj) < 0) goto undo;
    }
    if (qid_obj != NULL) {
        put_string(p, (uint32_t)qid, qb, qlen);
        if (PyDict_SetItem(ids, requester, qid_obj) < 0) {
            if (rid_obj != NULL && PyDict_DelItem(ids, request_id) < 0) PyErr_Clear();
            goto undo;
        }
    }
    self->off += size; /* commit */
    self->seq += 1;
    Py_XDECREF(rid_obj);
    Py_XDECREF(qid_obj);
    result = 1;
    goto done;

undo:
    Py_XDECREF(rid_obj);
    Py_XDECREF(qid_obj);
    if (PyErr_Occurred()) goto done; /* MemoryError in a dict insert: nothing committed */
slow_path:
    result = 0;
done:
    Py_DECREF(request_id);
    Py_DECREF(requester);
    return result;
}

static PyObject *core_on_event(WriterCore *self, PyObject *event) {
    if (Py_TYPE(event) != g_event_type) return slow(self, event);
    PyObject *f[N_FIELDS];
    for (int i = 0; i < N_FIELDS; i++) {
        f[i] = *(PyObject **)((char *)event + g_offsets[i]);
        if (f[i] == NULL) return slow(self, event); /* unset slot: let Python raise */
    }
    int r = pack_event(self, f); /* the event keeps its fields alive */
    if (r > 0) Py_RETURN_NONE;
    return r < 0 ? NULL : slow(self, event);
}

/* record(kind, step=-1, request_id="", ...): TraceWriter.record's signature, the fields of
 * Event in its order. Anything but up to 16 arguments naming each field once (positionally or
 * by keyword) with kind given goes, with everything else the Python path decides, to
 * self._record_py (TraceWriter.record), which raises what Python raises. */
static PyObject *core_record(WriterCore *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames) {
    PyObject *f[N_FIELDS];
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    int ok = nargs >= 1 && nargs <= N_FIELDS;
    for (int i = 0; i < N_FIELDS; i++) f[i] = i < nargs ? args[i] : g_defaults[i];
    for (Py_ssize_t k = 0; ok && k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int at = -1;
        for (int i = 0; i < N_FIELDS && at < 0; i++)
            if (name == g_names[i]) at = i; /* call-site keywords are interned */
        for (int i = 0; i < N_FIELDS && at < 0; i++)
            if (PyUnicode_Compare(name, g_names[i]) == 0) at = i;
        if (PyErr_Occurred()) PyErr_Clear();
        if (at < 0 || at < nargs) ok = 0; /* unknown, or given twice */
        else f[at] = args[nargs + k];
        /* a keyword repeated among the keywords cannot happen: the call refuses it */
    }
    if (ok && f[F_KIND] != NULL) {
        int r = pack_event(self, f); /* the caller's arguments keep the fields alive */
        if (r > 0) Py_RETURN_NONE;
        if (r < 0) return NULL;
    }
    /* self._record_py(*args, **kwargs): self, then the arguments as given */
    PyObject *small[1 + N_FIELDS + 4];
    Py_ssize_t total = 1 + nargs + nkw;
    PyObject **stack = total <= (Py_ssize_t)(sizeof small / sizeof small[0])
                       ? small : PyMem_New(PyObject *, total);
    if (stack == NULL) return PyErr_NoMemory();
    stack[0] = (PyObject *)self;
    memcpy(stack + 1, args, (size_t)(nargs + nkw) * sizeof(PyObject *));
    PyObject *res = PyObject_VectorcallMethod(g_record_slow_name, stack,
                                              (size_t)(1 + nargs), kwnames);
    if (stack != small) PyMem_Free(stack);
    return res;
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
    {"record", (PyCFunction)(void (*)(void))core_record, METH_FASTCALL | METH_KEYWORDS,
     "record(kind, step=-1, request_id='', ...): the fields of Event as arguments (compiled "
     "fast path; see tracer/accel.py)."},
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

/* ------------------------------------------------------------------ the disabled path
 * NullCore.on_event: a C method descriptor that does nothing, the base of
 * tracer.writer.NullTraceWriter (a call costs a few ns less than a Python method's). */
static PyObject *null_on_event(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(event)) {
    Py_RETURN_NONE;
}

static PyMethodDef null_methods[] = {
    {"on_event", null_on_event, METH_O, "The disabled path: does nothing."},
    {NULL},
};

static PyTypeObject NullCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracer._ctrace.NullCore",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Base of the disabled trace writer: on_event does nothing.",
    .tp_new = PyType_GenericNew,
    .tp_methods = null_methods,
};

/* ------------------------------------------------------------------ module functions */
static PyObject *mod_bind(PyObject *Py_UNUSED(mod), PyObject *args) {
    PyObject *event_type;
    long kind_max, state_kind_max, cause_max, outcome_max;
    if (!PyArg_ParseTuple(args, "O!llll:bind", &PyType_Type, &event_type, &kind_max,
                          &state_kind_max, &cause_max, &outcome_max))
        return NULL;
    if (kind_max < 1 || kind_max > 255 || state_kind_max < 0 || state_kind_max > 255
        || cause_max < 0 || cause_max > 255 || outcome_max < 0 || outcome_max > 255)
        return PyErr_Format(PyExc_ValueError, "enum maxima must fit a u8");
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
    g_kind_max = kind_max;
    g_state_kind_max = state_kind_max;
    g_cause_max = cause_max;
    g_outcome_max = outcome_max;
    Py_RETURN_NONE;
}

static PyObject *mod_set_clock(PyObject *Py_UNUSED(mod), PyObject *clock) {
    if (clock != Py_None && !PyCallable_Check(clock))
        return PyErr_Format(PyExc_TypeError, "clock must be callable or None, got %R", clock);
    Py_XSETREF(g_clock, clock == Py_None ? NULL : Py_NewRef(clock));
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------- reader: record walk
 * walk(content) -> (offsets, spans, strings, end, error): where each record of one packet's
 * content starts, for tracer/columnar.py (its _py_walk is the reference, tested equal):
 *   offsets  bytes, one little-endian int64 per event record (its offset)
 *   spans    [(offset of the hashes, n_chain, n_recurrent_chain)] for events with hashes
 *   strings  [(string id, offset of the text, length, number of events before it)]
 *   end      offset of the END record, or -1
 *   error    None, or why the packet does not parse (then the rest is meaningless)
 * Layouts: tracer/format.py EVENT (100 B; n_chain, n_recurrent_chain u32 at 92, 96), STRING
 * (12 B: tag, pad, id u32 at 4, length u32 at 8), END (48 B). */
static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static PyObject *walk_result(PyObject *offs, Py_ssize_t k, PyObject *spans, PyObject *strings,
                             Py_ssize_t end, const char *error) {
    if (_PyBytes_Resize(&offs, k * 8) < 0) {
        Py_DECREF(spans);
        Py_DECREF(strings);
        return NULL;
    }
    PyObject *err = error ? PyUnicode_FromString(error) : Py_NewRef(Py_None);
    if (err == NULL) {
        Py_DECREF(offs);
        Py_DECREF(spans);
        Py_DECREF(strings);
        return NULL;
    }
    return Py_BuildValue("(NNNnN)", offs, spans, strings, end, err);
}

static PyObject *mod_walk(PyObject *Py_UNUSED(mod), PyObject *arg) {
    if (!PyBytes_Check(arg))
        return PyErr_Format(PyExc_TypeError, "walk() takes bytes, got %R", Py_TYPE(arg));
    const unsigned char *c = (const unsigned char *)PyBytes_AS_STRING(arg);
    Py_ssize_t n = PyBytes_GET_SIZE(arg), off = 0, k = 0, end = -1;
    PyObject *offs = PyBytes_FromStringAndSize(NULL, (n / 100 + 1) * 8);
    PyObject *spans = PyList_New(0), *strings = PyList_New(0);
    if (offs == NULL || spans == NULL || strings == NULL) {
        Py_XDECREF(offs);
        Py_XDECREF(spans);
        Py_XDECREF(strings);
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(offs);
    const char *error = NULL;
    while (off < n && error == NULL) {
        unsigned char tag = c[off];
        if (tag == 0) {
            if (off > n - 100) { error = "event record overruns packet"; break; }
            uint64_t nc = le32(c + off + 92), nr = le32(c + off + 96);
            int64_t o = (int64_t)off;
            for (int b = 0; b < 8; b++) out[k * 8 + b] = (unsigned char)((uint64_t)o >> (8 * b));
            k++;
            off += 100;
            if (nc || nr) {
                uint64_t bytes = 8 * (nc + nr);
                if (bytes > (uint64_t)(n - off)) { error = "event seq or chain length wrong"; break; }
                PyObject *t = Py_BuildValue("(nKK)", off, (unsigned long long)nc,
                                            (unsigned long long)nr);
                if (t == NULL || PyList_Append(spans, t) < 0) {
                    Py_XDECREF(t);
                    goto fail;
                }
                Py_DECREF(t);
                off += (Py_ssize_t)bytes;
            }
        } else if (tag == 2) {
            if (off > n - 12) { error = "string record overruns packet"; break; }
            uint32_t sid = le32(c + off + 4), length = le32(c + off + 8);
            off += 12;
            if ((uint64_t)length > (uint64_t)(n - off) || sid == 0) { error = "bad string record"; break; }
            PyObject *t = Py_BuildValue("(knkn)", (unsigned long)sid, off, (unsigned long)length, k);
            if (t == NULL || PyList_Append(strings, t) < 0) {
                Py_XDECREF(t);
                goto fail;
            }
            Py_DECREF(t);
            off += (Py_ssize_t)length;
        } else if (tag == 3) {
            if (off > n - 48) { error = "END record overruns packet"; break; }
            end = off;
            off += 48;
            if (off < n) { error = "records after END"; break; }
        } else {
            error = "unknown record tag";
        }
    }
    return walk_result(offs, k, spans, strings, end, error);
fail:
    Py_DECREF(offs);
    Py_DECREF(spans);
    Py_DECREF(strings);
    return NULL;
}

static PyMethodDef mod_methods[] = {
    {"walk", mod_walk, METH_O,
     "walk(content) -> (offsets, spans, strings, end, error): the records of one packet "
     "(tracer/columnar.py)."},
    {"bind", mod_bind, METH_VARARGS,
     "bind(Event, kind_max, state_kind_max, cause_max, outcome_max): where on_event reads each "
     "field of an event, and the enum values it may pack."},
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
    if (PyType_Ready(&WriterCoreType) < 0 || PyType_Ready(&NullCoreType) < 0) return NULL;
    g_empty = PyTuple_New(0); /* the empty-tuple singleton: "no chain" */
    g_slow_name = PyUnicode_InternFromString("_on_event_slow");
    g_record_slow_name = PyUnicode_InternFromString("_record_py");
    if (g_empty == NULL || g_slow_name == NULL || g_record_slow_name == NULL) return NULL;
    for (int i = 0; i < N_FIELDS; i++)
        if ((g_names[i] = PyUnicode_InternFromString(FIELD_NAMES[i])) == NULL) return NULL;
    /* TraceWriter.record's defaults: ints -1/0, "", () */
    PyObject *minus_one = PyLong_FromLong(-1), *zero = PyLong_FromLong(0);
    PyObject *empty_str = PyUnicode_FromStringAndSize(NULL, 0);
    if (minus_one == NULL || zero == NULL || empty_str == NULL) return NULL;
    for (int i = 0; i < N_FIELDS; i++) {
        PyObject *d;
        switch (i) {
        case F_KIND: d = NULL; break;
        case F_STEP: case F_PAGE: case F_LINE: d = minus_one; break;
        case F_REQUEST_ID: case F_REQUESTER: d = empty_str; break;
        case F_CHAIN: case F_RECURRENT_CHAIN: d = g_empty; break;
        default: d = zero;
        }
        g_defaults[i] = d == NULL ? NULL : Py_NewRef(d);
    }
    Py_DECREF(minus_one);
    Py_DECREF(zero);
    Py_DECREF(empty_str);
    PyObject *m = PyModule_Create(&ctrace_module);
    if (m == NULL) return NULL;
    Py_INCREF(&WriterCoreType);
    if (PyModule_AddObject(m, "WriterCore", (PyObject *)&WriterCoreType) < 0) {
        Py_DECREF(&WriterCoreType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&NullCoreType);
    if (PyModule_AddObject(m, "NullCore", (PyObject *)&NullCoreType) < 0) {
        Py_DECREF(&NullCoreType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "RECORD_SIZE", RECORD_SIZE) < 0
        || PyModule_AddIntConstant(m, "API_VERSION", CTRACE_API_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
