"""A ``vllm serve`` subprocess on 127.0.0.1: start, wait for /health, stop cleanly, always reap.

::

    start()  ── python -m vllm.entrypoints.openai.api_server --host 127.0.0.1 --port P ...
                 (own session: API server, engine core and worker share one process group)
    wait_ready(timeout) ── GET /health == 200, or the process died (log tail), or timeout
    stop() ── SIGINT to the API server -> it SIGTERMs the engine core, which drains
              (--shutdown-timeout), shuts the scheduler down (trace END) and exits
           ── still alive after ``grace`` s: SIGTERM to the group, then SIGKILL to the group
    the caller killed ── SIGTERM (hybridmem.engines.http_run turns it into SystemExit, so the
              context manager stops the server) or SIGKILL (Linux: the server was started with
              PR_SET_PDEATHSIG, so the kernel sends it SIGTERM when the caller dies)

The server binds to the loopback address only; the port is a free one picked just before start.
Its stdout and stderr go to ``log_path``. Errors a caller can act on raise
:class:`~hybridmem.errors.HybridMemError` with the log path.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hybridmem.errors import HybridMemError

HOST = "127.0.0.1"  # never any other address
SERVED_NAME = "hybridmem"
DRAIN_S = 20  # vLLM --shutdown-timeout: the engine core's grace to drain and close the trace


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class ServerSettings:
    """The engine settings the server gets; the same ones the in-process driver passes."""

    model: Path
    dtype: str
    seed: int
    max_model_len: int
    cap: int                 # max_num_seqs
    prefix_caching: bool
    kv_blocks: int | None
    kv_cache_bytes: int
    extra_args: tuple[str, ...] = ()  # e.g. organization mode's scheduler seam and settings
    chunk_tokens: int | None = None  # max_num_batched_tokens


def server_command(s: ServerSettings, port: int) -> list[str]:
    """argv of the server: this interpreter, vLLM's OpenAI API server, loopback only."""
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--host", HOST, "--port", str(port),
        "--model", str(s.model), "--tokenizer", str(s.model),
        "--served-model-name", SERVED_NAME,
        "--dtype", s.dtype, "--seed", str(s.seed),
        "--max-model-len", str(s.max_model_len), "--max-num-seqs", str(s.cap),
        "--enforce-eager",
        "--enable-prefix-caching" if s.prefix_caching else "--no-enable-prefix-caching",
        "--kv-cache-memory-bytes", str(s.kv_cache_bytes),
        "--enable-prompt-tokens-details",  # usage.prompt_tokens_details.cached_tokens
        "--shutdown-timeout", str(DRAIN_S),
    ]
    if s.kv_blocks is not None:
        argv += ["--num-gpu-blocks-override", str(s.kv_blocks)]
    if s.chunk_tokens is not None:
        argv += ["--max-num-batched-tokens", str(s.chunk_tokens)]
    return argv + list(s.extra_args)


def _get(url: str, timeout: float) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (loopback URL)
            return int(r.status), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


class VllmServer:
    """One server process; use as a context manager so it is always stopped and reaped."""

    def __init__(self, settings: ServerSettings, log_path: Path, env: dict[str, str]) -> None:
        self.settings = settings
        self.log_path = Path(log_path)
        self.env = env
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> None:
        assert self.proc is None, "server started twice; this indicates a driver bug"
        self.port = free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            server_command(self.settings, self.port), stdin=subprocess.DEVNULL,
            stdout=self._log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True,
            preexec_fn=_parent_death_signal(os.getpid()) if DIE_WITH_PARENT else None,
        )

    def wait_ready(self, timeout: float) -> float:
        """Seconds until GET /health answered 200. Raises if the server died or took too long."""
        assert self.proc is not None, "wait_ready before start; this indicates a driver bug"
        t0 = time.perf_counter()
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise HybridMemError(f"vLLM server exited with code {rc} before it was ready; "
                                     f"see {self.log_path}: {self.log_tail()}")
            try:
                status, _ = _get(self.url + "/health", timeout=2.0)
                if status == 200:
                    return time.perf_counter() - t0
            except OSError:
                pass  # not listening yet
            if time.perf_counter() - t0 > timeout:
                raise HybridMemError(f"vLLM server not ready after {timeout:.0f} s "
                                     f"(--server-timeout); see {self.log_path}")
            time.sleep(0.5)

    def get(self, path: str, timeout: float = 10.0) -> bytes:
        status, body = _get(self.url + path, timeout)
        if status != 200:
            raise HybridMemError(f"GET {path} answered HTTP {status}; see {self.log_path}")
        return body

    def stop(self, grace: float = DRAIN_S + 15.0) -> int | None:
        """Stop the server: SIGINT, then SIGTERM / SIGKILL to its group. Returns its exit code
        (None if it had to be killed)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        clean: int | None = None
        try:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    clean = proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    clean = None
            else:
                clean = proc.returncode
        finally:
            for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                if not _group_alive(proc.pid):
                    break
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                _wait_group(proc, wait)
            if proc.poll() is None:
                proc.wait(timeout=5.0)
            if self._log is not None:
                self._log.close()
                self._log = None
        return clean

    def log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(t.strip() for t in text[-lines:])

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# the server is in its own session (a terminal's Ctrl-C must reach the driver, which drains it);
# without a parent-death signal a driver killed by SIGKILL would leave it serving on its port
DIE_WITH_PARENT = sys.platform == "linux"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _parent_death_signal(parent: int) -> Any:
    """A ``preexec_fn`` (runs in the child before exec): SIGTERM when the thread that started
    it dies, even by SIGKILL (Linux ``prctl``); if the parent is already gone, SIGTERM now.
    Start the server from the thread that outlives it (the main thread does)."""

    def arm() -> None:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_group(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait until no process of the group is left (reaping the leader, our child)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc.poll()
        if not _group_alive(proc.pid):
            return
        time.sleep(0.1)
