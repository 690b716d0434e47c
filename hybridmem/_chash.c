/* hybridmem._chash: the chained 64-bit cache keys of hybridmem/hashing.py in one call per chain.
 *
 * BLAKE2b written from its specification, RFC 7693 (sections 2.1-3.3: IV, SIGMA, G, F, the
 * parameter block with no key, 12 rounds), unkeyed, digest length 1..64. A key is the 8-byte
 * digest, read big-endian, of the message hashing.chunk_hash defines:
 *
 *     <BQI  kind, parent, grid     13 bytes
 *     <nq   the chunk's token ids  8 * grid bytes
 *     tail  the extra encoding     bytes given by the caller (hashing._encode_extra)
 *
 * and each key is the next chunk's parent; a digest of 0 becomes 1 (0 is "no key").
 *
 *     chain(kind, tokens, start, grid, chunks, tail, parent) -> list[int]
 *         tokens: list or tuple of exact ints; anything this fast path does not take (another
 *         item type, a value out of int64, a field out of range) raises, and hashing.py then
 *         computes the same keys, or the same error, in Python.
 *     chain_pair(tokens, kind_a, grid_a, chunks_a, kind_b, grid_b, chunks_b, tail)
 *         -> (keys_a, keys_b): two chains from 0 over the same tokens, read once
 *     blake2b(data, digest_size) -> bytes     (tests: RFC 7693 vectors, hashlib)
 *     _set_fault(mask)                         (tests only: XORs mask into h[0] after every
 *                                               compression, the negative control; 0 = none)
 *
 * The GIL is held throughout (no Python code runs between reading a token and hashing).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define CHASH_API_VERSION 2 /* hybridmem/hashing.py _CHASH_API: bump both on any change */

static const uint64_t IV[8] = {
    0x6A09E667F3BCC908ULL, 0xBB67AE8584CAA73BULL, 0x3C6EF372FE94F82BULL, 0xA54FF53A5F1D36F1ULL,
    0x510E527FADE682D1ULL, 0x9B05688C2B3E6C1FULL, 0x1F83D9ABFB41BD6BULL, 0x5BE0CD19137E2179ULL,
};

/* RFC 7693 2.7: message word schedule; rounds 10 and 11 reuse rows 0 and 1. */
static const uint8_t SIGMA[10][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
};

static uint64_t fault_mask = 0;

static inline uint64_t rotr64(uint64_t x, unsigned n) { return (x >> n) | (x << (64 - n)); }

/* Little-endian 64-bit words: one unaligned move on a little-endian host (the byte-by-byte
 * form, which compilers do not always merge, elsewhere). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
static inline uint64_t load64(const uint8_t *p) {
    uint64_t x;
    memcpy(&x, p, 8);
    return x;
}

static inline void store64(uint8_t *p, uint64_t x) { memcpy(p, &x, 8); }
#else
static inline uint64_t load64(const uint8_t *p) {
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 |
           (uint64_t)p[7] << 56;
}

static inline void store64(uint8_t *p, uint64_t x) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(x >> (8 * i));
}
#endif

/* RFC 7693 3.1: the mixing function G with rotation constants R1..R4 = 32, 24, 16, 63. */
#define G(a, b, c, d, x, y)                \
    do {                                   \
        v[a] = v[a] + v[b] + (x);          \
        v[d] = rotr64(v[d] ^ v[a], 32);    \
        v[c] = v[c] + v[d];                \
        v[b] = rotr64(v[b] ^ v[c], 24);    \
        v[a] = v[a] + v[b] + (y);          \
        v[d] = rotr64(v[d] ^ v[a], 16);    \
        v[c] = v[c] + v[d];                \
        v[b] = rotr64(v[b] ^ v[c], 63);    \
    } while (0)

/* RFC 7693 3.2: one round: G on the four columns, then on the four diagonals. */
#define ROUND(r)                                                       \
    do {                                                               \
        G(0, 4, 8, 12, m[SIGMA[(r) % 10][0]], m[SIGMA[(r) % 10][1]]);   \
        G(1, 5, 9, 13, m[SIGMA[(r) % 10][2]], m[SIGMA[(r) % 10][3]]);   \
        G(2, 6, 10, 14, m[SIGMA[(r) % 10][4]], m[SIGMA[(r) % 10][5]]);  \
        G(3, 7, 11, 15, m[SIGMA[(r) % 10][6]], m[SIGMA[(r) % 10][7]]);  \
        G(0, 5, 10, 15, m[SIGMA[(r) % 10][8]], m[SIGMA[(r) % 10][9]]);  \
        G(1, 6, 11, 12, m[SIGMA[(r) % 10][10]], m[SIGMA[(r) % 10][11]]); \
        G(2, 7, 8, 13, m[SIGMA[(r) % 10][12]], m[SIGMA[(r) % 10][13]]);  \
        G(3, 4, 9, 14, m[SIGMA[(r) % 10][14]], m[SIGMA[(r) % 10][15]]);  \
    } while (0)

/* RFC 7693 3.2: compression function F over one 128-byte block; t = bytes so far (this
 * block included; messages here stay far below 2^64 bytes, so the high counter word is 0). */
static void compress(uint64_t h[8], const uint8_t block[128], uint64_t t, int last) {
    uint64_t v[16], m[16];
    for (int i = 0; i < 16; i++) m[i] = load64(block + 8 * i);
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = IV[i];
    }
    v[12] ^= t;
    if (last) v[14] = ~v[14];
    /* the 12 rounds written out, so every SIGMA index is a constant and m, v stay in registers */
    ROUND(0); ROUND(1); ROUND(2); ROUND(3); ROUND(4); ROUND(5);
    ROUND(6); ROUND(7); ROUND(8); ROUND(9); ROUND(10); ROUND(11);
    for (int i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
    h[0] ^= fault_mask;
}

/* RFC 7693 3.3: unkeyed BLAKE2b of len bytes into h (digest = h's first outlen LE bytes).
 * Every block but the last is compressed with last = 0; the last (zero-padded; an empty
 * message is one zero block) with t = len and last = 1. */
static void blake2b_words(uint64_t h[8], const uint8_t *data, size_t len, unsigned outlen) {
    for (int i = 0; i < 8; i++) h[i] = IV[i];
    h[0] ^= 0x01010000ULL ^ (uint64_t)outlen;
    size_t off = 0;
    while (len - off > 128) {
        compress(h, data + off, (uint64_t)(off + 128), 0);
        off += 128;
    }
    uint8_t block[128];
    memset(block, 0, sizeof block);
    memcpy(block, data + off, len - off);
    compress(h, block, (uint64_t)len, 1);
}

static PyObject *py_blake2b(PyObject *self, PyObject *args) {
    Py_buffer data;
    int outlen;
    if (!PyArg_ParseTuple(args, "y*i", &data, &outlen)) return NULL;
    if (outlen < 1 || outlen > 64) {
        PyBuffer_Release(&data);
        return PyErr_Format(PyExc_ValueError, "digest_size must be 1..64, got %d", outlen);
    }
    uint64_t h[8];
    blake2b_words(h, (const uint8_t *)data.buf, (size_t)data.len, (unsigned)outlen);
    PyBuffer_Release(&data);
    uint8_t out[64];
    for (int i = 0; i < 8; i++) store64(out + 8 * i, h[i]);
    return PyBytes_FromStringAndSize((const char *)out, outlen);
}

/* One token as int64: exact ints only (anything else raises, and hashing.py takes the Python
 * path). On CPython 3.11 with 30-bit digits an int of at most two digits is read directly. */
static inline int token_value(PyObject *item, int64_t *out) {
    if (!PyLong_CheckExact(item)) {
        PyErr_SetString(PyExc_TypeError, "token is not an int");
        return -1;
    }
#if PY_VERSION_HEX < 0x030C0000 && PyLong_SHIFT == 30
    const digit *d = ((PyLongObject *)item)->ob_digit;
    switch (Py_SIZE(item)) {
    case 0: *out = 0; return 0;
    case 1: *out = (int64_t)d[0]; return 0;
    case -1: *out = -(int64_t)d[0]; return 0;
    case 2: *out = (int64_t)d[0] | (int64_t)d[1] << 30; return 0;
    case -2: *out = -((int64_t)d[0] | (int64_t)d[1] << 30); return 0;
    default: break;
    }
#endif
    long long v = PyLong_AsLongLong(item);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = (int64_t)v;
    return 0;
}

/* The little-endian int64 encoding of tokens[start:start + count] (a list or tuple of ints)
 * into a new buffer (PyMem_Free it), or NULL with an exception set. */
static uint8_t *pack_tokens(PyObject *tokens, Py_ssize_t start, Py_ssize_t count) {
    if (!PyList_CheckExact(tokens) && !PyTuple_CheckExact(tokens)) {
        PyErr_SetString(PyExc_TypeError, "tokens must be a list or tuple");
        return NULL;
    }
    if (start < 0 || count < 0 || count > PySequence_Fast_GET_SIZE(tokens) - start ||
        count > PY_SSIZE_T_MAX / 8 - 1) {
        PyErr_SetString(PyExc_ValueError, "fewer tokens than chunks * grid");
        return NULL;
    }
    uint8_t *raw = PyMem_Malloc(8 * (size_t)count + 1);
    if (raw == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(tokens) + start;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t v;
        if (token_value(items[i], &v) < 0) {
            PyMem_Free(raw);
            return NULL;
        }
        store64(raw + 8 * i, (uint64_t)v);
    }
    return raw;
}

/* The keys of `chunks` grid-token chunks of the packed tokens raw, chained from parent, as a
 * new list (NULL with an exception set). */
static PyObject *chain_packed(int kind, const uint8_t *raw, Py_ssize_t grid, Py_ssize_t chunks,
                              const Py_buffer *tail, unsigned long long parent) {
    if (kind < 0 || kind > 255 || grid < 1 || grid > (Py_ssize_t)UINT32_MAX || chunks < 0 ||
        grid > (PY_SSIZE_T_MAX - 13 - tail->len) / 8) {
        PyErr_SetString(PyExc_ValueError, "kind, grid or chunks out of range");
        return NULL;
    }
    if (chunks == 0) return PyList_New(0); /* no message buffer for a grid longer than tokens */
    size_t width = 8 * (size_t)grid, len = 13 + width + (size_t)tail->len;
    uint8_t *msg = PyMem_Malloc(len);
    if (msg == NULL) return PyErr_NoMemory();
    PyObject *result = PyList_New(chunks);
    if (result == NULL) {
        PyMem_Free(msg);
        return NULL;
    }
    msg[0] = (uint8_t)kind;
    for (int i = 0; i < 4; i++) msg[9 + i] = (uint8_t)((uint64_t)grid >> (8 * i));
    memcpy(msg + 13 + width, tail->buf, (size_t)tail->len);
    for (Py_ssize_t c = 0; c < chunks; c++) {
        store64(msg + 1, (uint64_t)parent);
        memcpy(msg + 13, raw + (size_t)c * width, width);
        uint64_t h[8];
        blake2b_words(h, msg, len, 8);
        /* digest bytes = h[0] little-endian; the key reads them big-endian */
        uint64_t key = 0;
        for (int i = 0; i < 8; i++) key = key << 8 | ((h[0] >> (8 * i)) & 0xFF);
        if (key == 0) key = 1;
        PyObject *k = PyLong_FromUnsignedLongLong(key);
        if (k == NULL) {
            Py_DECREF(result);
            PyMem_Free(msg);
            return NULL;
        }
        PyList_SET_ITEM(result, c, k);
        parent = key;
    }
    PyMem_Free(msg);
    return result;
}

static PyObject *py_chain(PyObject *self, PyObject *args) {
    int kind;
    PyObject *tokens, *parent_obj, *result = NULL;
    Py_ssize_t start, grid, chunks;
    Py_buffer tail;
    if (!PyArg_ParseTuple(args, "iOnnny*O", &kind, &tokens, &start, &grid, &chunks, &tail,
                          &parent_obj))
        return NULL;
    unsigned long long parent = PyLong_AsUnsignedLongLong(parent_obj);
    if (parent == (unsigned long long)-1 && PyErr_Occurred()) goto done;
    if (grid < 1 || chunks < 0 || chunks > PY_SSIZE_T_MAX / 8 / grid) {
        PyErr_SetString(PyExc_ValueError, "grid or chunks out of range");
        goto done;
    }
    uint8_t *raw = pack_tokens(tokens, start, grid * chunks);
    if (raw == NULL) goto done;
    result = chain_packed(kind, raw, grid, chunks, &tail, parent);
    PyMem_Free(raw);
done:
    PyBuffer_Release(&tail);
    return result;
}

/* chain_pair(tokens, kind_a, grid_a, chunks_a, kind_b, grid_b, chunks_b, tail): both chains
 * from 0 over the same tokens, converted once: (keys_a, keys_b). */
static PyObject *py_chain_pair(PyObject *self, PyObject *args) {
    int ka, kb;
    PyObject *tokens, *a = NULL, *b = NULL, *result = NULL;
    Py_ssize_t ga, ca, gb, cb;
    Py_buffer tail;
    if (!PyArg_ParseTuple(args, "Oinninny*", &tokens, &ka, &ga, &ca, &kb, &gb, &cb, &tail))
        return NULL;
    if (ga < 1 || gb < 1 || ca < 0 || cb < 0 || ca > PY_SSIZE_T_MAX / 8 / ga ||
        cb > PY_SSIZE_T_MAX / 8 / gb) {
        PyErr_SetString(PyExc_ValueError, "grid or chunks out of range");
        goto done;
    }
    Py_ssize_t used = ga * ca > gb * cb ? ga * ca : gb * cb;
    uint8_t *raw = pack_tokens(tokens, 0, used);
    if (raw == NULL) goto done;
    a = chain_packed(ka, raw, ga, ca, &tail, 0);
    if (a != NULL) b = chain_packed(kb, raw, gb, cb, &tail, 0);
    PyMem_Free(raw);
    if (b != NULL) result = PyTuple_Pack(2, a, b);
    Py_XDECREF(a);
    Py_XDECREF(b);
done:
    PyBuffer_Release(&tail);
    return result;
}

static PyObject *py_set_fault(PyObject *self, PyObject *arg) {
    unsigned long long mask = PyLong_AsUnsignedLongLong(arg);
    if (mask == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    fault_mask = mask;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"chain", py_chain, METH_VARARGS,
     "chain(kind, tokens, start, grid, chunks, tail, parent) -> list of chained keys"},
    {"chain_pair", py_chain_pair, METH_VARARGS,
     "chain_pair(tokens, kind_a, grid_a, chunks_a, kind_b, grid_b, chunks_b, tail) -> (a, b)"},
    {"blake2b", py_blake2b, METH_VARARGS, "blake2b(data, digest_size) -> digest bytes"},
    {"_set_fault", py_set_fault, METH_O, "tests only: XOR a mask into every compression"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "hybridmem._chash",
    "Compiled chained cache keys (BLAKE2b, RFC 7693); see hybridmem/hashing.py.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__chash(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "API_VERSION", CHASH_API_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
