"""``lineage views`` answers from views_catalog.json while it is fresh, without DuckDB."""

import json
import subprocess
import sys

from lineage import catalog


def test_catalog_file_is_fresh_and_equals_the_live_catalog():
    data = json.loads(catalog.CATALOG.read_text())
    assert data["digest"] == catalog.digest(), "run: python -m lineage.catalog"
    assert catalog.describe(True) == catalog._live(True)
    assert catalog.describe(False) == catalog._live(False)


def test_stale_catalog_falls_back_to_duckdb(monkeypatch, tmp_path):
    stale = tmp_path / "views_catalog.json"
    data = json.loads(catalog.CATALOG.read_text())
    data["views"][0]["comment"] = "a stale comment"
    stale.write_text(json.dumps(data))
    monkeypatch.setattr(catalog, "CATALOG", stale)
    # control: while the digest matches, the (edited) file answers
    assert catalog.describe(True)[0][1] == "a stale comment"
    data["digest"] = "0" * 64
    stale.write_text(json.dumps(data))
    assert catalog.describe(True)[0][1] != "a stale comment"  # the live catalog answers


def test_views_command_imports_no_duckdb():
    code = ("import sys; from hybridmem.cli.main import main; main(['lineage', 'views']); "
            "print('duckdb' in sys.modules, 'torch' in sys.modules, file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stderr.strip().endswith("False False") and "episodes:" in r.stdout
