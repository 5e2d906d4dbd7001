#!/usr/bin/env python3
# Gang rendezvous check for Fallow: joins the gang described by the torchrun-style environment
# (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, env:// init) over gloo, all-reduces (rank + 1) with
# SUM and prints `allreduce rank=R world=W sum=S`, where S must be W * (W + 1) / 2.
#
# Usage: allreduce.py [--timeout-s SECONDS]      (default 120, or $FALLOW_GANG_TIMEOUT_S)
# Exit codes: 0 the sum is right; 1 the gang broke (rendezvous timed out, a peer vanished);
#             2 the environment lacks a variable the rendezvous needs; 3 the sum is wrong.
import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist

REQUIRED = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


def main():
    parser = argparse.ArgumentParser(description="Fallow gang rendezvous check")
    parser.add_argument("--timeout-s", type=float, default=float(os.environ.get("FALLOW_GANG_TIMEOUT_S", "120")))
    args = parser.parse_args()
    missing = [name for name in REQUIRED if not os.environ.get(name)]
    if missing:
        print(f"allreduce: the environment lacks {', '.join(missing)}", file=sys.stderr, flush=True)
        return 2
    master = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    print(
        f"gang_epoch={os.environ.get('FALLOW_GANG_EPOCH', '')} master={master}"
        f" peers={os.environ.get('FALLOW_PEERS', '')} lease={os.environ.get('FALLOW_LEASE_ID', '')}",
        flush=True,
    )
    try:
        # The timeout bounds the rendezvous and every collective: a missing peer fails loudly.
        dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=args.timeout_s))
        rank, world = dist.get_rank(), dist.get_world_size()
        value = torch.tensor([rank + 1], dtype=torch.int64)
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        total = int(value.item())
        print(f"allreduce rank={rank} world={world} sum={total}", flush=True)
        dist.destroy_process_group()
    except Exception as error:  # whatever broke the gang, the caller sees exit 1 and why
        print(f"allreduce: the gang broke: {error}", file=sys.stderr, flush=True)
        return 1
    expected = world * (world + 1) // 2
    if total != expected:
        print(f"allreduce: sum {total} is wrong, expected {expected}", file=sys.stderr, flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
