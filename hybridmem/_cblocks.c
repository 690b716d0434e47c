/* hybridmem._cblocks: the per-block loops of hybridmem/cached_org.py, compiled.
 *
 * Each function is a transcription of exactly one Python loop of CachedOrganization, on the
 * same Python objects that loop reads and writes (the pool's lists, OrderedDict LRU and free
 * deque, the organization's dicts, the Block objects' slots), in the same order, with the same
 * assertion texts. The Python loop stays the definition and the fallback: cached_org.py calls
 * a function here only when the extension loaded (cached_org.load_compiled), no pool watcher
 * is set and, for the two loops that emit events, no observer records them.
 *
 *     (every function but drop_waits and indexed_prefix takes the slotted Block class first,
 *     whose slot offsets it reads when the class changes; omitted below)
 *     take_blocks(n, popleft, refs, spare, owners, blocks, depth, grid, holder, pool)
 *         -> None        allocate's take loop (CachedOrganization.allocate)
 *     unref_blocks(blocks, holder, refs, holds, cached, append, owners, spare, pool_name)
 *         -> (pages no longer referenced, blocks forgotten)   (CachedOrganization._blocks_unref)
 *     publish_blocks(blocks, chain, keyed, stop, index, waiters, holds, refs, request_id,
 *                    waits, published) -> None   (CachedOrganization.publish's block loop)
 *     reclaim_run(cached, short, head, owners, holds, refs, append, spare, index, waiters,
 *                 requests, pool_name) -> blocks lost   (CachedOrganization._make_free's
 *                                                        inline loop over the LRU heads)
 *     ref_blocks(blocks, holder, refs, holds, cached, pool_name) -> pages now in use
 *                        (CachedOrganization._blocks_ref's loop, then PagePool.incref_many's)
 *     adopt_blocks(keys, pages, index) -> blocks   (CachedOrganization.adopt's loop)
 *     block_pages(keys, index) -> pages            (CachedOrganization.lookup's comprehension)
 *     drop_waits(waits, waiters, request_id)        (CachedOrganization._release_all's loop)
 *     indexed_prefix(chain, stop, index) -> length  (CachedOrganization.lookup's takewhile)
 *     _set_fault(mask)   tests only: a deliberate bug per loop (the negative control), 0 = none:
 *                        1 take: a new block one token deeper   2 unref: a forgotten block
 *                        not counted   4 publish: a published key not returned   8 reclaim:
 *                        the run of heads reclaimed newest first   16 ref: one page more
 *                        counted in use   32 adopt: the last block left out   64 lookup: the
 *                        pages reversed   128 waits: an empty waiter set left in place
 *                        256 lookup: the prefix 32 blocks longer (512 tokens at D0's grid)
 *
 * The assertions of the Python loops are checked here whether or not Python runs with -O
 * (they cost a comparison each); a failed one raises AssertionError with the same text.
 * Objects are borrowed from the containers only while no Python code can run; a call that can
 * run Python code (a Block constructor, a deque method, a dict or set operation on a key)
 * holds its own references.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define CBLOCKS_API_VERSION 1 /* hybridmem/cached_org.py _CBLOCKS_API: bump both on a change */

static PyTypeObject *block_type = NULL;
static Py_ssize_t off_pool = -1, off_page, off_depth, off_key, off_holders;
static PyObject *str_keyed = NULL, *str_name = NULL;
static unsigned long fault_mask = 0;

/* -- helpers ----------------------------------------------------------------------------- */

/* dict operations on a key whose hash is computed once per block (CPython 3.11/3.12 export
 * these; elsewhere the public calls, which hash again) */
#if PY_VERSION_HEX < 0x030D0000
#define D_CONTAINS(d, k, h) _PyDict_Contains_KnownHash((d), (k), (h))
#define D_GET(d, k, h) _PyDict_GetItem_KnownHash((d), (k), (h))
#define D_SET(d, k, v, h) _PyDict_SetItem_KnownHash((d), (k), (v), (h))
#define D_DEL(d, k, h) _PyDict_DelItem_KnownHash((d), (k), (h))
#else
#define D_CONTAINS(d, k, h) ((void)(h), PyDict_Contains((d), (k)))
#define D_GET(d, k, h) ((void)(h), PyDict_GetItemWithError((d), (k)))
#define D_SET(d, k, v, h) ((void)(h), PyDict_SetItem((d), (k), (v)))
#define D_DEL(d, k, h) ((void)(h), PyDict_DelItem((d), (k)))
#endif

/* A Block's slot (borrowed), or NULL with AttributeError when unset. */
static inline PyObject *slot_get(PyObject *o, Py_ssize_t off, const char *name) {
    PyObject *v = *(PyObject **)((char *)o + off);
    if (v == NULL) PyErr_Format(PyExc_AttributeError, "'Block' object has no attribute '%s'", name);
    return v;
}

static inline void slot_set(PyObject *o, Py_ssize_t off, PyObject *v) {
    PyObject **p = (PyObject **)((char *)o + off), *old = *p;
    Py_INCREF(v);
    *p = v;
    Py_XDECREF(old);
}

static int check_block(PyObject *o) {
    if (Py_TYPE(o) == block_type) return 0;
    PyErr_Format(PyExc_TypeError, "expected a Block, got %.100s", Py_TYPE(o)->tp_name);
    return -1;
}

/* list[index] as Python indexes it (negative from the end); -1 with IndexError otherwise. */
static inline Py_ssize_t list_pos(PyObject *list, PyObject *index) {
    Py_ssize_t i = PyLong_AsSsize_t(index);
    if (i == -1 && PyErr_Occurred()) return -1;
    Py_ssize_t n = PyList_GET_SIZE(list);
    if (i < 0) i += n;
    if (i < 0 || i >= n) {
        PyErr_SetString(PyExc_IndexError, "list index out of range");
        return -1;
    }
    return i;
}

/* A page's count in refs or holds (lists of small ints). */
static inline long count_at(PyObject *list, Py_ssize_t i) {
    return PyLong_AsLong(PyList_GET_ITEM(list, i));
}

static inline int count_set(PyObject *list, Py_ssize_t i, long v) {
    PyObject *nv = PyLong_FromLong(v);
    if (nv == NULL) return -1;
    PyObject *old = PyList_GET_ITEM(list, i);
    PyList_SET_ITEM(list, i, nv);
    Py_DECREF(old);
    return 0;
}

static inline void item_set(PyObject *list, Py_ssize_t i, PyObject *v) {
    PyObject *old = PyList_GET_ITEM(list, i);
    Py_INCREF(v);
    PyList_SET_ITEM(list, i, v);
    Py_DECREF(old);
}

static int bind_type(PyObject *cls);

#define NEED_TYPE(obj, check, what)                                                   \
    if (!check(obj)) {                                                               \
        PyErr_Format(PyExc_TypeError, "%s must be a %s, got %.100s", #obj, what,     \
                     Py_TYPE(obj)->tp_name);                                         \
        return NULL;                                                                 \
    }

#define NEED_ARGS(n)                                                                  \
    if (nargs != (n)) {                                                              \
        PyErr_Format(PyExc_TypeError, "expected %d arguments, got %zd", (n), nargs); \
        return NULL;                                                                 \
    }

/* -- the Block class ---------------------------------------------------------------------- */

static Py_ssize_t member_offset(PyObject *type, const char *name) {
    PyObject *d = PyObject_GetAttrString(type, name);
    if (d == NULL) return -1;
    Py_ssize_t off = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type) &&
        ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX)
        off = ((PyMemberDescrObject *)d)->d_member->offset;
    else
        PyErr_Format(PyExc_TypeError, "Block.%s is not a __slots__ member", name);
    Py_DECREF(d);
    return off;
}

/* The Block class every call passes first: its slot offsets, read when it is not the class of
 * the call before (a reloaded module defines a new class; nothing is bound at import). */
static int bind_type(PyObject *cls) {
    if ((PyTypeObject *)cls == block_type) return 0;
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "the first argument must be the Block class");
        return -1;
    }
    Py_ssize_t offs[5];
    const char *names[5] = {"pool", "page", "depth", "key", "holders"};
    for (int i = 0; i < 5; i++)
        if ((offs[i] = member_offset(cls, names[i])) < 0) return -1;
    Py_INCREF(cls);
    Py_XSETREF(block_type, (PyTypeObject *)cls);
    off_pool = offs[0], off_page = offs[1], off_depth = offs[2], off_key = offs[3];
    off_holders = offs[4];
    return 0;
}

/* -- take_blocks: CachedOrganization.allocate's loop --------------------------------------
 *
 *     for _ in range(n_blocks):
 *         page = popleft(); refs[page] = 1; depth += ga
 *         blk = spare[page]
 *         if blk is None: blk = Block(apool, page, depth, 0, {request_id})
 *         else: assert no key, no holders; spare[page] = None; blk.depth = depth;
 *               blk.holders.add(request_id)
 *         owners[page] = blk; blocks.append(blk)
 */
static PyObject *py_take_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ARGS(11);
    if (bind_type(args[0]) < 0) return NULL;
    args++;  /* the Block class */
    Py_ssize_t n = PyLong_AsSsize_t(args[0]);
    if (n == -1 && PyErr_Occurred()) return NULL;
    PyObject *popleft = args[1], *refs = args[2], *spare = args[3], *owners = args[4];
    PyObject *blocks = args[5], *holder = args[8], *pool = args[9];
    NEED_TYPE(refs, PyList_CheckExact, "list");
    NEED_TYPE(spare, PyList_CheckExact, "list");
    NEED_TYPE(owners, PyList_CheckExact, "list");
    NEED_TYPE(blocks, PyList_CheckExact, "list");
    long long depth = PyLong_AsLongLong(args[6]);
    if (depth == -1 && PyErr_Occurred()) return NULL;
    long long grid = PyLong_AsLongLong(args[7]);
    if (grid == -1 && PyErr_Occurred()) return NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *page = PyObject_CallNoArgs(popleft);
        if (page == NULL) return NULL;
        PyObject *blk = NULL, *depth_obj = NULL;
        Py_ssize_t i = list_pos(refs, page);
        if (i < 0 || count_set(refs, i, 1) < 0) goto fail;
        depth += grid;
        depth_obj = PyLong_FromLongLong(depth + ((fault_mask & 1) != 0));
        if (depth_obj == NULL) goto fail;
        if ((i = list_pos(spare, page)) < 0) goto fail;
        blk = PyList_GET_ITEM(spare, i);
        if (blk == Py_None) {
            PyObject *holders = PySet_New(NULL);
            if (holders == NULL || PySet_Add(holders, holder) < 0) {
                Py_XDECREF(holders);
                blk = NULL;
                goto fail;
            }
            PyObject *zero = PyLong_FromLong(0);
            PyObject *cargs[5] = {pool, page, depth_obj, zero, holders};
            blk = PyObject_Vectorcall((PyObject *)block_type, cargs, 5, NULL);
            Py_DECREF(zero);
            Py_DECREF(holders);
            if (blk == NULL) goto fail;
        } else {
            Py_INCREF(blk);
            if (check_block(blk) < 0) goto fail;
            PyObject *key = slot_get(blk, off_key, "key");
            PyObject *holders = slot_get(blk, off_holders, "holders");
            if (key == NULL || holders == NULL) goto fail;
            int keyed = PyObject_IsTrue(key), held = PyObject_IsTrue(holders);
            if (keyed < 0 || held < 0) goto fail;
            if (keyed || held) {
                PyObject *hex = PyNumber_ToBase(key, 16);
                if (hex != NULL)
                    PyErr_Format(PyExc_AssertionError,
                                 "spare block on page %S with key %S, holders %R; this indicates "
                                 "a block forgotten while discoverable or referenced",
                                 page, hex, holders);
                Py_XDECREF(hex);
                goto fail;
            }
            item_set(spare, i, Py_None);
            slot_set(blk, off_depth, depth_obj);
            if (PySet_Add(holders, holder) < 0) goto fail;
        }
        if ((i = list_pos(owners, page)) < 0) goto fail;
        item_set(owners, i, blk);
        if (PyList_Append(blocks, blk) < 0) goto fail;
        Py_DECREF(blk);
        Py_DECREF(depth_obj);
        Py_DECREF(page);
        continue;
    fail:
        Py_XDECREF(blk);
        Py_XDECREF(depth_obj);
        Py_DECREF(page);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* -- unref_blocks: CachedOrganization._blocks_unref's loop --------------------------------
 *
 *     for blk in blks:
 *         blk.holders.remove(holder); page = blk.page
 *         assert refs[page] > 0; left = refs[page] = refs[page] - 1
 *         if left == 0: unused += 1; cached[page] = None if holds[page] else free.append(page)
 *         if not blk.holders and not blk.key: assert free; owners[page] = None;
 *                                             spare[page] = blk; forgotten += 1
 */
static PyObject *py_unref_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ARGS(10);
    if (bind_type(args[0]) < 0) return NULL;
    args++;  /* the Block class */
    PyObject *blks = args[0], *holder = args[1], *refs = args[2], *holds = args[3];
    PyObject *cached = args[4], *append = args[5], *owners = args[6], *spare = args[7];
    PyObject *pool_name = args[8];
    NEED_TYPE(blks, PyList_CheckExact, "list");
    NEED_TYPE(refs, PyList_CheckExact, "list");
    NEED_TYPE(holds, PyList_CheckExact, "list");
    NEED_TYPE(cached, PyODict_CheckExact, "OrderedDict");
    NEED_TYPE(owners, PyList_CheckExact, "list");
    NEED_TYPE(spare, PyList_CheckExact, "list");
    Py_ssize_t unused = 0, forgotten = 0;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(blks); k++) {
        PyObject *blk = PyList_GET_ITEM(blks, k);
        Py_INCREF(blk);
        PyObject *page = NULL;
        if (check_block(blk) < 0) goto fail;
        PyObject *holders = slot_get(blk, off_holders, "holders");
        if (holders == NULL) goto fail;
        Py_INCREF(holders);
        int found = PySet_Discard(holders, holder);
        if (found == 0) _PyErr_SetKeyError(holder);
        if (found <= 0) {
            Py_DECREF(holders);
            goto fail;
        }
        page = slot_get(blk, off_page, "page");
        if (page == NULL) {
            Py_DECREF(holders);
            goto fail;
        }
        Py_INCREF(page);
        Py_ssize_t i = list_pos(refs, page), h;
        long left = 0;
        if (i < 0) goto fail_h;
        if ((left = count_at(refs, i)) == -1 && PyErr_Occurred()) goto fail_h;
        if (left <= 0) {
            PyErr_Format(PyExc_AssertionError, "pool %S: decref of page %S with no reference; "
                         "this indicates a double release", pool_name, page);
            goto fail_h;
        }
        if (count_set(refs, i, --left) < 0) goto fail_h;
        if ((h = list_pos(holds, page)) < 0) goto fail_h;
        if (left == 0) {
            unused++;
            if (count_at(holds, h)) {
                if (PyODict_SetItem(cached, page, Py_None) < 0) goto fail_h;
            } else {
                PyObject *r = PyObject_CallOneArg(append, page);
                if (r == NULL) goto fail_h;
                Py_DECREF(r);
            }
        }
        PyObject *key = slot_get(blk, off_key, "key");
        if (key == NULL) goto fail_h;
        int keyed = PyObject_IsTrue(key);
        if (keyed < 0) goto fail_h;
        if (PySet_GET_SIZE(holders) == 0 && !keyed) {
            if (count_at(refs, i) != 0 || count_at(holds, h) != 0) {
                PyErr_Format(PyExc_AssertionError, "block on page %S forgotten while its page "
                             "is not free; this indicates a reference or hold leak", page);
                goto fail_h;
            }
            Py_ssize_t o = list_pos(owners, page), s;
            if (o < 0 || (s = list_pos(spare, page)) < 0) goto fail_h;
            item_set(owners, o, Py_None);
            item_set(spare, s, blk);
            forgotten += (fault_mask & 2) ? 0 : 1;
        }
        Py_DECREF(holders);
        Py_DECREF(page);
        Py_DECREF(blk);
        continue;
    fail_h:
        Py_DECREF(holders);
    fail:
        Py_XDECREF(page);
        Py_DECREF(blk);
        return NULL;
    }
    return Py_BuildValue("(nn)", unused, forgotten);
}

/* -- publish_blocks: CachedOrganization.publish's block loop -------------------------------
 *
 *     for blk, key in zip(blocks[keyed:stop], chain[keyed:stop], strict=False):
 *         if blk.key: continue
 *         if key in attn_index: waiters[key] gets request_id; req.waits.append(key); continue
 *         blk.key = key; attn_index[key] = blk; page = blk.page
 *         assert refs[page] or holds[page]; holds[page] += 1; published.append(key)
 */
static PyObject *py_publish_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ARGS(12);
    if (bind_type(args[0]) < 0) return NULL;
    args++;  /* the Block class */
    PyObject *blocks = args[0], *chain = args[1], *index = args[4], *waiters = args[5];
    PyObject *holds = args[6], *refs = args[7], *rid = args[8], *waits = args[9];
    PyObject *published = args[10];
    NEED_TYPE(blocks, PyList_CheckExact, "list");
    NEED_TYPE(chain, PyList_CheckExact, "list");
    NEED_TYPE(index, PyDict_CheckExact, "dict");
    NEED_TYPE(waiters, PyDict_CheckExact, "dict");
    NEED_TYPE(holds, PyList_CheckExact, "list");
    NEED_TYPE(refs, PyList_CheckExact, "list");
    NEED_TYPE(waits, PyList_CheckExact, "list");
    NEED_TYPE(published, PyList_CheckExact, "list");
    Py_ssize_t lo = PyLong_AsSsize_t(args[2]), hi = PyLong_AsSsize_t(args[3]);
    if ((lo == -1 || hi == -1) && PyErr_Occurred()) return NULL;
    if (lo < 0 || hi < 0) {
        PyErr_SetString(PyExc_ValueError, "keyed and stop must be >= 0");
        return NULL;
    }
    for (Py_ssize_t k = lo; k < hi; k++) {
        if (k >= PyList_GET_SIZE(blocks) || k >= PyList_GET_SIZE(chain)) break;
        PyObject *blk = PyList_GET_ITEM(blocks, k), *key = PyList_GET_ITEM(chain, k);
        PyObject *page = NULL;
        Py_INCREF(blk);
        Py_INCREF(key);
        if (check_block(blk) < 0) goto fail;
        PyObject *own = slot_get(blk, off_key, "key");
        if (own == NULL) goto fail;
        int keyed = PyObject_IsTrue(own);
        if (keyed < 0) goto fail;
        if (keyed) goto next;  /* already discoverable (published or adopted) */
        Py_hash_t hash = PyObject_Hash(key);
        if (hash == -1) goto fail;
        int other = D_CONTAINS(index, key, hash);
        if (other < 0) goto fail;
        if (other) {  /* another request's copy is discoverable */
            PyObject *waiting = D_GET(waiters, key, hash);
            if (waiting == NULL) {
                if (PyErr_Occurred()) goto fail;
                PyObject *set = PySet_New(NULL);
                if (set == NULL) goto fail;
                int bad = PySet_Add(set, rid) < 0 || D_SET(waiters, key, set, hash) < 0;
                Py_DECREF(set);
                if (bad) goto fail;
            } else {
                Py_INCREF(waiting);
                int bad = PySet_Add(waiting, rid) < 0;
                Py_DECREF(waiting);
                if (bad) goto fail;
            }
            if (PyList_Append(waits, key) < 0) goto fail;
            goto next;
        }
        slot_set(blk, off_key, key);
        if (D_SET(index, key, blk, hash) < 0) goto fail;
        page = slot_get(blk, off_page, "page");
        if (page == NULL) goto fail;
        Py_INCREF(page);
        Py_ssize_t h = list_pos(holds, page), r = list_pos(refs, page);
        if (h < 0 || r < 0) goto fail;
        long held = count_at(holds, h);
        if (!count_at(refs, r) && !held) {
            PyObject *pool = slot_get(blk, off_pool, "pool");
            PyObject *name = pool ? PyObject_GetAttr(pool, str_name) : NULL;
            if (name != NULL)
                PyErr_Format(PyExc_AssertionError, "pool %S: hold on free page %S; this "
                             "indicates publishing storage that was already released",
                             name, page);
            Py_XDECREF(name);
            goto fail;
        }
        if (count_set(holds, h, held + 1) < 0) goto fail;
        if (!(fault_mask & 4) && PyList_Append(published, key) < 0) goto fail;
    next:
        Py_XDECREF(page);
        Py_DECREF(key);
        Py_DECREF(blk);
        continue;
    fail:
        Py_XDECREF(page);
        Py_DECREF(key);
        Py_DECREF(blk);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* -- reclaim_run: CachedOrganization._make_free's inline loop ------------------------------
 *
 *     for page in list(islice(cached, short)) if short > 1 else (head,):
 *         blk = owners[page]
 *         if blk.__class__ is not Block or blk.holders or holds[page] != 1: break
 *         key = blk.key; del attn_index[key]; blk.key = 0
 *         if key in waiters: for waiter in waiters.pop(key): requests[waiter].keyed = 0
 *         assert refs[page] == 0
 *         holds[page] = 0; del cached[page]; free.append(page); lost += 1
 *         owners[page] = None; spare[page] = blk
 */
static int wake_waiters(PyObject *waiters, PyObject *key, Py_hash_t hash, PyObject *requests) {
    if (PyDict_GET_SIZE(waiters) == 0) return 0;  /* (key in waiters: False) */
    PyObject *waiting = D_GET(waiters, key, hash);
    if (waiting == NULL) return PyErr_Occurred() ? -1 : 0;
    Py_INCREF(waiting);
    if (D_DEL(waiters, key, hash) < 0) {
        Py_DECREF(waiting);
        return -1;
    }
    PyObject *it = PyObject_GetIter(waiting), *waiter;
    Py_DECREF(waiting);
    if (it == NULL) return -1;
    int rc = 0;
    while ((waiter = PyIter_Next(it)) != NULL) {
        PyObject *held_by = PyDict_GetItemWithError(requests, waiter);
        Py_DECREF(waiter);
        if (held_by == NULL) {
            if (PyErr_Occurred()) { rc = -1; break; }
            continue;
        }
        Py_INCREF(held_by);
        PyObject *zero = PyLong_FromLong(0);
        rc = PyObject_SetAttr(held_by, str_keyed, zero);
        Py_DECREF(zero);
        Py_DECREF(held_by);
        if (rc < 0) break;
    }
    Py_DECREF(it);
    return rc < 0 || PyErr_Occurred() ? -1 : 0;
}

static PyObject *py_reclaim_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ARGS(13);
    if (bind_type(args[0]) < 0) return NULL;
    args++;  /* the Block class */
    PyObject *cached = args[0], *head = args[2], *owners = args[3], *holds = args[4];
    PyObject *refs = args[5], *append = args[6], *spare = args[7], *index = args[8];
    PyObject *waiters = args[9], *requests = args[10], *pool_name = args[11];
    NEED_TYPE(cached, PyODict_CheckExact, "OrderedDict");
    NEED_TYPE(owners, PyList_CheckExact, "list");
    NEED_TYPE(holds, PyList_CheckExact, "list");
    NEED_TYPE(refs, PyList_CheckExact, "list");
    NEED_TYPE(spare, PyList_CheckExact, "list");
    NEED_TYPE(index, PyDict_CheckExact, "dict");
    NEED_TYPE(waiters, PyDict_CheckExact, "dict");
    NEED_TYPE(requests, PyDict_CheckExact, "dict");
    Py_ssize_t shortn = PyLong_AsSsize_t(args[1]);
    if (shortn == -1 && PyErr_Occurred()) return NULL;
    /* the heads, oldest first, read before any is removed (as list(islice(...)) reads them) */
    PyObject *heads;
    if (shortn > 1) {
        heads = PyList_New(0);
        if (heads == NULL) return NULL;
        PyObject *it = PyObject_GetIter(cached), *page;
        if (it == NULL) {
            Py_DECREF(heads);
            return NULL;
        }
        for (Py_ssize_t k = 0; k < shortn && (page = PyIter_Next(it)) != NULL; k++) {
            int bad = PyList_Append(heads, page) < 0;
            Py_DECREF(page);
            if (bad) break;
        }
        Py_DECREF(it);
        if (PyErr_Occurred()) {
            Py_DECREF(heads);
            return NULL;
        }
        if (fault_mask & 8) PyList_Reverse(heads);
    } else {
        heads = PyList_New(1);
        if (heads == NULL) return NULL;
        Py_INCREF(head);
        PyList_SET_ITEM(heads, 0, head);
    }
    Py_ssize_t lost = 0;
    PyObject *zero = PyLong_FromLong(0);
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(heads); k++) {
        PyObject *page = PyList_GET_ITEM(heads, k), *key = NULL;
        Py_ssize_t o = list_pos(owners, page), h, r, s;
        if (o < 0 || (h = list_pos(holds, page)) < 0) goto fail;
        PyObject *blk = PyList_GET_ITEM(owners, o);
        if (Py_TYPE(blk) != block_type) break;  /* the caller's loop takes it through _reclaim */
        PyObject *holders = slot_get(blk, off_holders, "holders");
        if (holders == NULL) goto fail;
        int held = PyObject_IsTrue(holders);
        if (held < 0) goto fail;
        if (held || count_at(holds, h) != 1) break;
        Py_INCREF(blk);
        key = slot_get(blk, off_key, "key");  /* _lose_block */
        if (key == NULL) goto fail_b;
        Py_INCREF(key);
        Py_hash_t hash = PyObject_Hash(key);
        if (hash == -1 || D_DEL(index, key, hash) < 0) goto fail_b;
        slot_set(blk, off_key, zero);
        if (wake_waiters(waiters, key, hash, requests) < 0) goto fail_b;
        if ((r = list_pos(refs, page)) < 0) goto fail_b;
        long left = count_at(refs, r);
        if (left != 0) {
            PyErr_Format(PyExc_AssertionError, "pool %S: reclaim of cached page %S with %ld "
                         "references; this indicates reclaiming protected storage",
                         pool_name, page, left);
            goto fail_b;
        }
        if (count_set(holds, h, 0) < 0) goto fail_b;  /* pool.unhold: cached -> free */
        if (PyODict_DelItem(cached, page) < 0) goto fail_b;
        PyObject *res = PyObject_CallOneArg(append, page);
        if (res == NULL) goto fail_b;
        Py_DECREF(res);
        lost++;  /* no holder: forget the block */
        if ((o = list_pos(owners, page)) < 0 || (s = list_pos(spare, page)) < 0) goto fail_b;
        item_set(owners, o, Py_None);
        item_set(spare, s, blk);
        Py_DECREF(key);
        Py_DECREF(blk);
        continue;
    fail_b:
        Py_XDECREF(key);
        Py_DECREF(blk);
    fail:
        Py_DECREF(zero);
        Py_DECREF(heads);
        return NULL;
    }
    Py_DECREF(zero);
    Py_DECREF(heads);
    return PyLong_FromSsize_t(lost);
}

/* -- ref_blocks: CachedOrganization._blocks_ref's loop, then PagePool.incref_many's ---------
 *
 *     for blk in blks: assert holder not in blk.holders; blk.holders.add(holder);
 *                      pages.append(blk.page)
 *     for page in pages:                                          (pool.incref_many(pages))
 *         if refs[page] == 0: del cached[page] if holds[page] else raise; num_in_use += 1
 *         refs[page] += 1
 * -> the pages that went from cached to in use (the caller adds them to num_in_use)
 */
static PyObject *py_ref_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ARGS(7);
    if (bind_type(args[0]) < 0) return NULL;
    args++;  /* the Block class */
    PyObject *blks = args[0], *holder = args[1], *refs = args[2], *holds = args[3];
    PyObject *cached = args[4], *pool_name = args[5];
    NEED_TYPE(blks, PyList_CheckExact, "list");
    NEED_TYPE(refs, PyList_CheckExact, "list");
    NEED_TYPE(holds, PyList_CheckExact, "list");
    NEED_TYPE(cached, PyODict_CheckExact, "OrderedDict");
    Py_ssize_t n = PyList_GET_SIZE(blks), used = 0;
    PyObject *pages = PyList_New(0);
    if (pages == NULL) return NULL;
    for (Py_ssize_t k = 0; k < n && k < PyList_GET_SIZE(blks); k++) {
        PyObject *blk = PyList_GET_ITEM(blks, k);
        if (check_block(blk) < 0) goto fail;
        PyObject *holders = slot_get(blk, off_holders, "holders");
        if (holders == NULL) goto fail;
        Py_INCREF(holders);
        int has = PySet_Contains(holders, holder);
        if (has > 0) {
            PyObject *page = slot_get(blk, off_page, "page");
            if (page != NULL)
                PyErr_Format(PyExc_AssertionError, "%S already references block %S", holder,
                             page);
        }
        int bad = has != 0 || PySet_Add(holders, holder) < 0;
        Py_DECREF(holders);
        if (bad) goto fail;
        PyObject *page = slot_get(blk, off_page, "page");
        if (page == NULL || PyList_Append(pages, page) < 0) goto fail;
    }
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(pages); k++) {
        PyObject *page = PyList_GET_ITEM(pages, k);
        Py_ssize_t r = list_pos(refs, page), h;
        if (r < 0) goto fail;
        long count = count_at(refs, r);
        if (count == -1 && PyErr_Occurred()) goto fail;
        if (count == 0) {
            if ((h = list_pos(holds, page)) < 0) goto fail;
            if (count_at(holds, h)) {
                if (PyODict_DelItem(cached, page) < 0) goto fail;  /* cached -> in use */
            } else {
                PyErr_Format(PyExc_AssertionError, "pool %S: incref of free page %S; this "
                             "indicates a reference to storage that holds nothing",
                             pool_name, page);
                goto fail;
            }
            used++;
        }
        if (count_set(refs, r, count + 1) < 0) goto fail;
    }
    Py_DECREF(pages);
    return PyLong_FromSsize_t(used + ((fault_mask & 16) && used));
fail:
    Py_DECREF(pages);
    return NULL;
}

/* -- adopt_blocks: CachedOrganization.adopt's loop over the hit's blocks -------------------
 *
 *     for key, page in zip(hit.block_keys, hit.blocks, strict=True):
 *         blk = attn_index.get(key)
 *         if blk is None or blk.page != page: raise ValueError("stale hit: ...")
 *         blocks.append(blk)
 * -> blocks (a new list)
 */
static PyObject *py_adopt_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ARGS(4);
    if (bind_type(args[0]) < 0) return NULL;
    args++;  /* the Block class */
    PyObject *keys = args[0], *pages = args[1], *index = args[2];
    NEED_TYPE(keys, PyTuple_CheckExact, "tuple");
    NEED_TYPE(pages, PyTuple_CheckExact, "tuple");
    NEED_TYPE(index, PyDict_CheckExact, "dict");
    Py_ssize_t n = PyTuple_GET_SIZE(keys), m = PyTuple_GET_SIZE(pages);
    PyObject *blocks = PyList_New(0);
    if (blocks == NULL) return NULL;
    for (Py_ssize_t k = 0; k < n || k < m; k++) {
        if (k >= n || k >= m) {
            PyErr_Format(PyExc_ValueError, "zip() argument 2 is %s than argument 1",
                         k >= m ? "shorter" : "longer");
            goto fail;
        }
        PyObject *key = PyTuple_GET_ITEM(keys, k), *page = PyTuple_GET_ITEM(pages, k);
        PyObject *blk = PyDict_GetItemWithError(index, key);
        if (blk == NULL && PyErr_Occurred()) goto fail;
        int same = 0;
        if (blk != NULL) {
            Py_INCREF(blk);
            PyObject *own = check_block(blk) < 0 ? NULL : slot_get(blk, off_page, "page");
            same = own == NULL ? -1 : PyObject_RichCompareBool(own, page, Py_EQ);
            if (same > 0 && !((fault_mask & 32) && k == n - 1) && PyList_Append(blocks, blk) < 0)
                same = -1;
            Py_DECREF(blk);
            if (same < 0) goto fail;
        }
        if (!same) {
            PyObject *hex = PyNumber_ToBase(key, 16);
            if (hex != NULL)
                PyErr_Format(PyExc_ValueError, "stale hit: attention key %S no longer on page %S",
                             hex, page);
            Py_XDECREF(hex);
            goto fail;
        }
    }
    return blocks;
fail:
    Py_DECREF(blocks);
    return NULL;
}

/* -- block_pages: CachedOrganization.lookup's pages of the hit's blocks ---------------------
 *
 *     tuple([attn_index[k].page for k in keys])
 */
static PyObject *py_block_pages(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ARGS(3);
    if (bind_type(args[0]) < 0) return NULL;
    args++;  /* the Block class */
    PyObject *keys = args[0], *index = args[1];
    NEED_TYPE(keys, PyTuple_CheckExact, "tuple");
    NEED_TYPE(index, PyDict_CheckExact, "dict");
    Py_ssize_t n = PyTuple_GET_SIZE(keys);
    PyObject *out = PyTuple_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *key = PyTuple_GET_ITEM(keys, k);
        PyObject *blk = PyDict_GetItemWithError(index, key), *page;
        if (blk == NULL) {
            if (!PyErr_Occurred()) _PyErr_SetKeyError(key);
            goto fail;
        }
        if (check_block(blk) < 0 || (page = slot_get(blk, off_page, "page")) == NULL) goto fail;
        Py_INCREF(page);
        PyTuple_SET_ITEM(out, (fault_mask & 64) ? n - 1 - k : k, page);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* -- indexed_prefix: CachedOrganization.lookup's discoverable attention prefix -------------
 *
 *     len(list(takewhile(attn_index.__contains__, req.attn_chain[:stop])))
 */
static PyObject *py_indexed_prefix(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ARGS(3);
    PyObject *chain = args[0], *index = args[2];
    NEED_TYPE(chain, PyList_CheckExact, "list");
    NEED_TYPE(index, PyDict_CheckExact, "dict");
    Py_ssize_t stop = PyLong_AsSsize_t(args[1]), k = 0;
    if (stop == -1 && PyErr_Occurred()) return NULL;
    for (; k < stop && k < PyList_GET_SIZE(chain); k++) {
        PyObject *key = PyList_GET_ITEM(chain, k);
        Py_INCREF(key);
        int found = PyDict_Contains(index, key);
        Py_DECREF(key);
        if (found < 0) return NULL;
        if (!found) break;
    }
    return PyLong_FromSsize_t(k + ((fault_mask & 256) ? 32 : 0));
}

/* -- drop_waits: CachedOrganization._release_all's loop over the request's waits -----------
 *
 *     for key in req.waits:
 *         waiting = waiters.get(key)
 *         if waiting is not None: waiting.discard(rid); if not waiting: del waiters[key]
 */
static PyObject *py_drop_waits(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ARGS(3);
    PyObject *waits = args[0], *waiters = args[1], *rid = args[2];
    NEED_TYPE(waits, PyList_CheckExact, "list");
    NEED_TYPE(waiters, PyDict_CheckExact, "dict");
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(waits); k++) {
        PyObject *key = PyList_GET_ITEM(waits, k);
        Py_INCREF(key);
        Py_hash_t hash = PyObject_Hash(key);
        PyObject *waiting = hash == -1 ? NULL : D_GET(waiters, key, hash);
        int bad = 0;
        if (waiting == NULL) {
            bad = PyErr_Occurred() != NULL;
        } else {
            Py_INCREF(waiting);
            if (PyAnySet_Check(waiting)) {
                bad = PySet_Discard(waiting, rid) < 0;
                if (!bad && PySet_GET_SIZE(waiting) == 0 && !(fault_mask & 128))
                    bad = D_DEL(waiters, key, hash) < 0;
            } else {
                PyErr_SetString(PyExc_TypeError, "key_waiters values must be sets");
                bad = 1;
            }
            Py_DECREF(waiting);
        }
        Py_DECREF(key);
        if (bad) return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_set_fault(PyObject *self, PyObject *arg) {
    unsigned long mask = PyLong_AsUnsignedLong(arg);
    if (mask == (unsigned long)-1 && PyErr_Occurred()) return NULL;
    fault_mask = mask;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"take_blocks", (PyCFunction)(void (*)(void))py_take_blocks, METH_FASTCALL,
     "CachedOrganization.allocate's take loop"},
    {"unref_blocks", (PyCFunction)(void (*)(void))py_unref_blocks, METH_FASTCALL,
     "CachedOrganization._blocks_unref's loop -> (unused pages, forgotten blocks)"},
    {"publish_blocks", (PyCFunction)(void (*)(void))py_publish_blocks, METH_FASTCALL,
     "CachedOrganization.publish's block loop"},
    {"reclaim_run", (PyCFunction)(void (*)(void))py_reclaim_run, METH_FASTCALL,
     "CachedOrganization._make_free's inline loop -> blocks lost"},
    {"ref_blocks", (PyCFunction)(void (*)(void))py_ref_blocks, METH_FASTCALL,
     "CachedOrganization._blocks_ref's loop and PagePool.incref_many's -> pages now in use"},
    {"adopt_blocks", (PyCFunction)(void (*)(void))py_adopt_blocks, METH_FASTCALL,
     "CachedOrganization.adopt's loop over the hit's blocks -> blocks"},
    {"block_pages", (PyCFunction)(void (*)(void))py_block_pages, METH_FASTCALL,
     "CachedOrganization.lookup's pages of the hit's blocks -> tuple"},
    {"indexed_prefix", (PyCFunction)(void (*)(void))py_indexed_prefix, METH_FASTCALL,
     "CachedOrganization.lookup's discoverable attention prefix -> its length"},
    {"drop_waits", (PyCFunction)(void (*)(void))py_drop_waits, METH_FASTCALL,
     "CachedOrganization._release_all's loop over the request's waits"},
    {"_set_fault", py_set_fault, METH_O, "tests only: deliberate bugs (bit mask), 0 = none"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "hybridmem._cblocks",
    "Compiled per-block loops of hybridmem/cached_org.py (its load_compiled).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cblocks(void) {
    str_keyed = PyUnicode_InternFromString("keyed");
    str_name = PyUnicode_InternFromString("name");
    if (str_keyed == NULL || str_name == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "API_VERSION", CBLOCKS_API_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
