"""Tracer tests that write traces run twice: on the compiled writer (``c``, tracer/_ctrace.c) and
on the pure-Python reference (``python``, ``HYBRIDMEM_TRACER_PURE=1``). The ``c`` run skips,
saying why, where the extension was not built (its compile is optional at install time).

A module or test whose outcome cannot depend on the writer path says so with
``pytest.mark.writer_paths("default")``: it runs once, in the environment as it is (the compiled
writer when built). That is the reader-only modules (the reader has one, pure-Python path; the
file they damage is written once at import) and test_accel.py, whose tests name both writer
classes explicitly and compare them byte for byte. A test inside such a module that goes through
``TraceWriter(...)`` and must see both paths takes ``pytest.mark.writer_paths("c", "python")``.
"""

import pytest

from tracer import accel

BOTH = ("c", "python")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "writer_paths(*paths): the writer paths a tracer test "
                                       "runs on ('c', 'python', or 'default')")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "writer_path" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("writer_paths")
        paths = marker.args if marker is not None else BOTH
        metafunc.parametrize("writer_path", paths, indirect=True)


@pytest.fixture(autouse=True)
def writer_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "c":
        if accel.ACCELERATED is None:
            pytest.skip(f"compiled trace writer not built: {accel.UNAVAILABLE}")
        monkeypatch.delenv(accel.PURE_ENV, raising=False)
    elif request.param == "python":
        monkeypatch.setenv(accel.PURE_ENV, "1")
    return str(request.param)
