"""What the tests share: the repository's paths, the `fallow` binary, and a real `fallow dev`
started once for the session (SIGTERM at the end, which must exit 0).

Without the binary (`FALLOW_BIN`, else `<repo>/target/debug/fallow`) the tests that need it
are skipped, each saying why; with `FALLOW_CI_REQUIRE_SERVICES=1` they fail instead.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List

import pytest

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent
REPO = PACKAGE.parent.parent
JOBFILES = HERE / "jobfiles"

#: How long `fallow dev` may take to be ready (a debug build on two cores), and to stop.
DEV_READY_S = 120.0
DEV_STOP_S = 60.0
READY_LINE = "Ctrl-C stops everything"


def fallow_bin() -> Path:
    return Path(os.environ.get("FALLOW_BIN") or REPO / "target" / "debug" / "fallow")


def require_fallow_bin() -> Path:
    """The binary, or the test skips loudly (fails under FALLOW_CI_REQUIRE_SERVICES=1)."""
    binary = fallow_bin()
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    why = f"no fallow binary at {binary}: build it with `cargo build -p fallow` (or set FALLOW_BIN)"
    if os.environ.get("FALLOW_CI_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{why}; FALLOW_CI_REQUIRE_SERVICES=1 needs it")
    print(f"SKIPPED: {why}", file=sys.stderr)
    pytest.skip(why)
    raise AssertionError("unreachable")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Dev:
    """A running `fallow dev`: its URL, the demo tenant's key, and its stderr so far."""

    url: str
    key: str
    data_dir: Path
    process: subprocess.Popen
    lines: List[str]

    def log(self) -> str:
        return "".join(self.lines[-200:])


def _start_dev(binary: Path, data_dir: Path) -> Dev:
    port = free_port()
    process = subprocess.Popen(
        [
            str(binary), "dev",
            "--data-dir", str(data_dir),
            "--listen", f"127.0.0.1:{port}",
            # Two simulated H100s whatever the host has, as on a machine without GPUs.
            "--simulate-gpus", "H100-SXM5:2",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "FALLOW_CONFIG": "/dev/null"},
    )  # fmt: skip
    lines: List[str] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            if READY_LINE in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + DEV_READY_S
    while not ready.wait(0.1):
        if process.poll() is not None:
            time.sleep(0.2)
            pytest.fail(f"fallow dev exited with {process.returncode} before it was ready:\n{''.join(lines)}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"fallow dev was not ready within {DEV_READY_S} s:\n{''.join(lines)}")
    key = (data_dir / "tenant.key").read_text().strip()
    return Dev(url=f"http://127.0.0.1:{port}", key=key, data_dir=data_dir, process=process, lines=lines)


@pytest.fixture(scope="session")
def dev() -> Iterator[Dev]:
    """One `fallow dev` for the session; stopped with SIGTERM, which must exit 0."""
    binary = require_fallow_bin()
    with tempfile.TemporaryDirectory(prefix="fallow-python-") as scratch:
        running = _start_dev(binary, Path(scratch) / "data")
        try:
            yield running
        finally:
            if running.process.poll() is None:
                running.process.send_signal(signal.SIGTERM)
            try:
                code = running.process.wait(DEV_STOP_S)
            except subprocess.TimeoutExpired:
                running.process.kill()
                running.process.wait()
                pytest.fail(f"fallow dev did not stop within {DEV_STOP_S} s of SIGTERM:\n{running.log()}")
            assert code == 0, f"fallow dev exited {code} on SIGTERM:\n{running.log()}"


@pytest.fixture
def client(dev: Dev) -> Iterator["object"]:
    from fallow_client import Client

    with Client(dev.url, dev.key) as connected:
        yield connected
