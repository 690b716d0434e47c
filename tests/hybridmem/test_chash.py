"""The compiled key chains (hybridmem/_chash.c) give the Python path's keys byte for byte, and the
Python path still runs without them (not built, stale build, HYBRIDMEM_HASH_PURE)."""

import hashlib
import os
import random
import struct
import subprocess
import sys
import types
from array import array
from pathlib import Path

import pytest

from hybridmem import hashing
from hybridmem.events import StateKind
from hybridmem.hashing import extra_keys, hash_chain, hash_chain_pair
from hybridmem.names import ENV_HASH_PURE

A, R = StateKind.ATTENTION, StateKind.RECURRENT
ROOT = Path(__file__).resolve().parents[2]

chash = pytest.importorskip("hybridmem._chash", reason="extension not built (optional)")

# RFC 7693 Appendix A: BLAKE2b-512 of the three bytes "abc"
RFC_ABC_512 = ("ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d1"
               "7d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923")


def _reference_chain(kind, tokens, grid, extra=(), parent=0, start=0):
    """The per-chunk encoding of hashing.chunk_hash, with hashlib (SPEC §5)."""
    keys = []
    for lo in range(start, len(tokens) - grid + 1, grid):
        keys.append(parent := hashing.chunk_hash(kind, parent, tokens[lo:lo + grid], extra))
    return keys


@pytest.fixture
def compiled_path(monkeypatch):
    """hashing on the compiled path, whatever HYBRIDMEM_HASH_PURE said at import."""
    monkeypatch.setattr(hashing, "_compiled", chash.chain)
    monkeypatch.setattr(hashing, "_compiled_pair", chash.chain_pair)


@pytest.fixture
def python_path(monkeypatch):
    """hashing with the compiled path switched off, as when the extension is missing."""
    monkeypatch.setattr(hashing, "_compiled", None)


def test_blake2b_rfc7693_vector_and_hashlib():
    assert chash.blake2b(b"abc", 64).hex() == RFC_ABC_512
    rng = random.Random(7693)
    # every length around the 128-byte block boundaries, empty included, and longer messages
    lengths = list(range(0, 300)) + [383, 384, 385, 1023, 1024, 4109, 4113, 65_536]
    for n in lengths:
        data = rng.randbytes(n)
        for size in (8, 64, 1, 33):
            assert chash.blake2b(data, size) == hashlib.blake2b(data, digest_size=size).digest()
    with pytest.raises(ValueError, match="digest_size must be 1..64, got 65"):
        chash.blake2b(b"", 65)


EDGES = [0, 1, -1, 2**30 - 1, 2**30, -(2**30), 2**60 - 1, 2**60, -(2**60) + 1, -(2**60),
         2**63 - 1, -(2**63), 255, 256, -5, -6]  # one, two and three 30-bit digits, both signs


def _cases(rng):
    extras = [(), extra_keys("alice"), ("cache_salt", "ü"), (7, b"\x00raw", -3), ("x" * 300,)]
    yield A, EDGES * 8, 2, (), 0, 0
    yield R, EDGES * 8, 16, (), 0, 16
    for grid in [1, 2, 3, 16, 17, 48, 64, 512, 1000, 1024, *rng.sample(range(1, 1025), 8)]:
        for _ in range(12):
            start = rng.randrange(0, 4) * grid
            n = rng.choice([0, 1, grid - 1, start + grid, start + rng.randrange(0, 8 * grid + 2),
                            start + rng.randrange(0, 8 * grid + 2)])
            tokens = [rng.randrange(-2**63, 2**63) if rng.random() < 0.3
                      else rng.randrange(0, 50_000) for _ in range(n)]
            parent = rng.choice([0, 1, 2**64 - 1, rng.randrange(2**64)])
            yield rng.choice([A, R]), tokens, grid, rng.choice(extras), parent, start


def test_compiled_chain_equals_python_and_per_chunk_encoding(compiled_path, monkeypatch):
    cases = list(_cases(random.Random(20261201)))
    compiled = [hash_chain(*c) for c in cases]
    assert sum(map(len, compiled)) > 250 and any(not k for k in compiled)  # not vacuous
    assert [hash_chain(k, tuple(t), g, e, p, s) for k, t, g, e, p, s in cases] == compiled
    monkeypatch.setattr(hashing, "_compiled", None)
    assert [hash_chain(*c) for c in cases] == compiled
    assert [_reference_chain(*c) for c in cases] == compiled


def test_compiled_pair_equals_python_pair(compiled_path, monkeypatch):
    rng = random.Random(5)
    cases = [([rng.randrange(0, 2**40) for _ in range(rng.randrange(0, 5000))],
              rng.choice([16, 512, 64]), rng.choice([512, 1792, 16]),
              rng.choice([(), extra_keys("bob")])) for _ in range(40)]
    compiled = [hash_chain_pair(*c) for c in cases]
    monkeypatch.setattr(hashing, "_compiled", None)
    assert [hash_chain_pair(*c) for c in cases] == compiled
    assert compiled == [(_reference_chain(A, t, ga, e), _reference_chain(R, t, gr, e))
                        for t, ga, gr, e in cases]


def test_a_grid_longer_than_the_tokens_hashes_nothing(compiled_path):
    tail = hashing._encode_extra(())
    assert chash.chain_pair(list(range(40)), 1, 16, 2, 2, 2**32 - 1, 0, tail)[1] == []
    assert hash_chain_pair(list(range(40)), 16, 2**32 - 1)[1] == []


def test_negative_control_one_bit_fault_in_compression_changes_every_key(python_path):
    tokens = list(range(1, 4097))
    want = hash_chain(A, tokens, 16, extra_keys("s"))  # Python path (fixture)
    chain = chash.chain
    tail = hashing._encode_extra(tuple(extra_keys("s")))
    assert chain(int(A), tokens, 0, 16, 256, tail, 0) == want
    chash._set_fault(1 << 17)  # one bit of h[0], after every compression
    try:
        faulty = chain(int(A), tokens, 0, 16, 256, tail, 0)
        assert chash.blake2b(b"abc", 64).hex() != RFC_ABC_512
    finally:
        chash._set_fault(0)
    assert len(faulty) == 256 and all(f != w for f, w in zip(faulty, want, strict=True))
    assert chain(int(A), tokens, 0, 16, 256, tail, 0) == want  # fault removed


@pytest.fixture
def lanes():
    """chain_pair's two chains side by side (compress_vv) switchable; skipped where the CPU has
    no AVX2; the import-time settings restored after."""
    initial, level = bool(chash.LANES), chash.VECTOR
    if not chash._set_lanes(True):
        pytest.skip("no vector compression here (needs x86-64 with AVX2)")
    yield chash._set_lanes
    chash._set_lanes(initial)
    chash._set_vector(level)
    chash._set_lane_fault(0)
    chash._set_vector_fault(0)


def _levels():
    """The vector levels this CPU has (1: AVX2 rows, 2: AVX-512VL rows), each tried."""
    return [level for level in (1, 2) if chash._set_vector(level) == level]


def _pair_cases(rng):
    """Random chain pairs whose messages end at every offset in their last block and whose
    chains end in either order: one-block messages (grids 1-14), two-block ones (15-30), the
    benchmark's 16 / 1,792, and long ones."""
    tails = [hashing._encode_extra(()), hashing._encode_extra(tuple(extra_keys("z"))),
             hashing._encode_extra(("x" * 200,))]
    for _ in range(150):
        ga = rng.choice([*range(1, 31), 16, 16, 64, 512])
        gb = rng.choice([*range(1, 31), 1792, 1792, 200, 513])
        n = rng.randrange(0, 6000)
        tokens = [rng.randrange(-2**63, 2**63) for _ in range(n)]
        yield (tokens, rng.randrange(256), ga, n // ga, rng.randrange(256), gb, n // gb,
               rng.choice(tails))


def test_two_chains_side_by_side_give_the_one_at_a_time_keys(lanes):
    cases = list(_pair_cases(random.Random(20261202)))
    assert chash.LANES in (0, 1) and chash.VECTOR in (0, 1, 2)
    levels = _levels()
    assert levels and levels[0] == 1 and chash._set_vector(0) == 0
    with pytest.raises(ValueError, match="level must be 0..2"):
        chash._set_vector(3)
    lanes(False)
    scalar = [chash.chain_pair(*c) for c in cases]  # compress only: the definition
    assert sum(len(a) + len(b) for a, b in scalar) > 50_000  # not vacuous
    for (tokens, ka, ga, ca, kb, gb, cb, tail), (a, b) in zip(cases, scalar, strict=True):
        assert (chash.chain(ka, tokens, 0, ga, ca, tail, 0),
                chash.chain(kb, tokens, 0, gb, cb, tail, 0)) == (a, b)  # single chains
    for level in levels:
        assert chash._set_vector(level) == level
        for on in (True, False):  # compress_vv + compress_v, compress_v one after the other
            lanes(on)
            assert [chash.chain_pair(*c) for c in cases] == scalar, (level, on)
    # D0's chains (16 and 1,792 tokens) against the per-chunk hashlib encoding
    rng = random.Random(3)
    tokens = [rng.randrange(0, 50_000) for _ in range(5000)]
    lanes(True)
    assert hash_chain_pair(tokens, 16, 1792, extra_keys("s")) == (
        _reference_chain(A, tokens, 16, extra_keys("s")),
        _reference_chain(R, tokens, 1792, extra_keys("s")))


def test_negative_control_a_fault_in_the_second_message_changes_the_second_chain(lanes):
    rng = random.Random(11)
    tokens = [rng.randrange(0, 50_000) for _ in range(4000)]
    tail = hashing._encode_extra(())
    args = (tokens, int(A), 16, 250, int(R), 1792, 2, tail)
    want = chash.chain_pair(*args)
    for level in _levels():
        lanes(True)
        chash._set_lane_fault(1 << 40)
        try:
            faulty = chash.chain_pair(*args)
            lanes(False)
            unaffected = chash.chain_pair(*args)  # one after the other: compress_vv does not run
        finally:
            chash._set_lane_fault(0)
        assert faulty[0] == want[0] and unaffected == want, level
        assert len(faulty[1]) == 2 and all(f != w for f, w in zip(faulty[1], want[1],
                                                                   strict=True)), level


def _raw_reference(kind, tokens, grid, chunks, tail, parent):
    """chain's keys from its definition with hashlib: <BQI head, <nq tokens, the raw tail."""
    keys = []
    for c in range(chunks):
        message = (struct.pack("<BQI", kind, parent, grid)
                   + struct.pack(f"<{grid}q", *tokens[c * grid:(c + 1) * grid]) + tail)
        parent = int.from_bytes(hashlib.blake2b(message, digest_size=8).digest(), "big") or 1
        keys.append(parent)
    return keys


def _vector_chain_cases(rng):
    """(kind, tokens, grid, chunks, tail, parent): chains of 0, 1, 2 and odd lengths whose
    messages are exactly 127, 128, 129, 255, 256, 257 or 384 bytes (13 + 8 grid + tail), and
    random grids, tails, kinds."""
    for length in (127, 128, 129, 255, 256, 257, 384):
        for grid in (1, 2, 14, (length - 13) // 8):
            tail = rng.randbytes(length - 13 - 8 * grid)
            for chunks in (0, 1, 2, 3, 7):
                tokens = [rng.randrange(-2**63, 2**63) for _ in range(grid * chunks)]
                yield rng.randrange(256), tokens, grid, chunks, tail, rng.randrange(2**64)
    for _ in range(120):
        grid = rng.choice([1, 2, 3, 15, 16, 17, 30, 31, 64, 200, 512, 1792])
        chunks = rng.choice([0, 1, 2, 3, 5, 9, rng.randrange(0, 40)])
        tail = rng.randbytes(rng.choice([0, 1, 4, 25, 115, 116, 128, 209, 300]))
        tokens = [rng.randrange(-2**63, 2**63) for _ in range(grid * chunks)]
        yield rng.randrange(256), tokens, grid, chunks, tail, rng.choice([0, 1, 2**64 - 1])


def test_vector_compressions_give_the_scalar_bytes(lanes):
    """compress_v at each level against compress and hashlib: blake2b (which compresses at the
    level set) on every length around the block boundaries, and chains of 0, 1 and odd lengths
    with messages of exactly 128, 129, 256 bytes."""
    rng = random.Random(20261203)
    data = [rng.randbytes(n) for n in [*range(0, 300), 383, 384, 385, 1023, 1024, 4113, 65_536]]
    cases = list(_vector_chain_cases(rng))
    want = [_raw_reference(*c) for c in cases]
    assert sum(map(len, want)) > 800 and any(not k for k in want)  # not vacuous
    assert chash._set_vector(0) == 0
    assert [chash.chain(k, t, 0, g, c, tail, p) for k, t, g, c, tail, p in cases] == want
    for level in _levels():
        assert chash.blake2b(b"abc", 64).hex() == RFC_ABC_512, level
        for d in data:
            for size in (8, 64, 1):
                assert chash.blake2b(d, size) == hashlib.blake2b(d, digest_size=size).digest()
        got = [chash.chain(k, t, 0, g, c, tail, p) for k, t, g, c, tail, p in cases]
        assert got == want, level


def test_negative_control_a_fault_in_the_vector_compression_changes_every_key(lanes):
    rng = random.Random(12)
    tokens = [rng.randrange(0, 50_000) for _ in range(4096)]
    tail = hashing._encode_extra(())
    want = _raw_reference(int(A), tokens, 16, 256, tail, 0)
    for level in _levels():
        assert chash.chain(int(A), tokens, 0, 16, 256, tail, 0) == want
        chash._set_vector_fault(1 << 9)  # one bit of h[0], after every compress_v
        try:
            faulty = chash.chain(int(A), tokens, 0, 16, 256, tail, 0)
            faulty_abc = chash.blake2b(b"abc", 64).hex()
            chash._set_vector(0)
            scalar = chash.chain(int(A), tokens, 0, 16, 256, tail, 0)  # compress: untouched
        finally:
            chash._set_vector_fault(0)
        assert faulty_abc != RFC_ABC_512 and scalar == want, level
        assert len(faulty) == 256 and all(f != w for f, w in zip(faulty, want, strict=True))
        assert chash._set_vector(level) == level
        assert chash.chain(int(A), tokens, 0, 16, 256, tail, 0) == want  # fault removed


@pytest.mark.parametrize("tokens", [
    array("i", range(100)), [True, False] * 50, [A, R] * 8, range(40),  # not list/tuple of int
])
def test_inputs_the_compiled_path_refuses_get_the_python_keys(tokens, compiled_path,
                                                               monkeypatch):
    got = hash_chain(A, tokens, 4, ("k",), parent=3)
    pair = hash_chain_pair(tokens, 4, 8)
    monkeypatch.setattr(hashing, "_compiled", None)
    assert got == hash_chain(A, tokens, 4, ("k",), parent=3) == _reference_chain(
        A, list(tokens), 4, ("k",), 3)
    assert pair == hash_chain_pair(tokens, 4, 8)


def test_compiled_refuses_out_of_range_fields():
    tail = hashing._encode_extra(())
    for args, err in [((256, [1], 0, 1, 1, tail, 0), ValueError),
                      ((1, [1], 0, 1, 2, tail, 0), ValueError),      # fewer tokens than chunks
                      ((1, [1], 0, 1, 1, tail, 2**64), OverflowError),
                      ((1, [1], 0, 1, 1, tail, -1), OverflowError),
                      ((1, [2**63], 0, 1, 1, tail, 0), OverflowError),
                      ((1, [1.0], 0, 1, 1, tail, 0), TypeError),
                      ((1, array("i", [1]), 0, 1, 1, tail, 0), TypeError),   # 4-byte items
                      ((1, array("d", [1.0]), 0, 1, 1, tail, 0), TypeError),  # not integers
                      ((1, b"\0" * 8, 0, 1, 1, tail, 0), TypeError),          # bytes: format B
                      ((1, array("q", [1]), 0, 1, 2, tail, 0), ValueError)]:   # too few tokens
        with pytest.raises(err):
            chash.chain(*args)
    for tokens, err in [([1.0, 2], TypeError), ([1, 2**63], OverflowError), ([1], ValueError)]:
        with pytest.raises(err):
            chash.chain_pair(tokens, 1, 1, 2, 2, 2, 1, tail)


def test_int64_buffers_give_the_keys_of_the_same_list(compiled_path):
    """array('q') and NumPy int64 (format q and l) are read as one buffer: the same keys as the
    list, single chains from any start and pairs; the negative control shows the comparison
    sees a buffer read one token off (the slip a wrong start offset would make)."""
    np = pytest.importorskip("numpy")
    cases = list(_cases(random.Random(20261202)))
    assert sum(len(hash_chain(*c)) for c in cases) > 250  # not vacuous
    for kind, tokens, grid, extra, parent, start in cases:
        want = hash_chain(kind, tokens, grid, extra, parent, start)
        for buf in (array("q", tokens), np.array(tokens, dtype=np.int64),
                    np.array(tokens, dtype=np.longlong)):
            assert hash_chain(kind, buf, grid, extra, parent, start) == want
    rng = random.Random(9)
    for _ in range(20):
        tokens = [rng.randrange(0, 2**40) for _ in range(rng.randrange(0, 3000))]
        want_pair = hash_chain_pair(tokens, 16, 1792, extra_keys("s"))
        assert hash_chain_pair(array("q", tokens), 16, 1792, extra_keys("s")) == want_pair
    tokens = list(range(1, 4097))
    tail = hashing._encode_extra(())
    want = hash_chain(A, tokens, 16, start=16)[:200]
    assert chash.chain(int(A), array("q", tokens), 16, 16, 200, tail, 0) == want
    shifted = chash.chain(int(A), array("q", [0, *tokens]), 16, 16, 200, tail, 0)
    assert all(a != b for a, b in zip(shifted, want, strict=True))
    big_endian = np.array(tokens, dtype=">i8")  # format ">q": refused, the Python path decides
    with pytest.raises(TypeError, match="native int64"):
        chash.chain(int(A), big_endian, 0, 16, 2, tail, 0)
    assert hash_chain(A, big_endian, 16) == hash_chain(A, tokens, 16)


def test_token_array_is_array_q_of_the_tokens(monkeypatch):
    lists = [EDGES * 3, [], [5], list(range(10_000))]
    for tokens in lists:
        for seq in (tokens, tuple(tokens)):
            got = hashing.token_array(seq)
            assert type(got) is array and got.typecode == "q" and got == array("q", tokens)
    assert hashing.token_array([True, 2]) == array("q", [1, 2])  # bool: array decides
    assert hashing.token_array(range(3)) == array("q", [0, 1, 2])
    for bad, err in [([1, 2**63], OverflowError), ([1, "x"], TypeError), ([1.5], TypeError)]:
        with pytest.raises(err):
            hashing.token_array(bad)
    monkeypatch.setattr(hashing, "_compiled_pack", None)  # the Python path: the same arrays
    assert [hashing.token_array(t) for t in lists] == [array("q", t) for t in lists]
    # negative control: pack's bytes are native int64, so the other byte order differs
    swapped = array("q", chash.pack(EDGES))
    swapped.byteswap()
    assert swapped != array("q", EDGES)
    assert array("q", chash.pack(EDGES)) == array("q", EDGES)


def test_load_compiled_reasons(monkeypatch):
    if os.environ.get(ENV_HASH_PURE, "") in ("", "0"):  # the suite as it runs: compiled
        assert hashing.IMPLEMENTATION == "c" and hashing.UNAVAILABLE is None
    monkeypatch.setenv(ENV_HASH_PURE, "1")
    assert hashing.load_compiled() == (None, f"{ENV_HASH_PURE} is set")
    monkeypatch.setenv(ENV_HASH_PURE, "0")
    assert hashing.load_compiled()[0] is chash
    fn, why = hashing.load_compiled("hybridmem._no_such_extension")
    assert fn is None and "not importable" in why
    stale = types.ModuleType("hybridmem._stale_chash")
    stale.API_VERSION = 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hybridmem._stale_chash", stale)
    fn, why = hashing.load_compiled("hybridmem._stale_chash")
    assert fn is None and f"stale build (API 0, expected {hashing._CHASH_API})" in why


@pytest.mark.parametrize("how", ["env", "missing"])
def test_fresh_process_without_the_extension_gives_the_same_keys(how):
    code = ("import sys\n"
            + ("sys.modules['hybridmem._chash'] = None\n" if how == "missing" else "")
            + "from hybridmem import hashing\nfrom hybridmem.events import StateKind\n"
            "print(hashing.IMPLEMENTATION, hashing.UNAVAILABLE is not None)\n"
            "print(hashing.hash_chain(StateKind.RECURRENT, list(range(3000)), 16, ('a',))[-1])\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env[ENV_HASH_PURE] = "1" if how == "env" else ""
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[:2] == ["python", "True"]
    assert int(out[2]) == hash_chain(R, list(range(3000)), 16, ("a",))[-1]
