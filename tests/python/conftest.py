"""Fixtures of the Python tests: a real cxltierd on a temporary socket.

Run by scripts/test.sh (stage python):
    PYTHONPATH=build/python CXLTIER_BIN=build/bin /usr/bin/python3 -m pytest -q tests/python
Tests wait for events with generous bounds (60 s), never for a fixed time.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("CXLTIER_BIN", ROOT / "build" / "bin"))

import cxltier  # noqa: E402  (PYTHONPATH names the build's package)

# 16 KiB blocks: 2 layers, 4 query heads on 2 KV heads of dim 32, float32, 16 tokens.
MODEL = cxltier.Model(layers=2, query_heads=4, kv_heads=2, head_dim=32, dtype_bytes=4,
                      block_tokens=16, name="pytest")
BLOCK = MODEL.block_bytes
assert BLOCK == 16384

# Tier 0 holds 8 blocks; LRU, whose set is easy to follow; no hysteresis.
ENGINE = f'[engine]\nblock_bytes = {BLOCK}\ntier0_budget = "{8 * BLOCK}"\npolicy = "lru"\nhysteresis_ticks = 0\n'


def wait_for(done, timeout: float = 60.0, what: str = "the condition") -> None:
    """Polls done() until it is true; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() >= deadline:
            if done():
                return
            pytest.fail(f"{what} did not happen in {timeout:.0f} s")
        time.sleep(0.01)


class Daemon:
    """A cxltierd in a child process, with its own socket, state dir and log."""

    def __init__(self, engine: str = ENGINE, tick_ms: int = 20) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="cxlt-py-"))
        self.socket = str(self.dir / "d.sock")
        self.config = self.dir / "cxltierd.toml"
        self.config.write_text(
            f'[daemon]\nsocket = "{self.socket}"\nstate_dir = "{self.dir / "state"}"\n'
            f'tick_ms = {tick_ms}\nlog_level = "info"\n'
            "[tiers]\nfast_nodes = [0]\nslow_nodes = [0]\n"
            '[metrics]\nlisten = "127.0.0.1:0"\n' + engine)
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.start()

    def start(self) -> None:
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        self.log_path = self.dir / f"daemon-{self.starts}.log"
        self.starts += 1
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([str(BIN / "cxltierd"), "--config", str(self.config)],
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not self.connectable():
            if self.proc.poll() is not None:
                raise RuntimeError(f"cxltierd exited {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() >= deadline:
                raise RuntimeError(f"cxltierd did not listen in 60 s:\n{self.log()}")
            time.sleep(0.01)

    def connectable(self) -> bool:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.socket)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return 0 if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def restart(self) -> None:
        assert self.stop() == 0, self.log()
        self.start()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        self.stop(signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def daemon():
    d = Daemon()
    yield d
    d.close()


@pytest.fixture
def client(daemon):
    with cxltier.Client(daemon.socket, MODEL, max_blocks=64, name="pytest") as c:
        yield c


def pool_bytes_tool() -> str:
    return str(BIN / "cxltier-pool-bytes")


def cxltier_bin(name: str) -> str:
    return str(BIN / name)
