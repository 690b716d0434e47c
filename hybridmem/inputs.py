"""Input files read whole, with a size cap (ground layer: imports only ``errors``).

A spec, a config.json, a cases file or a summary is read into memory at once; a device such as
/dev/zero or /dev/urandom (endless), a FIFO (it can block for ever) or a multi-gigabyte file
would exhaust memory or hang before any check ran. :func:`read_input_bytes` refuses anything
that is not a regular file and any file over its cap, in one line (the CLI's exit 2), and reads
at most ``limit + 1`` bytes, so a file that grows while it is read is refused too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hybridmem.errors import HybridMemError

PathLike = str | os.PathLike[str]
# a spec, config or summary of this project is kilobytes; 64 MiB leaves room for generated ones
SMALL_FILE_LIMIT = 64 << 20


class InputError(HybridMemError):
    """An input file that cannot be read safely (missing, not a regular file, too large)."""


def check_regular(path: PathLike, what: str = "input") -> Path:
    """``path`` as a Path once it names an existing regular file (links followed)."""
    raw = os.fspath(path)
    if not str(raw).strip():
        raise InputError(f"{what}: an empty path")
    p = Path(raw)
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        raise InputError(f"{what} {str(raw)!r} does not exist") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{what} {str(raw)!r}: {exc}") from None
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file (a device or pipe " \
            "could be endless)"
        raise InputError(f"{what} {str(raw)!r} is {kind}")
    return p


def read_input_bytes(path: PathLike, what: str = "input",
                     limit: int = SMALL_FILE_LIMIT) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (:class:`InputError` otherwise)."""
    p = check_regular(path, what)
    try:
        with open(p, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise InputError(f"cannot read {what} {str(p)!r}: {exc}") from None
    if len(data) > limit:
        raise InputError(f"{what} {str(p)!r} is over {limit:,} bytes; refusing to read it")
    return data


def read_input_text(path: PathLike, what: str = "input", limit: int = SMALL_FILE_LIMIT) -> str:
    """:func:`read_input_bytes` decoded as UTF-8 (one-line error on invalid bytes)."""
    data = read_input_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} {os.fspath(path)!r} is not UTF-8 text ({exc.reason} at byte "
                         f"{exc.start})") from None
