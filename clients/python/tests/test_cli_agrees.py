"""The Python loader and the CLI read job files alike (docs/job-files.md, "Normal forms"): for
every example in `examples/` and every sample here, `fallow job submit FILE --dry-run` (or
`fallow service deploy FILE --dry-run` for a file with a `service` section) prints the request
`load_job_file` (or `load_service_file`) makes, key for key; and both refuse each bad file at
the same line and column."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import List

import pytest

from fallow_client import JobFileError, load_job_file, load_service_file

from .conftest import JOBFILES, REPO, require_fallow_bin
from .test_jobfile import BAD, is_service_file

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
SAMPLES = sorted(JOBFILES.glob("*.yaml")) + sorted(JOBFILES.glob("*.json"))


def dry_run(path: Path) -> "subprocess.CompletedProcess[str]":
    """The CLI's dry run of a file, with no key, URL or config file to lean on."""
    binary = require_fallow_bin()
    form: List[str] = ["service", "deploy"] if is_service_file(path.read_text()) else ["job", "submit"]
    env = {name: value for name, value in os.environ.items() if not name.startswith("FALLOW_")}
    env["FALLOW_CONFIG"] = "/dev/null"
    return subprocess.run(
        [str(binary), *form, str(path), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def ours(path: Path) -> dict:
    load = load_service_file if is_service_file(path.read_text()) else load_job_file
    return load(path).to_dict()


def test_there_are_examples() -> None:
    assert EXAMPLES, f"no examples/*.yaml in {REPO}"


@pytest.mark.parametrize(
    "path", EXAMPLES + SAMPLES, ids=[f"examples/{p.name}" for p in EXAMPLES] + [p.name for p in SAMPLES]
)
def test_the_cli_sends_the_request_the_loader_makes(path: Path) -> None:
    answer = dry_run(path)
    assert answer.returncode == 0, f"the CLI refused {path}:\n{answer.stderr}"
    try:
        theirs = json.loads(answer.stdout)
    except json.JSONDecodeError as error:
        raise AssertionError(f"the CLI's dry run of {path} is not JSON ({error}):\n{answer.stdout}") from None
    assert ours(path) == theirs


@pytest.mark.parametrize("path", BAD, ids=[path.stem for path in BAD])
def test_the_cli_refuses_a_bad_file_where_the_loader_does(path: Path) -> None:
    with pytest.raises(JobFileError) as caught:
        ours(path)
    answer = dry_run(path)
    assert answer.returncode != 0, f"the CLI took {path}:\n{answer.stdout}"
    place = re.search(re.escape(str(path)) + r":(\d+):(\d+): ", answer.stderr)
    assert place, f"the CLI's refusal names no line and column:\n{answer.stderr}"
    assert (int(place.group(1)), int(place.group(2))) == (caught.value.line, caught.value.column), (
        f"the CLI: {answer.stderr.strip()}\nthe loader: {caught.value}"
    )
