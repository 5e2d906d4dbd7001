#!/usr/bin/env python3
"""A sweep of bronze evaluation jobs: each evaluates one point of a parameter and prints its
result as a JSON line; the sweep submits them all, waits for each, reads each result from the
job's output, and prints a table with the best point.

Against `fallow dev` (its node runs jobs as processes on this host):

    export FALLOW_URL=http://127.0.0.1:7070 FALLOW_API_KEY=$(cat fallow-dev/tenant.key)
    python3 clients/python/examples/sweep.py --process

Without `--process` each job runs in a container image (`--image`, python:3.12-slim).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from typing import Dict, List, Optional

from fallow_client import Client, FallowError, JobRequest, JobView, dollars

#: What each job runs: one point of the sweep (X in its environment), its result on stdout.
EVALUATE = """\
import json, math, os
x = float(os.environ["X"])
loss = (x - 0.3) ** 2 + 0.05 * math.sin(20 * x)
print(json.dumps({"x": x, "loss": round(loss, 6)}), flush=True)
"""


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="the coordinator (default: FALLOW_URL, else http://127.0.0.1:7070)")
    parser.add_argument("--api-key", help="a tenant's API key (default: FALLOW_API_KEY)")
    parser.add_argument("--jobs", type=int, default=50, help="points in the sweep (default 50)")
    parser.add_argument(
        "--process",
        action="store_true",
        help="run each job as a process on its node (as `fallow dev` does), with this Python",
    )
    parser.add_argument("--image", default="python:3.12-slim", help="the container image, without --process")
    parser.add_argument(
        "--gpu-share",
        type=float,
        default=0.1,
        help="the share of one GPU each job takes (default 0.1: ten jobs per GPU); 0 for CPU-only jobs",
    )
    parser.add_argument("--max-price", default="2.00", help="the most paid per GPU-hour, dollars (default 2.00)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for the sweep (default 600)")
    return parser.parse_args(argv)


def job_for(point: int, x: float, args: argparse.Namespace, sweep_id: str) -> JobRequest:
    if args.process:
        program, command, runtime = sys.executable, ["-c", EVALUATE], "process"
    else:
        program, command, runtime = args.image, ["python", "-c", EVALUATE], None
    return JobRequest(
        name=f"sweep-{point:02d}",
        image=program,
        command=command,
        runtime=runtime,
        env={"X": repr(x)},
        gpu_share_milli=round(args.gpu_share * 1000) or None,
        tier="bronze",
        class_="eval",
        max_price_per_gpu_hour=args.max_price,
        max_runtime_s=600,
        # Submitting the sweep again (a retry after a dropped connection) makes no second job.
        client_token=f"{sweep_id}-{point}",
    )


def result_of(client: Client, job: JobView) -> Optional[Dict[str, float]]:
    """The job's result: the last JSON line of its output."""
    for line in reversed(client.log_text(job.id).splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict) and "loss" in found:
            return found
    return None


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    sweep_id = f"sweep-{uuid.uuid4().hex[:12]}"
    points = [index / max(1, args.jobs - 1) for index in range(args.jobs)]
    started = time.monotonic()
    with Client(args.url, args.api_key) as client:
        submitted = [client.submit(job_for(index, x, args, sweep_id)) for index, x in enumerate(points)]
        print(f"submitted {len(submitted)} jobs ({submitted[0].id}–{submitted[-1].id})", file=sys.stderr)
        rows = []
        for job in submitted:
            left = args.timeout - (time.monotonic() - started)
            try:
                ended = client.wait(job.id, timeout=max(1.0, left))
            except TimeoutError as error:
                print(f"sweep: {error}; cancelling the rest", file=sys.stderr)
                for other in submitted:
                    try:
                        client.cancel(other.id)
                    except FallowError:
                        pass
                return 1
            rows.append((ended, result_of(client, ended)))
    elapsed = time.monotonic() - started

    print(f"{'JOB':>5}  {'X':>8}  {'LOSS':>10}  {'STATE':<9}  {'EXIT':>4}  {'COST':>10}")
    for job, result in sorted(rows, key=lambda row: float(row[0].spec.env["X"]) if row[0].spec.env else 0):
        x = float(job.spec.env["X"]) if job.spec.env else float("nan")
        loss = f"{result['loss']:.6f}" if result else "-"
        cost = dollars(job.cost_micros)
        print(f"{job.id:>5}  {x:>8.4f}  {loss:>10}  {job.state:<9}  {job.exit_status()!s:>4}  ${cost:>9}")
    results = [result for _, result in rows if result]
    total = sum(job.cost_micros for job, _ in rows)
    print(f"{len(results)} of {len(rows)} results in {elapsed:.1f} s, ${dollars(total)} in all")
    if results:
        best = min(results, key=lambda result: result["loss"])
        print(f"best: x = {best['x']:.4f}, loss = {best['loss']:.6f}")
    return 0 if len(results) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
