"""Child process of tests/test_cli_memory_limits.py: CLI calls under an address-space limit.

    python -m tests.memory_limit_child HEADROOM_BYTES CASES.json [--uncapped-reads]

Imports the CLI and torch (what the heaviest of these commands import) first, measures the
process's address space (``VmSize``) as the import baseline, then caps it at baseline + headroom
with ``RLIMIT_AS`` and runs every case in turn in-process through ``hybridmem.cli.main.main``,
each with an alarm; prints one JSON object: the baseline, the limit and each case's exit code,
stderr and seconds. A read or allocation without a bound fails past the limit with a
MemoryError (which ``main`` reports as "input too large to hold in memory") or kills the child.

``--uncapped-reads`` replaces the bounded input reader by a plain ``read()`` of whatever the
path names: the negative control, which must not pass.
"""

from __future__ import annotations

import contextlib
import io
import json
import resource
import signal
import sys
import time
from pathlib import Path


class CaseTimeout(BaseException):
    """Raised by the alarm; a BaseException, so the CLI's last line of defence lets it pass."""


def vm_size() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def _uncap_reads() -> None:
    import hybridmem.inputs as inputs

    def read_everything(path, what="input", limit=inputs.SMALL_FILE_LIMIT):  # noqa: ARG001
        with open(path, "rb") as fh:
            return fh.read()

    inputs.read_input_bytes = read_everything  # type: ignore[assignment]


def main() -> int:
    headroom, cases_file = int(sys.argv[1]), sys.argv[2]
    cases = json.loads(Path(cases_file).read_text())
    import torch  # noqa: F401  (the heaviest import of these commands, before the baseline)

    from hybridmem.cli.main import main as cli

    if "--uncapped-reads" in sys.argv[3:]:
        _uncap_reads()
    baseline = vm_size()
    limit = baseline + headroom
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    def alarm(signum, frame):  # noqa: ARG001
        raise CaseTimeout

    signal.signal(signal.SIGALRM, alarm)
    out = []
    for case in cases:
        err = io.StringIO()
        t = time.perf_counter()
        signal.alarm(int(case.get("timeout", 60)))
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code: int | str = cli(case["argv"])
        except CaseTimeout:
            code = "timeout"
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
        finally:
            signal.alarm(0)
        out.append({"name": case["name"], "code": code, "stderr": err.getvalue(),
                    "seconds": round(time.perf_counter() - t, 2)})
    print(json.dumps({"baseline": baseline, "limit": limit, "cases": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
