"""The sweep example (examples/sweep.py) against `fallow dev`: 50 bronze evaluation jobs, each
a process on a tenth of a GPU, and every result collected from the jobs' output."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from .conftest import PACKAGE, Dev

SWEEP = PACKAGE / "examples" / "sweep.py"
#: The sweep's limit on dev: 50 short jobs, at most 20 at once on two GPUs in tenths.
SWEEP_S = 150


def test_a_sweep_of_fifty_bronze_evaluations_collects_every_result(dev: Dev) -> None:
    env = {**os.environ, "FALLOW_URL": dev.url, "FALLOW_API_KEY": dev.key}
    answer = subprocess.run(
        [sys.executable, str(SWEEP), "--process", "--jobs", "50", "--timeout", str(SWEEP_S - 20)],
        capture_output=True,
        text=True,
        timeout=SWEEP_S,
        env=env,
    )
    print(answer.stdout)
    print(answer.stderr, file=sys.stderr)
    assert answer.returncode == 0, f"{answer.stdout}\n{answer.stderr}\n{dev.log()}"
    assert "50 of 50 results" in answer.stdout
    rows = [line for line in answer.stdout.splitlines() if re.match(r"\s*\d+\s+\d\.\d{4}\s+-?\d", line)]
    assert len(rows) == 50, answer.stdout
    assert all(" finished " in row for row in rows), answer.stdout
    xs = sorted(float(row.split()[1]) for row in rows)
    assert xs[0] == 0.0 and xs[-1] == 1.0
    assert re.search(r"best: x = 0\.2\d+", answer.stdout), answer.stdout
