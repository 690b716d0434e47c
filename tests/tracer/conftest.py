"""Every tracer test runs twice: on the compiled writer (``c``, tracer/_ctrace.c) and on the
pure-Python reference (``python``, ``HYBRIDMEM_TRACER_PURE=1``). The ``c`` run skips, saying
why, where the extension was not built (its compile is optional at install time)."""

import pytest

from tracer import accel


@pytest.fixture(autouse=True, params=["c", "python"])
def writer_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "c":
        if accel.ACCELERATED is None:
            pytest.skip(f"compiled trace writer not built: {accel.UNAVAILABLE}")
        monkeypatch.delenv(accel.PURE_ENV, raising=False)
    else:
        monkeypatch.setenv(accel.PURE_ENV, "1")
    return str(request.param)
