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
 *         tokens: a list or tuple of exact ints, or a C-contiguous buffer of native int64
 *         (array('q'), a NumPy int64 array: format q or l of 8 bytes); anything this fast path
 *         does not take (another item type, a value out of int64, a field out of range)
 *         raises, and hashing.py then computes the same keys, or the same error, in Python.
 *     pack(tokens) -> bytes                    every token of a list or tuple of exact ints as
 *                                              native int64 (array('q', pack(t)) is t as an
 *                                              array); raises as chain does otherwise
 *     chain_pair(tokens, kind_a, grid_a, chunks_a, kind_b, grid_b, chunks_b, tail)
 *         -> (keys_a, keys_b): two chains from 0 over the same tokens, read once
 *         (on x86-64 with AVX2, detected at import: both chains' blocks in one vector
 *         compression, compress_vv, while both have blocks left; the keys are the same bytes)
 *     blake2b(data, digest_size) -> bytes     (tests: RFC 7693 vectors, hashlib)
 *     LANES                                    1 if chain_pair runs its chains side by side
 *     VECTOR                                   the compressions at import: 0 = compress (the
 *                                              scalar definition), 1 = AVX2, 2 = AVX-512VL
 *                                              (the state's rows in 256-bit vectors)
 *     _set_lanes(on) -> bool                   (tests: chain_pair side by side on/off; False
 *                                              where there is no AVX2)
 *     _set_lane_fault(mask)                    (tests only: XORs mask into the second message's
 *                                              h[0] after every two-message compression)
 *     _set_vector(level) -> int                (tests: 0, 1 or 2 as VECTOR -> the level now
 *                                              used, at most what the CPU has)
 *     _set_vector_fault(mask)                  (tests only: XORs mask into h[0] after every
 *                                              one-message vector compression, compress_v)
 *     _set_fault(mask)                         (tests only: XORs mask into h[0] after every
 *                                               compression, the negative control; 0 = none)
 *
 * The GIL is held throughout (no Python code runs between reading a token and hashing).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define CHASH_API_VERSION 5 /* hybridmem/hashing.py _CHASH_API: bump both on any change */

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

/* The vector compressions: x86-64 with a GCC-compatible compiler only. Each is compiled for its
 * instruction set by a target attribute (VEX / EVEX encoded) and chosen at import by
 * __builtin_cpu_supports, never by compiler flags: the module builds with plain gcc/clang and
 * runs anywhere; without AVX2 (or on another architecture) everything runs on compress, which
 * stays the definition. */
#if defined(__x86_64__) && defined(__GNUC__)
#define CHASH_LANES 1
#include <immintrin.h>

#define LANES_ATTR __attribute__((target("avx2")))
#define ROWS512_ATTR __attribute__((target("avx2,avx512f,avx512vl")))

/* compress on one block with the state's four rows in four 256-bit vectors (RFC 7693 3.2 laid
 * out by rows): a = v0..3 (h0..3), b = v4..7 (h4..7), c = v8..11 (IV0..3), d = v12..15 (IV4..7
 * ^ t, f). One G on the rows is the four column G's of a round at once, lane i the column
 * (i, 4 + i, 8 + i, 12 + i); the message words of lane i are m[SIGMA[r][2i]], m[SIGMA[r][2i+1]].
 * For the diagonal G's b stays where it is and a, c, d are turned by lane permutes so that lane
 * j holds the diagonal through b's word 4 + j: (a[j-1], b[j], c[j+1], d[j+2]), i.e. the G's
 * (3, 4, 9, 14), (0, 5, 10, 15), (1, 6, 11, 12), (2, 7, 8, 13) with their SIGMA words 14/15, 8/9,
 * 10/11, 12/13. (a, c and d were written a few steps before they are read again, so the
 * permutes run beside b's rotations; b, read first, is never waited for.) Then the turns are
 * undone. Same words, same arithmetic as compress, which stays the definition.
 *
 * Built twice from the macros below: for AVX2 (rotations by 32, 24, 16 as byte shuffles, by 63
 * as shift, add, xor) and for AVX-512VL (each rotation one vprorq on the same 256-bit vectors).
 * One message's G's are one dependent chain (~12 operations each: the column G's side by side
 * are all the parallelism one message has), so compress_vv runs two independent messages' rows
 * in the same instruction stream, for chain_pair's two chains: the CPU overlaps the two chains.
 * vec_level (at import: 2 with AVX-512VL, 1 with AVX2, else 0 = compress) chooses;
 * _set_vector in tests. */
static int vec_level = 0;            /* 0: compress, 1: AVX2 rows, 2: AVX-512VL rows */
static int lanes_on = 0;             /* chain_pair's two chains side by side (compress_vv) */
static uint64_t vec_fault_mask = 0;  /* tests only: XORed into h[0] by compress_v */
static uint64_t lane_fault_mask = 0; /* tests only: XORed into the second h[0] by compress_vv */

#define VADD(x, y) _mm256_add_epi64((x), (y))
#define VXOR(x, y) _mm256_xor_si256((x), (y))

/* G on the four lanes of rows a, b, c, d: x, y the lanes' message words (x is added to a
 * before b is ready). VROT32 .. VROT63 are defined per instruction set below. */
#define GV(a, b, c, d, x, y)                                                                   \
    do {                                                                                       \
        a = VADD(VADD(a, (x)), b);                                                             \
        d = VROT32(VXOR(d, a));                                                                \
        c = VADD(c, d);                                                                        \
        b = VROT24(VXOR(b, c));                                                                \
        a = VADD(VADD(a, (y)), b);                                                             \
        d = VROT16(VXOR(d, a));                                                                \
        c = VADD(c, d);                                                                        \
        b = VROT63(VXOR(b, c));                                                                \
    } while (0)

/* block's message words m[SIGMA[r][i0]], ... in lanes 0..3: four broadcast loads, three
 * blends (no shuffle unit) */
#define MB(blk, r, i) _mm256_set1_epi64x((long long)load64((blk) + 8 * SIGMA[(r) % 10][i]))
#define MV(blk, r, i0, i1, i2, i3)                                                             \
    _mm256_blend_epi32(                                                                        \
        _mm256_blend_epi32(_mm256_blend_epi32(MB(blk, r, i0), MB(blk, r, i1), 0x0C),           \
                           MB(blk, r, i2), 0x30),                                              \
        MB(blk, r, i3), 0xC0)

#define TURN(x, s) x = _mm256_permute4x64_epi64(x, s)
#define ROUNDV(r, blk, a, b, c, d)                                                             \
    do {                                                                                       \
        GV(a, b, c, d, MV(blk, r, 0, 2, 4, 6), MV(blk, r, 1, 3, 5, 7));                        \
        TURN(a, _MM_SHUFFLE(2, 1, 0, 3));                                                      \
        TURN(c, _MM_SHUFFLE(0, 3, 2, 1));                                                      \
        TURN(d, _MM_SHUFFLE(1, 0, 3, 2));                                                      \
        GV(a, b, c, d, MV(blk, r, 14, 8, 10, 12), MV(blk, r, 15, 9, 11, 13));                  \
        TURN(a, _MM_SHUFFLE(0, 3, 2, 1));                                                      \
        TURN(c, _MM_SHUFFLE(2, 1, 0, 3));                                                      \
        TURN(d, _MM_SHUFFLE(1, 0, 3, 2));                                                      \
    } while (0)

/* the 16-word work vector of h, t, last as rows (RFC 7693 3.2) */
#define ROWS_INIT(h, t, last, h0, h1, a, b, c, d)                                              \
    const __m256i h0 = _mm256_loadu_si256((const __m256i *)(h));                               \
    const __m256i h1 = _mm256_loadu_si256((const __m256i *)((h) + 4));                         \
    __m256i a = h0, b = h1, c = _mm256_loadu_si256((const __m256i *)IV);                       \
    __m256i d = VXOR(_mm256_loadu_si256((const __m256i *)(IV + 4)),                            \
                     _mm256_set_epi64x(0, (last) ? -1LL : 0, 0, (long long)(t)))
/* h ^= v[0..7] ^ v[8..15] */
#define ROWS_FINISH(h, h0, h1, a, b, c, d, test_mask)                                          \
    do {                                                                                       \
        _mm256_storeu_si256((__m256i *)(h), VXOR(h0, VXOR(a, c)));                             \
        _mm256_storeu_si256((__m256i *)((h) + 4), VXOR(h1, VXOR(b, d)));                       \
        (h)[0] ^= fault_mask ^ (test_mask);                                                    \
    } while (0)

#define ROUNDS_ONE(r) ROUNDV(r, block, a, b, c, d)
#define ROUNDS_TWO(r)                                                                          \
    do {                                                                                       \
        ROUNDV(r, ba, xa, xb, xc, xd);                                                         \
        ROUNDV(r, bb, ya, yb, yc, yd);                                                         \
    } while (0)
#define TWELVE(R) R(0); R(1); R(2); R(3); R(4); R(5); R(6); R(7); R(8); R(9); R(10); R(11)

/* compress_v_SUF (one block) and compress_vv_SUF (two independent blocks, each exactly as
 * compress_v), compiled for ATTR's instruction set. */
#define ROWS_COMPRESSIONS(SUF, ATTR)                                                           \
    ATTR static inline void compress_v_##SUF(uint64_t h[8], const uint8_t block[128],          \
                                             uint64_t t, int last) {                           \
        ROWS_INIT(h, t, last, h0, h1, a, b, c, d);                                             \
        TWELVE(ROUNDS_ONE);                                                                    \
        ROWS_FINISH(h, h0, h1, a, b, c, d, vec_fault_mask);                                    \
    }                                                                                          \
    ATTR static inline void compress_vv_##SUF(uint64_t ha[8], const uint8_t ba[128],           \
                                              uint64_t ta, int la, uint64_t hb[8],             \
                                              const uint8_t bb[128], uint64_t tb, int lb) {    \
        ROWS_INIT(ha, ta, la, ha0, ha1, xa, xb, xc, xd);                                       \
        ROWS_INIT(hb, tb, lb, hb0, hb1, ya, yb, yc, yd);                                       \
        TWELVE(ROUNDS_TWO);                                                                    \
        ROWS_FINISH(ha, ha0, ha1, xa, xb, xc, xd, 0);                                          \
        ROWS_FINISH(hb, hb0, hb1, ya, yb, yc, yd, lane_fault_mask);                            \
    }

/* the rows for AVX2 */
#define VROT32(x) _mm256_shuffle_epi32((x), _MM_SHUFFLE(2, 3, 0, 1))
#define VROT24(x)                                                                              \
    _mm256_shuffle_epi8((x), _mm256_setr_epi8(3, 4, 5, 6, 7, 0, 1, 2, 11, 12, 13, 14, 15, 8,   \
                                              9, 10, 3, 4, 5, 6, 7, 0, 1, 2, 11, 12, 13, 14,   \
                                              15, 8, 9, 10))
#define VROT16(x)                                                                              \
    _mm256_shuffle_epi8((x), _mm256_setr_epi8(2, 3, 4, 5, 6, 7, 0, 1, 10, 11, 12, 13, 14, 15,  \
                                              8, 9, 2, 3, 4, 5, 6, 7, 0, 1, 10, 11, 12, 13,    \
                                              14, 15, 8, 9))
#define VROT63(x) VXOR(_mm256_srli_epi64((x), 63), VADD((x), (x)))
ROWS_COMPRESSIONS(avx2, LANES_ATTR)
#undef VROT32
#undef VROT24
#undef VROT16
#undef VROT63

/* the rows for AVX-512VL: the same 256-bit vectors, rotations by vprorq */
#define VROT32(x) _mm256_ror_epi64((x), 32)
#define VROT24(x) _mm256_ror_epi64((x), 24)
#define VROT16(x) _mm256_ror_epi64((x), 16)
#define VROT63(x) _mm256_ror_epi64((x), 63)
ROWS_COMPRESSIONS(avx512, ROWS512_ATTR)

/* one compression at vec_level (blake2b's, for the tests of every level on any message) */
static void compress_at_level(uint64_t h[8], const uint8_t block[128], uint64_t t, int last) {
    if (vec_level == 2)
        compress_v_avx512(h, block, t, last);
    else if (vec_level == 1)
        compress_v_avx2(h, block, t, last);
    else
        compress(h, block, t, last);
}
#else
#define CHASH_LANES 0
static const int lanes_on = 0;  /* no vector path: chain_pair hashes one chain after the other */
static const int vec_level = 0; /* no vector path: chain_run uses compress */
#define compress_at_level compress
#endif

/* RFC 7693 3.3: unkeyed BLAKE2b of len bytes into h (digest = h's first outlen LE bytes),
 * each block compressed at vec_level.
 * Every block but the last is compressed with last = 0; the last (zero-padded; an empty
 * message is one zero block) with t = len and last = 1. */
static void blake2b_words(uint64_t h[8], const uint8_t *data, size_t len, unsigned outlen) {
    for (int i = 0; i < 8; i++) h[i] = IV[i];
    h[0] ^= 0x01010000ULL ^ (uint64_t)outlen;
    size_t off = 0;
    while (len - off > 128) {
        compress_at_level(h, data + off, (uint64_t)(off + 128), 0);
        off += 128;
    }
    uint8_t block[128];
    memset(block, 0, sizeof block);
    memcpy(block, data + off, len - off);
    compress_at_level(h, block, (uint64_t)len, 1);
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

/* Whether a buffer format is one native 8-byte signed integer ("q", "l" where long has 8 bytes,
 * either with "@" or "=" in front, or "<" on a little-endian machine). */
static int int64_format(const char *f) {
    if (f == NULL) return 0;
    if (*f == '@' || *f == '=') f++;
#if PY_LITTLE_ENDIAN
    else if (*f == '<') f++;
#endif
    return (f[0] == 'q' || (f[0] == 'l' && sizeof(long) == 8)) && f[1] == '\0';
}

/* tokens' items as int64 into dst: little-endian (native = 0, the hashed encoding) or in the
 * machine's order (native = 1, array('q')'s bytes). 0, or -1 with an exception set. */
static int pack_items(PyObject *const *items, Py_ssize_t count, uint8_t *dst, int native) {
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t v;
        if (token_value(items[i], &v) < 0) return -1;
        if (native)
            memcpy(dst + 8 * i, &v, 8);
        else
            store64(dst + 8 * i, (uint64_t)v);
    }
    return 0;
}

/* The little-endian int64 encoding of tokens[start:start + count], read by the chains:
 * tokens_open sets raw (0, or -1 with an exception set), tokens_close releases it. A list or
 * tuple of ints is converted into a new buffer; a buffer of native int64 is read where it lies
 * on a little-endian machine (the view held until tokens_close: the exporter cannot resize
 * it, and no Python code runs in between), converted otherwise. */
typedef struct {
    const uint8_t *raw;
    uint8_t *owned;
    Py_buffer view;
    int buffered;
} tokens_in;

static void tokens_close(tokens_in *t) {
    PyMem_Free(t->owned);
    t->owned = NULL;
    if (t->buffered) PyBuffer_Release(&t->view);
    t->buffered = 0;
}

static int tokens_open(tokens_in *t, PyObject *tokens, Py_ssize_t start, Py_ssize_t count) {
    Py_ssize_t n;
    t->raw = NULL;
    t->owned = NULL;
    t->buffered = 0;
    if (PyList_CheckExact(tokens) || PyTuple_CheckExact(tokens)) {
        n = PySequence_Fast_GET_SIZE(tokens);
    } else if (PyObject_CheckBuffer(tokens)) {
        if (PyObject_GetBuffer(tokens, &t->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
            return -1;
        t->buffered = 1;
        if (t->view.itemsize != 8 || !int64_format(t->view.format)) {
            tokens_close(t);
            PyErr_SetString(PyExc_TypeError, "a token buffer must hold native int64");
            return -1;
        }
        n = t->view.len / 8;
    } else {
        PyErr_SetString(PyExc_TypeError, "tokens must be a list, a tuple or an int64 buffer");
        return -1;
    }
    if (start < 0 || count < 0 || count > n - start || count > PY_SSIZE_T_MAX / 8 - 1) {
        tokens_close(t);
        PyErr_SetString(PyExc_ValueError, "fewer tokens than chunks * grid");
        return -1;
    }
#if PY_LITTLE_ENDIAN
    if (t->buffered) {
        t->raw = (const uint8_t *)t->view.buf + 8 * (size_t)start;
        return 0;
    }
#endif
    t->owned = PyMem_Malloc(8 * (size_t)count + 1);
    if (t->owned == NULL) {
        tokens_close(t);
        PyErr_NoMemory();
        return -1;
    }
    if (t->buffered) { /* a big-endian machine: its int64s in the hashed byte order */
        const uint8_t *src = (const uint8_t *)t->view.buf + 8 * (size_t)start;
        for (Py_ssize_t i = 0; i < count; i++) {
            int64_t v;
            memcpy(&v, src + 8 * i, 8);
            store64(t->owned + 8 * i, (uint64_t)v);
        }
    } else if (pack_items(PySequence_Fast_ITEMS(tokens) + start, count, t->owned, 0) < 0) {
        tokens_close(t);
        return -1;
    }
    t->raw = t->owned;
    return 0;
}

/* pack(tokens) -> bytes: every token of a list or tuple of exact ints as native int64, the
 * contents of array('q', tokens). */
static PyObject *py_pack(PyObject *self, PyObject *tokens) {
    if (!PyList_CheckExact(tokens) && !PyTuple_CheckExact(tokens)) {
        PyErr_SetString(PyExc_TypeError, "tokens must be a list or tuple");
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(tokens);
    if (n > PY_SSIZE_T_MAX / 8) return PyErr_NoMemory();
    PyObject *out = PyBytes_FromStringAndSize(NULL, 8 * n);
    if (out == NULL) return NULL;
    if (pack_items(PySequence_Fast_ITEMS(tokens), n, (uint8_t *)PyBytes_AS_STRING(out), 1) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* One chain being hashed: the message buffer of its current chunk and where in it the next
 * compression starts. chain_init sets it up (validating the fields), chain_block hands out the
 * next block, chain_done takes the digest of a finished message (the key, then the next chunk's
 * message). Both paths below, one chain at a time (scalar) or two in the lanes of one vector,
 * step through the same blocks with the same counters. */
typedef struct {
    const uint8_t *raw;
    uint8_t *msg;
    size_t width, len, off;
    Py_ssize_t chunks, c;
    unsigned long long parent;
    PyObject *keys;
    uint64_t h[8];
    uint8_t last[128]; /* the zero-padded last block of the current message */
} chain_state;

static void chain_free(chain_state *s) {
    PyMem_Free(s->msg);
    s->msg = NULL;
    Py_CLEAR(s->keys);
}

static inline void chain_start_message(chain_state *s) {
    store64(s->msg + 1, (uint64_t)s->parent);
    memcpy(s->msg + 13, s->raw + (size_t)s->c * s->width, s->width);
    for (int i = 0; i < 8; i++) s->h[i] = IV[i];
    s->h[0] ^= 0x01010000ULL ^ 8ULL; /* RFC 7693 parameter block: 8-byte digest, no key */
    s->off = 0;
}

/* 0 on success (s->keys a new list of `chunks` slots; chain_free releases it), -1 with an
 * exception set. */
static int chain_init(chain_state *s, int kind, const uint8_t *raw, Py_ssize_t grid,
                      Py_ssize_t chunks, const Py_buffer *tail, unsigned long long parent) {
    s->msg = NULL;
    s->keys = NULL;
    if (kind < 0 || kind > 255 || grid < 1 || grid > (Py_ssize_t)UINT32_MAX || chunks < 0 ||
        grid > (PY_SSIZE_T_MAX - 13 - tail->len) / 8) {
        PyErr_SetString(PyExc_ValueError, "kind, grid or chunks out of range");
        return -1;
    }
    s->keys = PyList_New(chunks);
    if (s->keys == NULL) return -1;
    s->raw = raw;
    s->chunks = chunks;
    s->c = 0;
    s->parent = parent;
    if (chunks == 0) return 0; /* no message buffer for a grid longer than tokens */
    s->width = 8 * (size_t)grid;
    s->len = 13 + s->width + (size_t)tail->len;
    s->msg = PyMem_Malloc(s->len);
    if (s->msg == NULL) {
        Py_CLEAR(s->keys);
        PyErr_NoMemory();
        return -1;
    }
    s->msg[0] = (uint8_t)kind;
    for (int i = 0; i < 4; i++) s->msg[9 + i] = (uint8_t)((uint64_t)grid >> (8 * i));
    memcpy(s->msg + 13 + s->width, tail->buf, (size_t)tail->len);
    chain_start_message(s);
    return 0;
}

/* The next block of the current message (RFC 7693 3.3, as blake2b_words): *t = bytes so far,
 * *last = whether it is the message's last block (zero-padded). */
static inline const uint8_t *chain_block(chain_state *s, uint64_t *t, int *last) {
    if (s->len - s->off > 128) {
        const uint8_t *b = s->msg + s->off;
        s->off += 128;
        *t = (uint64_t)s->off;
        *last = 0;
        return b;
    }
    memset(s->last, 0, sizeof s->last);
    memcpy(s->last, s->msg + s->off, s->len - s->off);
    *t = (uint64_t)s->len;
    *last = 1;
    return s->last;
}

/* After the last block: the key (digest bytes = h[0] little-endian, read big-endian; 0 becomes
 * 1) into the list, and the next chunk's message. 0 = more chunks, 1 = chain finished, -1 =
 * error (exception set). */
static inline int chain_done(chain_state *s) {
    uint64_t key = 0;
    for (int i = 0; i < 8; i++) key = key << 8 | ((s->h[0] >> (8 * i)) & 0xFF);
    if (key == 0) key = 1;
    PyObject *k = PyLong_FromUnsignedLongLong(key);
    if (k == NULL) return -1;
    PyList_SET_ITEM(s->keys, s->c, k);
    s->parent = key;
    if (++s->c == s->chunks) return 1;
    chain_start_message(s);
    return 0;
}

#if CHASH_LANES
/* chain_run_v_SUF (chain_run with compress_v_SUF) and chain_run_two_v_SUF (chain_run_two with
 * compress_vv_SUF, the rest of the longer chain with compress_v_SUF), compiled for ATTR's
 * instruction set so the compressions are inlined. */
#define ROWS_CHAINS(SUF, ATTR)                                                                 \
    ATTR static int chain_run_v_##SUF(chain_state *s) {                                        \
        while (s->c < s->chunks) {                                                             \
            uint64_t t;                                                                        \
            int last;                                                                          \
            const uint8_t *b = chain_block(s, &t, &last);                                      \
            compress_v_##SUF(s->h, b, t, last);                                                \
            if (last && chain_done(s) < 0) return -1;                                          \
        }                                                                                      \
        return 0;                                                                              \
    }                                                                                          \
    ATTR static int chain_run_two_v_##SUF(chain_state *a, chain_state *b) {                    \
        while (a->c < a->chunks && b->c < b->chunks) {                                         \
            uint64_t ta, tb;                                                                   \
            int la, lb;                                                                        \
            const uint8_t *ba = chain_block(a, &ta, &la), *bb = chain_block(b, &tb, &lb);      \
            compress_vv_##SUF(a->h, ba, ta, la, b->h, bb, tb, lb);                             \
            if (la && chain_done(a) < 0) return -1;                                            \
            if (lb && chain_done(b) < 0) return -1;                                            \
        }                                                                                      \
        if (chain_run_v_##SUF(a) < 0) return -1;                                               \
        return chain_run_v_##SUF(b);                                                           \
    }

ROWS_CHAINS(avx2, LANES_ATTR)
ROWS_CHAINS(avx512, ROWS512_ATTR)
#endif

/* The rest of one chain, one compression at a time: compress (the definition), or compress_v
 * at vec_level. 0 or -1. */
static int chain_run(chain_state *s) {
#if CHASH_LANES
    if (vec_level == 2) return chain_run_v_avx512(s);
    if (vec_level == 1) return chain_run_v_avx2(s);
#endif
    while (s->c < s->chunks) {
        uint64_t t;
        int last;
        const uint8_t *b = chain_block(s, &t, &last);
        compress(s->h, b, t, last);
        if (last && chain_done(s) < 0) return -1;
    }
    return 0;
}

#if CHASH_LANES
/* Two chains at once: while both have blocks left, one compress_vv per pair of blocks (each
 * message exactly compress's arithmetic), then the rest of the longer one with compress_v
 * (without rows, vec_level 0: one chain after the other with compress). */
static int chain_run_two(chain_state *a, chain_state *b) {
    if (vec_level == 2) return chain_run_two_v_avx512(a, b);
    if (vec_level == 1) return chain_run_two_v_avx2(a, b);
    if (chain_run(a) < 0) return -1;
    return chain_run(b);
}
#endif

/* The keys of `chunks` grid-token chunks of the packed tokens raw, chained from parent, as a
 * new list (NULL with an exception set). */
static PyObject *chain_packed(int kind, const uint8_t *raw, Py_ssize_t grid, Py_ssize_t chunks,
                              const Py_buffer *tail, unsigned long long parent) {
    chain_state s;
    if (chain_init(&s, kind, raw, grid, chunks, tail, parent) < 0) return NULL;
    PyObject *keys = NULL;
    if (chain_run(&s) == 0) {
        keys = s.keys;
        s.keys = NULL;
    }
    chain_free(&s);
    return keys;
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
    tokens_in t;
    if (tokens_open(&t, tokens, start, grid * chunks) < 0) goto done;
    result = chain_packed(kind, t.raw, grid, chunks, &tail, parent);
    tokens_close(&t);
done:
    PyBuffer_Release(&tail);
    return result;
}

/* chain_pair(tokens, kind_a, grid_a, chunks_a, kind_b, grid_b, chunks_b, tail): both chains
 * from 0 over the same tokens, converted once: (keys_a, keys_b). */
static PyObject *py_chain_pair(PyObject *self, PyObject *args) {
    int ka, kb;
    PyObject *tokens, *result = NULL;
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
    tokens_in t;
    if (tokens_open(&t, tokens, 0, used) < 0) goto done;
    chain_state sa, sb;
    if (chain_init(&sa, ka, t.raw, ga, ca, &tail, 0) == 0) {
        if (chain_init(&sb, kb, t.raw, gb, cb, &tail, 0) == 0) {
            int rc;
#if CHASH_LANES
            if (lanes_on)
                rc = chain_run_two(&sa, &sb);
            else
#endif
                rc = chain_run(&sa) < 0 ? -1 : chain_run(&sb);
            if (rc == 0) result = PyTuple_Pack(2, sa.keys, sb.keys);
            chain_free(&sb);
        }
        chain_free(&sa);
    }
    tokens_close(&t);
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

#if CHASH_LANES
/* the best vec_level this CPU has (libgcc's cpu model checks the OS saves the registers) */
static int cpu_vec_level(void) {
    if (!__builtin_cpu_supports("avx2")) return 0;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) return 2;
    return 1;
}
#endif

/* _set_lanes(on) -> whether chain_pair now runs its two chains side by side (compress_vv): tests
 * compare both paths (on is refused, returning False, where the CPU or the build has no
 * AVX2). */
static PyObject *py_set_lanes(PyObject *self, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
#if CHASH_LANES
    lanes_on = on && cpu_vec_level() > 0;
    return PyBool_FromLong(lanes_on);
#else
    Py_RETURN_FALSE;
#endif
}

static PyObject *py_set_lane_fault(PyObject *self, PyObject *arg) {
    unsigned long long mask = PyLong_AsUnsignedLongLong(arg);
    if (mask == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
#if CHASH_LANES
    lane_fault_mask = mask;
#endif
    Py_RETURN_NONE;
}

/* _set_vector(level) -> the level now used by the compressions: 0 = compress (the definition),
 * 1 = AVX2 rows, 2 = AVX-512VL rows; a level the CPU or the build lacks gives the best one
 * below it. _set_vector_fault(mask): tests only, XORed into h[0] by every compress_v (0 =
 * none). */
static PyObject *py_set_vector(PyObject *self, PyObject *arg) {
    long level = PyLong_AsLong(arg);
    if (level == -1 && PyErr_Occurred()) return NULL;
    if (level < 0 || level > 2) return PyErr_Format(PyExc_ValueError, "level must be 0..2");
#if CHASH_LANES
    int best = cpu_vec_level();
    vec_level = (int)level < best ? (int)level : best;
    return PyLong_FromLong(vec_level);
#else
    return PyLong_FromLong(0);
#endif
}

static PyObject *py_set_vector_fault(PyObject *self, PyObject *arg) {
    unsigned long long mask = PyLong_AsUnsignedLongLong(arg);
    if (mask == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
#if CHASH_LANES
    vec_fault_mask = mask;
#endif
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"chain", py_chain, METH_VARARGS,
     "chain(kind, tokens, start, grid, chunks, tail, parent) -> list of chained keys"},
    {"chain_pair", py_chain_pair, METH_VARARGS,
     "chain_pair(tokens, kind_a, grid_a, chunks_a, kind_b, grid_b, chunks_b, tail) -> (a, b)"},
    {"blake2b", py_blake2b, METH_VARARGS, "blake2b(data, digest_size) -> digest bytes"},
    {"pack", py_pack, METH_O, "pack(tokens) -> the tokens as native int64 bytes"},
    {"_set_fault", py_set_fault, METH_O, "tests only: XOR a mask into every compression"},
    {"_set_lanes", py_set_lanes, METH_O,
     "tests only: chain_pair's two chains side by side on/off -> on"},
    {"_set_lane_fault", py_set_lane_fault, METH_O,
     "tests only: XOR a mask into the second message of every two-message compression"},
    {"_set_vector", py_set_vector, METH_O,
     "tests only: the compressions' vector level 0..2 -> the level granted"},
    {"_set_vector_fault", py_set_vector_fault, METH_O,
     "tests only: XOR a mask into every one-message vector compression"},
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
#if CHASH_LANES
    __builtin_cpu_init();
    vec_level = cpu_vec_level();
    lanes_on = vec_level > 0;
#endif
    if (PyModule_AddIntConstant(m, "API_VERSION", CHASH_API_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "LANES", lanes_on) < 0 ||
        PyModule_AddIntConstant(m, "VECTOR", vec_level) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
