"""Cases from a seed or a file, and the CLI's input validation (no engine starts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from continuation_checks.cases import (
    EDGE_SHAPES,
    Case,
    check_case,
    edge_lengths,
    load_cases,
    make_cases,
    make_edge_cases,
)
from hybridmem.cli.main import main
from hybridmem.errors import HybridMemError

GRID, VOCAB, LIMIT = 128, 512, 1024


def test_seeded_cases_are_deterministic_and_valid():
    a = make_cases(64, 3, VOCAB, GRID, LIMIT)
    assert a == make_cases(64, 3, VOCAB, GRID, LIMIT)
    assert a != make_cases(64, 4, VOCAB, GRID, LIMIT)
    assert len(a) == 64 and [c.case for c in a] == list(range(64))
    for c in a:
        check_case(c, GRID, VOCAB, LIMIT)
    # several boundaries per prompt, and families share a prefix
    per_prompt: dict[tuple[int, ...], set[int]] = {}
    for c in a:
        per_prompt.setdefault(c.prompt, set()).add(c.boundary)
    assert max(len(b) for b in per_prompt.values()) >= 2
    fam0 = [c.prompt for c in a if c.family == 0]
    assert len({p for p in fam0}) >= 2 and len(fam0) >= 2


def test_edge_cases_sit_on_exact_block_boundaries():
    a = make_edge_cases(64, 3, VOCAB, GRID, LIMIT)
    assert a == make_edge_cases(64, 3, VOCAB, GRID, LIMIT)
    assert len(a) == 64 and [c.case for c in a] == list(range(64))
    shapes = set()
    for c in a:
        check_case(c, GRID, VOCAB, LIMIT)
        (shape,) = [k for k, n in edge_lengths(c.boundary, GRID).items() if n == c.prompt_len]
        shapes.add((c.boundary, shape))
    # every boundary the limit allows, in each shape that fits: at L - 1, a block multiple, and
    # mid-block (LIMIT - 16 = 1008 leaves out only b = 896 with L = 1024)
    want = {(b, k) for b in range(GRID, 1008, GRID) for k in EDGE_SHAPES
            if edge_lengths(b, GRID)[k] <= 1008}
    assert shapes == want and len(want) == 7 * 3 - 1
    assert {c.prompt_len % GRID for c in a} == {1, 0, GRID // 2}
    # negative control: the random-length generator puts almost no case on these edges
    seeded = make_cases(64, 3, VOCAB, GRID, LIMIT)
    on_edge = [c for c in seeded if c.prompt_len - c.boundary in (1, GRID, GRID // 2)]
    assert len(on_edge) < len(seeded) // 4


@pytest.mark.parametrize(("case", "match"), [
    (Case(0, 0, tuple(range(16, 216)), 100, 4), "not a positive multiple"),
    (Case(0, 0, tuple(range(16, 144)), 128, 4), r"boundary 128 > prompt length 128 - 1"),
    (Case(0, 0, tuple(range(16, 216)), 128, 0), "max_tokens must be >= 1"),
    (Case(0, 0, tuple([20] * 1020), 128, 8), "exceeds the model limit 1024"),
    (Case(0, 0, tuple([20] * 199 + [600]), 128, 4), "token id 600 outside"),
])
def test_check_case_names_the_bad_value(case: Case, match: str):
    with pytest.raises(HybridMemError, match=match):
        check_case(case, GRID, VOCAB, LIMIT)


def test_cases_file_round_trip_and_errors(tmp_path: Path):
    f = tmp_path / "cases.jsonl"
    f.write_text(json.dumps({"prompt": [20] * 200, "boundary": 128, "max_tokens": 3}) + "\n\n")
    (c,) = load_cases(f)
    assert (c.boundary, c.max_tokens, c.prompt_len) == (128, 3, 200)
    f.write_text('{"prompt": [1, 2]}\n')
    with pytest.raises(HybridMemError, match=r"cases.jsonl:1: not a case \(KeyError"):
        load_cases(f)
    f.write_text("")
    with pytest.raises(HybridMemError, match="no cases"):
        load_cases(f)


@pytest.mark.parametrize(("args", "needle"), [
    (["--org", "Q9"], "--org 'Q9': not one of"),
    (["--org", "vllm", "--budget", "b40"],
     "--budget needs an organization (--org S0|S1|S2|D0), not --org vllm"),
    (["--org", "vllm", "--attention-fraction", "0.5"],
     "--attention-fraction needs an organization"),
    (["--org", "S2", "--budget", "bx"], "bad budget 'bx'"),
    (["--org", "D0", "--attention-fraction", "1.5"], "1.5 is outside [0.001, 0.999]"),
    (["--org", "D0", "--attention-fraction", "nan"], "'nan' is not finite"),
    (["--dtype", "float16"], "--dtype 'float16': not one of float32, bfloat16"),
    (["--cases", "0"], "--cases 0: must lie in [1, 4096]"),
    (["--cases", "100000"], "--cases 100000: must lie in"),
    (["--seed", "-1"], "--seed -1: must be >= 0"),
    (["--max-tokens", "0"], "--max-tokens 0: must lie in [1, 256]"),
    (["--org", "vllm", "--fault", "swap-members"], "--fault swap-members: an organization's "
     "fault"),
    (["--org", "S2", "--fault", "stale"], "--fault 'stale': not one of corrupt-checkpoint, "
     "fresh-slot, boundary-shift, stale-checkpoint, swap-members, skip-invalidate"),
    (["--org", "S2", "--fault", "boundary-shift"], "--fault boundary-shift: a fault of the "
     "stock path; it needs --org vllm"),
    (["--fault", "bogus"], "--fault 'bogus': not one of"),
    (["--cases-file", "/nonexistent/cases.jsonl"], "does not exist"),
    (["--cases-file", "/dev/zero"], "is not a regular file (a device or pipe could be endless)"),
    (["--edges", "--cases-file", "/dev/zero"], "--edges makes the seeded cases"),
    (["--cases", "ten"], "invalid int value: 'ten'"),
])
def test_cli_bad_inputs_exit_2_with_one_line(args: list[str], needle: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]):
    code = exc_code(["continuation", "--out", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "o").exists()  # validated before any work


def test_cli_out_must_not_be_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    f = tmp_path / "file"
    f.write_text("keep me")
    assert exc_code(["continuation", "--out", str(f)]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
    assert f.read_text() == "keep me"


def exc_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse type errors exit from inside the parser
        return int(e.code or 0)
