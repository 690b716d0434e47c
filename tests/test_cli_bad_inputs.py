"""Bad-input sweep over every subcommand: each case must exit 2 with exactly
one line on stderr and no traceback, in-process through ``hybridmem.cli.main.main``.

``vllm`` is made unimportable for the whole sweep, so a ``run``/``demo``/``model`` case that got
past validation would fail with "not installed" instead of starting an engine: the assertion
below refuses that message, so every case must be rejected before any engine import.

Rerun: ``PYTHONPATH=$PWD python -m pytest tests/test_cli_bad_inputs.py -q``.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import msgpack
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridmem.cli.main import main
from lineage.table import events_to_table
from tests.lineage.helpers import S2, adopt, enter, pub
from tests.tracer.helpers import every_kind, write_trace
from tracer import format as fmt

DEEP = "[" * 100_000 + "]" * 100_000
HUGE = "9" * 5000
EVENTS = [pub(1, 1), pub(2, 1, rec=True), enter("a", 2, [1], [2]), adopt("a", 4, 0)]

GOOD_CONFIG = {
    "model_type": "falcon_h1", "num_hidden_layers": 2, "hidden_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_state": 16, "mamba_n_groups": 1,
    "mamba_d_conv": 4, "torch_dtype": "bfloat16",
}


def _trace_with_meta(path: Path, meta: bytes) -> None:
    fixed = fmt.HEADER.pack(fmt.MAGIC, fmt.VERSION, 0, len(meta))
    path.write_bytes(fixed + meta + fmt.HEADER_CRC.pack(fmt.crc32(fixed, meta)))


def _summary(path: Path, text: str) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / "summary.json").write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("bad")
    f: dict[str, str] = {}
    # traces
    write_trace(d / "good.hmt", every_kind())
    f["trace"] = str(d / "good.hmt")
    raw = (d / "good.hmt").read_bytes()
    (d / "torn.hmt").write_bytes(raw[: len(raw) // 2])
    f["torn"] = str(d / "torn.hmt")
    (d / "empty.hmt").write_bytes(b"")
    f["empty"] = str(d / "empty.hmt")
    (d / "random.hmt").write_bytes(random.Random(0).randbytes(4096))
    f["random"] = str(d / "random.hmt")
    (d / "head16.hmt").write_bytes(raw[:16])
    f["head16"] = str(d / "head16.hmt")
    for name, meta in (("deep", DEEP.encode()), ("nan", b"NaN"), ("list", b"[1,2]"),
                       ("notjson", b"\xff\xfe"), ("deepobj", ('{"a":' * 50_000 + "1"
                                                              + "}" * 50_000).encode())):
        _trace_with_meta(d / f"meta_{name}.hmt", meta)
        f[f"meta_{name}"] = str(d / f"meta_{name}.hmt")
    f["dir"] = str(d)
    f["missing"] = str(d / "no-such-file")
    # event tables
    table = events_to_table(EVENTS, S2)
    pq.write_table(table, d / "good.parquet")
    f["parquet"] = str(d / "good.parquet")
    strings = pa.table({c: pa.array(["x"] * table.num_rows) for c in table.column_names},
                       metadata=table.schema.metadata)
    pq.write_table(strings, d / "types.parquet")
    f["types"] = str(d / "types.parquet")
    floats = pa.table({c: pa.array([float("nan")] * table.num_rows)
                       for c in table.column_names}, metadata=table.schema.metadata)
    pq.write_table(floats, d / "nan.parquet")
    f["nanpq"] = str(d / "nan.parquet")
    for name, md in (("deepmeta", DEEP), ("listmeta", "[1]"), ("gridmeta",
                     json.dumps({"organization": "S2", "attention_grid_tokens": "x",
                                 "recurrent_grid_tokens": 512})),
                     ("zerogrid", json.dumps({"organization": "S2", "attention_grid_tokens": 0,
                                              "recurrent_grid_tokens": 512})),
                     ("hugegrid", json.dumps({"organization": "S2",
                                              "attention_grid_tokens": 10**30,
                                              "recurrent_grid_tokens": 512})),
                     ("nanmeta", '{"organization": "S2", "attention_grid_tokens": NaN, '
                                 '"recurrent_grid_tokens": 512}'),
                     ("verdictmeta", json.dumps({**S2, "verdict": DEEP}))):
        t = table.replace_schema_metadata({b"hybridmem.meta": md.encode()})
        pq.write_table(t, d / f"{name}.parquet")
        f[name] = str(d / f"{name}.parquet")
    pq.write_table(table.replace_schema_metadata({}), d / "nometa.parquet")
    f["nometa"] = str(d / "nometa.parquet")
    pq.write_table(table.drop_columns(["depth"]), d / "nodepth.parquet")
    f["nodepth"] = str(d / "nodepth.parquet")
    (d / "fake.parquet").write_bytes(b"PAR1 not really")
    f["fakepq"] = str(d / "fake.parquet")
    # stats tables
    for name, text in (("nancsv", "seed,arm,value\n1,a,nan\n1,b,2\n"),
                       ("infcsv", "seed,arm,value\n1,a,inf\n1,b,2\n"),
                       ("nocols", "x,y\n1,2\n"), ("emptycsv", ""),
                       ("hugeseed", f"seed,arm,value\n{HUGE},a,1\n{HUGE},b,2\n"),
                       ("strval", "seed,arm,value\n1,a,x\n1,b,2\n"),
                       ("dup", "seed,arm,value\n1,a,1\n1,a,2\n1,b,2\n"),
                       ("oneseed", "seed,arm,value\n1,a,1\n1,b,2\n"),
                       ("neg", "seed,arm,value\n1,a,-1\n1,b,2\n2,a,1\n2,b,1\n"),
                       ("zero", "seed,arm,value\n1,a,0\n1,b,2\n2,a,1\n2,b,1\n"),
                       ("unequal", "seed,arm,value\n1,a,1\n2,b,2\n"),
                       ("good", "seed,arm,value\n1,a,1\n1,b,2\n2,a,1.5\n2,b,2\n3,a,1\n3,b,1.1\n")):
        (d / f"{name}.csv").write_text(text)
        f[name] = str(d / f"{name}.csv")
    (d / "bin.csv").write_bytes(random.Random(1).randbytes(2000))
    f["bincsv"] = str(d / "bin.csv")
    pq.write_table(pa.table({"seed": ["x"], "arm": [1], "value": ["y"]}), d / "long.parquet")
    f["longtypes"] = str(d / "long.parquet")
    # model configs
    for name, cfg in (
        ("zeroheads", {**GOOD_CONFIG, "num_attention_heads": 0, "num_key_value_heads": 0}),
        ("zerolayers", {**GOOD_CONFIG, "num_hidden_layers": 0}),
        ("neglayers", {**GOOD_CONFIG, "num_hidden_layers": -2}),
        ("strlayers", {**GOOD_CONFIG, "num_hidden_layers": "two"}),
        ("floatlayers", {**GOOD_CONFIG, "num_hidden_layers": 2.5}),
        ("boollayers", {**GOOD_CONFIG, "num_hidden_layers": True}),
        ("hugelayers", {**GOOD_CONFIG, "num_hidden_layers": 10**40}),
        ("zerodstate", {**GOOD_CONFIG, "mamba_d_state": 0}),
        ("zeroconv", {**GOOD_CONFIG, "mamba_d_conv": 0}),
        ("listheads", {**GOOD_CONFIG, "mamba_n_heads": [8]}),
        ("baddtype", {**GOOD_CONFIG, "torch_dtype": "float7"}),
        ("listdtype", {**GOOD_CONFIG, "torch_dtype": ["bfloat16"]}),
        ("nolayers", {k: v for k, v in GOOD_CONFIG.items() if k != "num_hidden_layers"}),
        ("nomamba", {k: v for k, v in GOOD_CONFIG.items() if not k.startswith("mamba")}),
        ("empty", {}),
        ("good", GOOD_CONFIG),
    ):
        (d / "cfg" / name).mkdir(parents=True)
        (d / "cfg" / name / "config.json").write_text(json.dumps(cfg))
        f[f"cfg_{name}"] = str(d / "cfg" / name)
    for name, text in (("deep", DEEP), ("list", "[1]"), ("nanvals",
                       json.dumps(GOOD_CONFIG).replace('"mamba_d_state": 16',
                                                       '"mamba_d_state": NaN')),
                       ("infvals", json.dumps(GOOD_CONFIG).replace('"head_dim": 32',
                                                                   '"head_dim": 1e400')),
                       ("notjson", "{"), ("binary", "\udcff")):
        (d / "cfg" / name).mkdir(parents=True)
        (d / "cfg" / name / "config.json").write_bytes(text.encode("utf-8", "surrogateescape"))
        f[f"cfg_{name}"] = str(d / "cfg" / name)
    (d / "cfg" / "noconfig").mkdir()
    f["cfg_noconfig"] = str(d / "cfg" / "noconfig")
    # run directories for fidelity
    ok = {"seed": 1, "trace": True, "throughput_tok_s": 10.0}
    f["run_on"] = _summary(d / "runs" / "on", json.dumps(ok))
    f["run_off"] = _summary(d / "runs" / "off", json.dumps({**ok, "trace": False}))
    for name, text in (("deep", DEEP), ("nan", json.dumps({**ok, "throughput_tok_s": None})
                                          .replace("null", "NaN")),
                       ("inf", json.dumps(ok).replace("10.0", "1e400")),
                       ("strseed", json.dumps({**ok, "seed": "1"})),
                       ("hugeseed", json.dumps(ok).replace('"seed": 1', f'"seed": {HUGE}')),
                       ("list", "[]"), ("notjson", "{"), ("neg", json.dumps(
                           {**ok, "throughput_tok_s": -1.0})),
                       ("strtrace", json.dumps({**ok, "trace": "yes"}))):
        f[f"sum_{name}"] = _summary(d / "runs" / name, text)
    f["run_empty"] = str(d / "runs" / "emptydir")
    (d / "runs" / "emptydir").mkdir()
    # vLLM KV-event streams
    (d / "urandom.msgpack").write_bytes(random.Random(2).randbytes(1 << 16))
    f["urandom"] = str(d / "urandom.msgpack")
    stored = ["BlockStored", [1, 2], None, [], 16, None, "GPU"]
    for name, batch in (
        ("nan", [float("nan"), [stored]]),
        ("strts", ["x", [stored]]),
        ("strsize", [0.0, [["BlockStored", [1], None, [], "16", None, "GPU"]]]),
        ("zerosize", [0.0, [["BlockStored", [1], None, [], 0, None, "GPU"]]]),
        ("negsize", [0.0, [["BlockStored", [1], None, [], -16, None, "GPU"]]]),
        ("nansize", [0.0, [["BlockStored", [1], None, [], float("nan"), None, "GPU"]]]),
        ("hugesize", [0.0, [["BlockStored", [1], None, [], 2**62, None, "GPU"]]]),
        ("hashes", [0.0, [["BlockStored", 7, None, [], 16, None, "GPU"]]]),
        ("hashtype", [0.0, [["BlockStored", [1.5], None, [], 16, None, "GPU"]]]),
        ("group", [0.0, [["BlockStored", [1], None, [], 16, None, "GPU", None, None, "g"]]]),
        ("removed", [0.0, [["BlockRemoved", 5, "GPU"]]]),
        ("events", [0.0, 5]),
        ("mapevents", {"ts": 0.0, "events": 5}),
        ("mapts", {"ts": [1], "events": []}),
        ("hugets", [1e300, [stored]]),
        ("unknown", [0.0, [["Bogus"]]]),
        ("scalar", 5),
        ("nostore", [0.0, []]),
    ):
        (d / f"{name}.msgpack").write_bytes(msgpack.packb(batch))
        f[f"kv_{name}"] = str(d / f"{name}.msgpack")
    f["out"] = str(d / "out")
    _later_classes(d, f)
    return f


CAMPAIGN = '[campaign]\nname = "t"\nmodel = {model}\nrequests = {requests}\n{extra}' \
    '[grid]\norg = {org}\nbudget = {budget}\nseeds = {seeds}\n'
TIMING_COLUMNS = ("tokens", "seqs", "kv_tokens", "attn_pairs", "checkpoints", "seconds")


def _later_classes(d: Path, f: dict[str, str]) -> None:
    """Fixtures of the classes found after the first sweep: specs and files read whole (campaign
    TOML, cases, timing, configs on devices), outputs that are not regular files, the query's
    COPY targets."""
    # configs and summaries that are endless devices (read with a size cap, refused unread)
    for dev in ("zero", "urandom"):
        (d / "cfg" / f"dev{dev}").mkdir(parents=True)
        (d / "cfg" / f"dev{dev}" / "config.json").symlink_to(f"/dev/{dev}")
        f[f"cfg_dev{dev}"] = str(d / "cfg" / f"dev{dev}")
        (d / "runs" / f"dev{dev}").mkdir(parents=True)
        (d / "runs" / f"dev{dev}" / "summary.json").symlink_to(f"/dev/{dev}")
        f[f"sum_dev{dev}"] = str(d / "runs" / f"dev{dev}")
    simcfg = {**GOOD_CONFIG, "vocab_size": 1024}  # a simulated model with no D0 preset
    (d / "cfg" / "sim").mkdir(parents=True)
    (d / "cfg" / "sim" / "config.json").write_text(json.dumps(simcfg))
    # campaign specs
    ok = {"model": '"falcon-h1-7b"', "requests": "10", "extra": "", "org": '["S2"]',
          "budget": '["b63"]', "seeds": "[1, 2]"}
    for name, change in (
        ("good", {}),
        ("negbudget", {"budget": '["-5"]'}),
        ("intbudget", {"budget": "[63]"}),
        ("hugebudget", {"budget": f'["b{HUGE[:50]}"]'}),
        ("tinybudget", {"budget": '["63"]'}),
        ("unknownmodel", {"model": '"no-such-model"'}),
        ("devmodel", {"model": json.dumps(f["cfg_devzero"])}),
        ("floatseeds", {"seeds": "[1.5, 2]"}),
        ("strseeds", {"seeds": '["1", "2"]'}),
        ("seedrange", {"seeds": "{start = 0, count = 1000000000}"}),
        ("floatstart", {"seeds": "{start = 0.5, count = 3}"}),
        ("strcount", {"seeds": '{start = 0, count = "3"}'}),
        ("seedwrap", {"seeds": "{start = 4294967290, count = 10}"}),
        ("d0nofrac", {"model": json.dumps(str(d / "cfg" / "sim")), "org": '["D0"]'}),
        ("tinyfrac", {"extra": "attention_fraction = 1e-320\n"}),
        ("zeroreq", {"requests": "0"}),
        ("floatreq", {"requests": "10.5"}),
        ("badorg", {"org": '["S9"]'}),
    ):
        (d / f"camp_{name}.toml").write_text(CAMPAIGN.format(**{**ok, **change}))
        f[f"camp_{name}"] = str(d / f"camp_{name}.toml")
    (d / "camp_coststr.toml").write_text(CAMPAIGN.format(**ok) + '[cost]\nmfu = "x"\n')
    f["camp_coststr"] = str(d / "camp_coststr.toml")
    # continuation cases files
    for name, line in (("good", {"prompt": [20] * 200, "boundary": 128, "max_tokens": 3}),
                       ("strboundary", {"prompt": [20] * 200, "boundary": "128"}),
                       ("floatboundary", {"prompt": [20] * 200, "boundary": 128.0}),
                       ("boolmax", {"prompt": [20] * 200, "boundary": 128, "max_tokens": True}),
                       ("strtokens", {"prompt": ["20"] * 200, "boundary": 128}),
                       ("hugeboundary", {"prompt": [20] * 200, "boundary": 10**30}),
                       ("extra", {"prompt": [20] * 200, "boundary": 128, "boundry": 1}),
                       ("list", [1, 2])):
        (d / f"cases_{name}.jsonl").write_text(json.dumps(line) + "\n")
        f[f"cases_{name}"] = str(d / f"cases_{name}.jsonl")
    # timing files for `sim calibrate`
    row = {"tokens": 100, "seqs": 2, "kv_tokens": 1000, "attn_pairs": 5000.0, "checkpoints": 1,
           "seconds": 0.01}
    for name, change in (("good", {}), ("huge", {"seconds": "1e308"}),
                         ("hugefeature", {"kv_tokens": "1e300"}), ("neg", {"seqs": -1}),
                         ("frac", {"tokens": 1.5}), ("inf", {"seconds": "inf"}),
                         ("text", {"tokens": "many"})):
        rows = [row] * 9 + [{**row, **change}]
        (d / f"timing_{name}.csv").write_text(
            ",".join(TIMING_COLUMNS) + "\n"
            + "".join(",".join(str(r[c]) for c in TIMING_COLUMNS) + "\n" for r in rows))
        f[f"timing_{name}"] = str(d / f"timing_{name}.csv")
    for name, col in (("strcol", pa.array(["1"] * 10)), ("listcol", pa.array([[1]] * 10))):
        cols = {c: pa.array([row[c]] * 10) for c in TIMING_COLUMNS}
        pq.write_table(pa.table({**cols, "tokens": col}), d / f"timing_{name}.parquet")
        f[f"timing_{name}"] = str(d / f"timing_{name}.parquet")
    # a KV-event stream of one event with 100,000 one-byte hashes
    (d / "manyhashes.msgpack").write_bytes(msgpack.packb(
        [0.0, [["BlockStored", [1] * 100_000, None, [], 16, None, "GPU"]]]))
    f["kv_manyhashes"] = str(d / "manyhashes.msgpack")
    # outputs that are not regular files: the rename would replace the node itself
    os.mkfifo(d / "fifo.parquet")
    f["fifo"] = str(d / "fifo.parquet")
    (d / "target.json").write_text("keep")
    (d / "link.json").symlink_to(d / "target.json")
    f["link"] = str(d / "link.json")
    (d / "target.png").write_text("keep")
    (d / "link.png").symlink_to(d / "target.png")
    f["linkpng"] = str(d / "link.png")
    # an input alone in its folder, for COPY targets around it
    (d / "qin").mkdir()
    pq.write_table(events_to_table(EVENTS, S2), d / "qin" / "in.parquet")
    f["qin"] = str(d / "qin" / "in.parquet")
    f["qdir"] = str(d / "qin")


def _cases() -> list[tuple[str, list[str]]]:
    """(id, argv) with ``{key}`` placeholders filled from the ``files`` fixture."""
    cases: list[tuple[str, list[str]]] = []

    def add(name: str, *argv: str) -> None:
        cases.append((name, list(argv)))

    # top level and argparse
    add("no-command")
    add("unknown-command", "frobnicate")
    for cmd in ("plan", "storage", "stats", "fidelity", "trace", "lineage", "model", "run",
                "demo"):
        add(f"{cmd}-bad-flag", cmd, "--no-such-flag")
    # plan
    plan = ["plan", "--model", "falcon-h1-7b"]
    for b in ("", " ", "b0", "b-1", "-5", HUGE, "b" + HUGE, HUGE + "MiB", "nan", "inf", "1e400",
              "96XiB", "1.5B", "0", "0.5", "b63.5", "bb63", "63 MiB MiB", "\x00", "b" + "0" * 40):
        add(f"plan-budget-{b[:12]!r}", *plan, "--budget", b)
    for fr in ("nan", "inf", "-inf", "0", "1", "2", "-0.5", "x", "1e400", HUGE, "", "0x1"):
        add(f"plan-frac-{fr[:12]!r}", *plan, "--budget", "b63", "--attention-fraction", fr)
    for key in ("missing", "cfg_noconfig", "cfg_zeroheads", "cfg_zerolayers", "cfg_neglayers",
                "cfg_strlayers", "cfg_floatlayers", "cfg_boollayers", "cfg_hugelayers",
                "cfg_zerodstate", "cfg_zeroconv", "cfg_listheads", "cfg_baddtype",
                "cfg_listdtype", "cfg_nolayers", "cfg_nomamba", "cfg_empty", "cfg_deep",
                "cfg_list", "cfg_nanvals", "cfg_infvals", "cfg_notjson", "cfg_binary",
                "trace", "dir"):
        add(f"plan-model-{key}", "plan", "--model", f"{{{key}}}", "--budget", "b63")
    for dt in ("float7", "", "x" * 5000, "int8x"):
        add(f"plan-ssm-dtype-{dt[:8]!r}", *plan, "--budget", "b63", "--ssm-dtype", dt)
    add("plan-model-empty", "plan", "--model", "", "--budget", "b63")
    # storage
    st = ["storage", "--model", "falcon-h1-7b"]
    for a, r in (("-1", "1"), ("1", "-1"), (HUGE, "1"), ("1", HUGE), ("nan", "1"), ("1", "x"),
                 ("1e3", "1"), ("", "1"), (str(2**70), "1")):
        add(f"storage-xa-{a[:8]}-xr-{r[:8]}", *st, "--attention", a, "--recurrent", r)
    for s in ("-1", HUGE, "x", str(2**70)):
        add(f"storage-slabs-{s[:8]}", *st, "--attention", "1", "--recurrent", "1", "--slabs", s)
    add("storage-nothing", *st)
    add("storage-only-xa", *st, "--attention", "1")
    for cap in ("", "0", "-1", HUGE, "nan", "1e400", "1XiB"):
        add(f"storage-capacity-{cap[:8]!r}", *st, "--capacity", cap, "--mix", "1,1")
    for mix in ("1", "a,b", "-1,2", "1,2,3", HUGE + ",1", "0,0", "", ",", "nan,1"):
        add(f"storage-mix-{mix[:8]!r}", *st, "--capacity", "100MiB", "--mix", mix)
    for pools in ("1", "x,y", "0,0", HUGE + ",1", "-1,5"):
        add(f"storage-pools-{pools[:8]!r}", *st, "--capacity", "100MiB", "--mix", "1,1",
            "--d0-pools", pools)
    add("storage-capacity-no-mix", *st, "--capacity", "100MiB")
    add("storage-both", *st, "--capacity", "100MiB", "--mix", "1,1", "--attention", "1")
    add("storage-model-zeroheads", "storage", "--model", "{cfg_zeroheads}", "--attention", "1",
        "--recurrent", "1")
    # stats
    sc = ["stats", "contrast"]
    for key in ("missing", "dir", "nancsv", "infcsv", "nocols", "emptycsv", "hugeseed",
                "strval", "dup", "oneseed", "neg", "zero", "unequal", "bincsv", "longtypes",
                "types", "fakepq", "trace"):
        add(f"stats-contrast-{key}", *sc, f"{{{key}}}", "--num", "a", "--den", "b")
    for lv in ("nan", "0", "1", "2", "-1", "inf", HUGE, "x"):
        add(f"stats-level-{lv[:8]}", *sc, "{good}", "--num", "a", "--den", "b", "--level", lv)
    add("stats-no-arm", *sc, "{good}", "--num", "zz", "--den", "b")
    add("stats-minus-alone", *sc, "{good}", "--num", "a", "--den", "b", "--minus-num", "a")
    add("stats-no-verb", "stats")
    for p in ("nan", "-1", "2", "inf", "x", HUGE, "-0.0001", "1e400"):
        add(f"stats-holm-{p[:8]}", "stats", "holm", "0.5", p)
    add("stats-holm-none", "stats", "holm")
    for p6, p9 in (("nan", "-"), ("2", "-"), ("-", "-1"), ("x", "0.1"), (HUGE, "-")):
        add(f"stats-two-look-{p6[:6]}-{p9[:6]}", "stats", "two-look", p6, p9)
    add("stats-two-look-one", "stats", "two-look", "0.1")
    add("stats-test-scale", *sc, "{good}", "--num", "a", "--den", "b", "--test-scale", "ranks")
    # fidelity
    for key in ("sum_deep", "sum_nan", "sum_inf", "sum_strseed", "sum_hugeseed", "sum_list",
                "sum_notjson", "sum_neg", "sum_strtrace", "run_empty", "missing", "trace"):
        add(f"fidelity-on-{key}", "fidelity", "--on", f"{{{key}}}", "--off", "{run_off}")
    add("fidelity-swapped", "fidelity", "--on", "{run_off}", "--off", "{run_on}")
    add("fidelity-same", "fidelity", "--on", "{run_on}", "--off", "{run_on}")
    for lv in ("nan", "0", "1", "inf", "x", HUGE):
        add(f"fidelity-level-{lv[:8]}", "fidelity", "--on", "{run_on}", "--off", "{run_off}",
            "--level", lv)
    for bd in ("nan", "0", "-1", "inf", "x", HUGE):
        add(f"fidelity-bound-{bd[:8]}", "fidelity", "--on", "{run_on}", "--off", "{run_off}",
            "--bound", bd)
    add("fidelity-metric", "fidelity", "--on", "{run_on}", "--off", "{run_off}", "--metric", "x")
    for plot in ("", "{out}/x.xyz", "{dir}"):
        add(f"fidelity-plot-{plot[:6]!r}", "fidelity", "--on", "{run_on}", "--off", "{run_off}",
            "--plot", plot)
    # trace
    bad_traces = ("missing", "dir", "torn_header", "empty", "random", "head16", "meta_deep",
                  "meta_nan", "meta_list", "meta_notjson", "meta_deepobj", "parquet")
    for verb in ("verify", "stats"):
        for key in bad_traces:
            if key == "torn_header":
                continue
            add(f"trace-{verb}-{key}", "trace", verb, f"{{{key}}}")
    add("trace-verify-empty-path", "trace", "verify", "")
    for key in bad_traces:
        if key != "torn_header":
            add(f"trace-export-{key}", "trace", "export", f"{{{key}}}", "--parquet",
                "{out}/x.parquet")
    for flag in ("--parquet", "--perfetto"):
        add(f"trace-export-empty{flag}", "trace", "export", "{trace}", flag, "")
        add(f"trace-export-onto-input{flag}", "trace", "export", "{trace}", flag, "{trace}")
        add(f"trace-export-into-dir{flag}", "trace", "export", "{trace}", flag, "{dir}")
        add(f"trace-export-no-parent{flag}", "trace", "export", "{trace}", flag,
            "{missing}/deeper/x.out")
    add("trace-export-both", "trace", "export", "{trace}", "--parquet", "a.parquet",
        "--perfetto", "b.json")
    add("trace-export-neither", "trace", "export", "{trace}")
    for top in ("-1", HUGE, "x", "nan"):
        add(f"trace-stats-top-{top[:6]}", "trace", "stats", "{trace}", "--top", top)
    for ev in ("0", "-1", "1e10", HUGE, "x", "10000000000", str(2**63)):
        add(f"trace-bench-events-{ev[:8]}", "trace", "bench", "--events", ev)
    for rp in ("0", "-1", HUGE, "1000000"):
        add(f"trace-bench-repeats-{rp[:8]}", "trace", "bench", "--events", "10", "--repeats", rp)
    add("trace-bench-out-empty", "trace", "bench", "--events", "10", "--out", "")
    add("trace-bench-out-dir", "trace", "bench", "--events", "10", "--out", "{dir}")
    add("trace-bench-out-input", "trace", "bench", "--events", "10", "--out", "{parquet}")
    add("trace-no-verb", "trace")
    # lineage
    for key in ("missing", "dir", "empty", "random", "torn", "meta_deep", "meta_nan", "types",
                "nanpq", "deepmeta", "listmeta", "gridmeta", "zerogrid", "hugegrid", "nanmeta",
                "verdictmeta", "nometa", "nodepth", "fakepq", "head16"):
        add(f"lineage-report-{key}", "lineage", f"{{{key}}}")
    add("lineage-none", "lineage")
    add("lineage-empty-path", "lineage", "")
    for plot in ("x.xyz", "", "{dir}", "{parquet}", "{missing}/d/x.png"):
        add(f"lineage-plot-{plot[:8]!r}", "lineage", "{parquet}", "--plot", plot)
    for sql in ("SELECT 'x'::INT", "", " ", "SELEC 1", "SELECT 1; SELECT 2",
                "COPY (SELECT 1) TO '{out}/copy.csv'", "INSTALL httpfs", "LOAD httpfs",
                "ATTACH '{out}/x.db'", "SELECT * FROM read_csv('{nancsv}')",
                "CREATE TABLE x AS SELECT 1", "SELECT * FROM no_such_view",
"SELECT " + "1+" * 20_000 + "1", "PRAGMA version",
                "SET enable_external_access=true", "SELECT range(10)::INT",
                "SELECT * FROM read_parquet('{parquet}')", "DROP VIEW episode_lineage",
                "SELECT '" + "x" * 200_000 + "'::INT"):
        add(f"lineage-query-{sql[:16]!r}", "lineage", "query", "{parquet}", "--sql", sql)
    add("lineage-query-copy-onto-input", "lineage", "query", "{parquet}", "--allow-files",
        "--sql", "COPY (SELECT 1) TO '{parquet}'")
    for t in ("0", "-1", "nan", "inf", HUGE):
        add(f"lineage-query-timeout-{t[:6]}", "lineage", "query", "{parquet}", "--sql",
            "SELECT 1", "--timeout", t)
    add("lineage-query-memory-limit", "lineage", "query", "{parquet}", "--sql", "SELECT 1",
        "--memory-limit", "lots")
    add("lineage-query-no-sql", "lineage", "query", "{parquet}")
    add("lineage-query-no-path", "lineage", "query", "--sql", "SELECT 1")
    add("lineage-query-two-paths", "lineage", "query", "{parquet}", "{parquet}", "--sql",
        "SELECT 1")
    add("lineage-query-bad-table", "lineage", "query", "{types}", "--sql", "SELECT 1")
    add("lineage-views-path", "lineage", "views", "{parquet}")
    for key in ("urandom", "missing", "dir", "empty", "kv_nan", "kv_strts", "kv_strsize",
                "kv_zerosize", "kv_negsize", "kv_nansize", "kv_hugesize", "kv_hashes",
                "kv_hashtype", "kv_group", "kv_removed", "kv_events", "kv_mapevents",
                "kv_mapts", "kv_hugets", "kv_unknown", "kv_scalar", "kv_nostore", "trace"):
        add(f"lineage-import-{key}", "lineage", "import-vllm", f"{{{key}}}", "{out}/i.parquet")
    for dev in ("/dev/urandom", "/dev/zero"):  # endless devices: refused before any read
        add(f"lineage-import-{dev}", "lineage", "import-vllm", dev, "{out}/i.parquet")
        add(f"trace-verify-{dev}", "trace", "verify", dev)
        add(f"lineage-report-{dev}", "lineage", dev)
        add(f"stats-contrast-{dev}", *sc, dev, "--num", "a", "--den", "b")
    for bs in ("0", "-1", "nan", HUGE, "x", str(2**40)):
        add(f"lineage-import-bs-{bs[:6]}", "lineage", "import-vllm", "{kv_nostore}",
            "{out}/i.parquet", "--block-size", bs)
    add("lineage-import-out-suffix", "lineage", "import-vllm", "{kv_nostore}", "{out}/i.csv")
    add("lineage-import-out-empty", "lineage", "import-vllm", "{kv_nostore}", "")
    add("lineage-import-out-input", "lineage", "import-vllm", "{parquet}", "{parquet}")
    add("lineage-import-one-arg", "lineage", "import-vllm", "{kv_nostore}")
    # run (must all fail before any engine import)
    base = ["run", "--out", "{out}/run"]
    for flag, values in (
        ("--requests", ("0", "-1", "1e9", "1000000000", HUGE, "x", "")),
        ("--rate", ("nan", "0", "-1", "inf", "x", HUGE, "1e400")),
        ("--share", ("nan", "-0.1", "1.1", "inf", "x")),
        ("--seed", ("-1", "4294967296", HUGE, "x", "1.5")),
        ("--cap", ("0", "-1", "1000000000", HUGE)),
        ("--max-model-len", ("0", "63", "1000000000000", HUGE, "4096")),  # tiny: 2,048
        ("--kv-blocks", ("0", "1", "1000000000000", HUGE)),
        ("--max-num-batched-tokens", ("0", "15", "x", "1e9", HUGE)),
        ("--server-timeout", ("nan", "0", "-1", "inf")),
        ("--request-timeout", ("nan", "0", "-1", "inf")),
    ):
        for v in values:
            add(f"run{flag}-{v[:10]!r}", *base, flag, v)
    for key in ("missing", "cfg_noconfig", "trace", "cfg_deep", "cfg_list"):
        add(f"run-model-{key}", *base, "--model", f"{{{key}}}")
    add("run-out-empty", "run", "--out", "")
    add("run-out-file", "run", "--out", "{trace}")
    add("run-no-out", "run")
    # demo (validation before the plans print is not required; before the engine is)
    for flag, v in (("--requests", "0"), ("--requests", "1e9"), ("--rate", "nan"),
                    ("--share", "2"), ("--kv-blocks", "0"), ("--seed", "-1"),
                    ("--seed", "4294967296"), ("--kv-blocks", HUGE), ("--out", "")):
        add(f"demo{flag}-{v[:8]!r}", "demo", flag, v)
    # model build
    for flag, v in (("--seed", "-1"), ("--seed", "4294967296"), ("--seed", HUGE),
                    ("--out", ""), ("--out", "{trace}")):
        add(f"model{flag}-{v[:8]!r}", "model", "build", flag, v)
    add("model-no-verb", "model")
    _later_cases(add)
    return cases


def _later_cases(add: Any) -> None:
    """Cases of the classes found after the first sweep (validation before work, inputs never
    destroyed, bounded reads); the campaign specs and timing files are in SIM_CASES."""
    big = "b" + "9" * 50
    add("run-budget-50-digits", "run", "--out", "{out}/run", "--budget", big)
    add("run-budget-25-digits", "run", "--out", "{out}/run", "--budget", "b" + "9" * 25)
    add("run-budget-bytes-too-small", "run", "--out", "{out}/run", "--budget", "63")
    add("run-fault-empty", "run", "--out", "{out}/run", "--fault", "")
    add("run-fault-unknown", "run", "--out", "{out}/run", "--fault", "bogus")
    add("run-frac-denormal", "run", "--out", "{out}/run", "--org", "D0",
        "--attention-fraction", "1e-320")
    for key in ("cfg_devzero", "cfg_devurandom"):
        add(f"run-model-{key}", "run", "--out", "{out}/run", "--model", f"{{{key}}}")
        add(f"plan-model-{key}", "plan", "--model", f"{{{key}}}", "--budget", "b63")
    for key in ("sum_devzero", "sum_devurandom"):
        add(f"fidelity-on-{key}", "fidelity", "--on", f"{{{key}}}", "--off", "{run_off}")
    for lv in ("1e-320", "0.3", "0.99999"):
        add(f"stats-level-range-{lv}", "stats", "contrast", "{good}", "--num", "a", "--den", "b",
            "--level", lv)
        add(f"fidelity-level-range-{lv}", "fidelity", "--on", "{run_on}", "--off", "{run_off}",
            "--level", lv)
    for fr in ("1e-320", "0.0001", "0.9999"):
        add(f"plan-frac-range-{fr}", "plan", "--model", "falcon-h1-7b", "--budget", "b63",
            "--attention-fraction", fr)
    # sim: empty paths would be the working directory
    add("sim-out-empty", "sim", "--out", "")
    add("sim-trace-empty", "sim", "--out", "{out}/sim", "--trace", "")
    add("sim-frac-denormal", "sim", "--out", "{out}/sim", "--attention-fraction", "1e-320")
    add("sim-calibrate-out-empty", "sim", "calibrate", "{timing_good}", "--out", "")
    # campaign: refused before the spec is read or any worker starts
    for ray in ("not an address", "host:99999", "host:", ":80", "http://host:80", " "):
        add(f"campaign-ray-{ray!r}", "campaign", "{camp_good}", "--out", "{out}/camp",
            "--ray", ray)
    for dev in ("/dev/zero", "/dev/urandom"):
        add(f"campaign-spec-{dev}", "campaign", dev, "--out", "{out}/camp")
    # continuation: the cases file is checked whole before any engine starts
    for key in ("strboundary", "floatboundary", "boolmax", "strtokens", "hugeboundary", "extra",
                "list"):
        add(f"continuation-cases-{key}", "continuation", "--out", "{out}/cont", "--cases-file",
            f"{{cases_{key}}}")
    add("continuation-cases-devzero", "continuation", "--out", "{out}/cont", "--cases-file",
        "/dev/zero")
    add("continuation-frac-denormal", "continuation", "--out", "{out}/cont", "--org", "D0",
        "--attention-fraction", "1e-320")
    # lineage: an option the form does not read is refused, not ignored
    add("lineage-report-sql", "lineage", "{parquet}", "--sql", "SELECT 1")
    add("lineage-report-block-size", "lineage", "{parquet}", "--block-size", "16")
    add("lineage-report-allow-files", "lineage", "{parquet}", "--allow-files")
    add("lineage-report-timeout", "lineage", "{parquet}", "--timeout", "5")
    add("lineage-query-plot", "lineage", "query", "{parquet}", "--sql", "SELECT 1", "--plot",
        "{out}/q.png")
    add("lineage-query-replay", "lineage", "query", "{parquet}", "--sql", "SELECT 1",
        "--replay", "all")
    add("lineage-views-json", "lineage", "views", "--json")
    add("lineage-query-occupancy", "lineage", "query", "{parquet}", "--sql", "SELECT 1",
        "--occupancy", "{out}/o.png")
    add("lineage-occupancy-onto-input", "lineage", "{parquet}", "--occupancy", "{parquet}")
    add("lineage-occupancy-same-as-plot", "lineage", "{parquet}", "--occupancy", "{out}/p.png",
        "--plot", "{out}/p.png")
    add("lineage-query-twice", "lineage", "query", "{parquet}", "{parquet}", "--sql", "SELECT 1")
    add("stats-contrast-folder-no-metric", "stats", "contrast", "{out}", "--num", "a",
        "--den", "b")
    add("stats-contrast-metric-no-campaign", "stats", "contrast", "{out}/none", "--metric",
        "throughput_tok_s", "--num", "S2", "--den", "D0")
    add("lineage-import-replay", "lineage", "import-vllm", "{kv_nostore}", "{out}/i.parquet",
        "--replay", "all")
    add("lineage-import-many-hashes", "lineage", "import-vllm", "{kv_manyhashes}",
        "{out}/i.parquet")
    # lineage query --allow-files: no COPY can reach the input or its folder
    for name, sql in (
        ("explain-analyze-copy", "EXPLAIN ANALYZE COPY (SELECT 1) TO '{qin}'"),
        ("explain-copy", "EXPLAIN COPY (SELECT 1) TO '{qin}'"),
        ("explain-comment", "EXPLAIN /* x */ ANALYZE COPY (SELECT 1) TO '{qin}'"),
        ("dollar", "COPY (SELECT 1) TO $${qin}$$"),
        ("dollar-tag", "COPY (SELECT 1) TO $t${qin}$t$"),
        ("comment", "COPY (SELECT 1) TO /* x */ '{qin}'"),
        ("escape", "COPY (SELECT 1) TO E'{qin}'"),
        ("partition-overwrite", "COPY (SELECT 1 AS a) TO '{qdir}' "
                                "(FORMAT parquet, PARTITION_BY (a), OVERWRITE)"),
        ("partition-parent", "COPY (SELECT 1 AS a) TO '{dir}' "
                             "(FORMAT parquet, PARTITION_BY (a), OVERWRITE_OR_IGNORE)"),
        ("url", "COPY (SELECT 1) TO 'file://{qin}'"),
        ("export", "EXPORT DATABASE '{qdir}'"),
        ("attach", "ATTACH '{qdir}/x.db'"),
    ):
        add(f"lineage-query-files-{name}", "lineage", "query", "{qin}", "--allow-files", "--sql",
            sql)
    # outputs: never over an existing trace, never over a node that is not a regular file
    add("trace-bench-out-existing-trace", "trace", "bench", "--events", "10", "--out",
        "{trace}")
    add("trace-bench-force-foreign", "trace", "bench", "--events", "10", "--out", "{nancsv}",
        "--force")
    add("trace-export-fifo", "trace", "export", "{trace}", "--parquet", "{fifo}")
    add("trace-export-symlink", "trace", "export", "{trace}", "--perfetto", "{link}")
    add("lineage-plot-symlink", "lineage", "{parquet}", "--plot", "{linkpng}")
    add("lineage-import-fifo", "lineage", "import-vllm", "{kv_nostore}", "{fifo}")


# campaign specs and timing files: checked by code that imports the simulator (vLLM's scheduler,
# no engine), so these run with vLLM importable and the work itself replaced by a tripwire
SIM_CASES: list[tuple[str, list[str]]] = [
    *((f"campaign-spec-{k}", ["campaign", f"{{camp_{k}}}", "--out", "{out}/camp"])
      for k in ("negbudget", "intbudget", "hugebudget", "tinybudget", "unknownmodel",
                "devmodel", "floatseeds", "strseeds", "seedrange", "floatstart", "strcount",
                "seedwrap", "d0nofrac", "tinyfrac", "zeroreq", "floatreq", "badorg",
                "coststr")),
    *((f"sim-calibrate-{k}", ["sim", "calibrate", f"{{timing_{k}}}"])
      for k in ("huge", "hugefeature", "neg", "frac", "inf", "text", "strcol", "listcol")),
]


CASES = _cases()


def test_sweep_is_large_enough():
    assert len(CASES) >= 300, len(CASES)
    commands = {argv[0] for _, argv in CASES if argv}
    assert commands >= {"plan", "storage", "stats", "fidelity", "trace", "lineage", "model",
                        "run", "demo"}


def _tree(root: str) -> dict[str, tuple[int, int, int]]:
    """Every entry under ``root``: (mode, size, mtime), links not followed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.join(dirpath, name)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def _run_case(argv: list[str], files: dict[str, str], capsys: Any) -> Any:
    """Run one case; assert that it wrote, changed and removed nothing in the fixture tree."""
    Path(files["out"]).mkdir(exist_ok=True)
    argv = [a.format(**files) if "{" in a and len(a) < 1000 else a for a in argv]
    before = _tree(files["dir"])
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    after = _tree(files["dir"])
    assert after == before, ("files written, changed or removed by a refused command",
                             sorted(set(after) ^ set(before))[:5])
    return code, capsys.readouterr()


def _assert_one_line(code: Any, out: Any) -> None:
    assert "Traceback" not in out.err + out.out
    lines = [ln for ln in out.err.splitlines() if ln.strip()]
    assert code == 2, (code, out.err[-2000:])
    assert len(lines) == 1, out.err[-2000:]
    assert len(lines[0]) <= 1000, lines[0][:200]
    assert ": unexpected " not in lines[0], lines[0][:300]


@pytest.mark.parametrize("argv", [c[1] for c in SIM_CASES], ids=[c[0] for c in SIM_CASES])
def test_bad_spec_or_timing_fails_before_work(argv, files, capsys, monkeypatch):
    """A bad campaign spec or timing file fails in one line before any worker or solve: the
    work is replaced by a tripwire that main() would report as "unexpected"."""
    from hybridmem.sim import calibrate, campaign_run, run

    def tripwire(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("validation let a bad input reach the work")

    for mod, name in ((campaign_run, "run_campaign"), (campaign_run, "cell_job"),
                      (run, "run_sim"), (calibrate, "fit")):
        monkeypatch.setattr(mod, name, tripwire)
    code, out = _run_case(argv, files, capsys)
    _assert_one_line(code, out)


def test_good_spec_and_timing_pass_the_same_checks(files, capsys, monkeypatch):
    """Negative control of the sweep above: the valid spec and timing file reach the tripwire
    (the work), so the refusals above come from validation."""
    from hybridmem.sim import calibrate, campaign_run
    from hybridmem.sim.campaign_spec import load_spec

    assert len(load_spec(files["camp_good"]).cells) == 2
    reached = []
    monkeypatch.setattr(campaign_run, "run_campaign",
                        lambda *a, **k: reached.append("campaign") or 1 / 0)
    monkeypatch.setattr(calibrate, "fit", lambda *a, **k: reached.append("fit") or 1 / 0)
    for argv in (["campaign", files["camp_good"], "--out", files["out"] + "/camp"],
                 ["sim", "calibrate", files["timing_good"]]):
        assert main(argv) == 2  # the tripwire's ZeroDivisionError, reported as unexpected
    assert reached == ["campaign", "fit"]
    capsys.readouterr()


@pytest.mark.parametrize("argv", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2(argv, files, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # an engine start would be an ImportError
    code, out = _run_case(argv, files, capsys)
    assert "Traceback" not in out.err + out.out
    lines = [ln for ln in out.err.splitlines() if ln.strip()]
    assert code == 2, (code, out.err[-2000:])
    assert len(lines) == 1, out.err[-2000:]
    assert len(lines[0]) <= 1000, lines[0][:200]
    assert "not installed" not in lines[0], "validation let a bad input reach the engine"
    # validated at the boundary, not only caught by main()'s last line of defence
    assert ": unexpected " not in lines[0], lines[0][:300]


def test_good_inputs_still_work(files, capsys):
    """Negative control: the same fixtures, valid, exit 0 (so the sweep's 2s mean refusal)."""
    assert main(["trace", "verify", files["trace"]]) == 0
    assert main(["lineage", files["parquet"]]) == 0
    assert main(["lineage", "query", files["parquet"], "--sql", "SELECT 1 AS one"]) == 0
    assert main(["stats", "contrast", files["good"], "--num", "a", "--den", "b"]) == 0
    assert main(["plan", "--model", files["cfg_good"], "--budget", "b63"]) == 0
    capsys.readouterr()




@pytest.mark.parametrize("exc,code,needle", [
    (KeyError("surprise"), 2, "unexpected KeyError"),
    (RecursionError(), 2, "nested too deeply"),
    (KeyboardInterrupt(), 130, "interrupted"),
])
def test_last_line_of_defence(capsys, monkeypatch, exc, code, needle):
    """An exception no validation foresaw still gives one line and exit 2, not a traceback
    (exit 1 would read as "not accepted"); Ctrl-C stays 130."""
    import hybridmem.cli.plan as plan

    def boom(_args):
        raise exc

    monkeypatch.setattr(plan, "run", boom)  # add_parser binds plan.run when main() builds
    assert main(["plan", "--model", "falcon-h1-7b", "--budget", "b63"]) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err
