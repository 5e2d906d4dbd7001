#!/usr/bin/env python3
# A small, deterministic data-parallel training run for Fallow's gang tests: every rank trains the
# same float64 MLP on its shard of synthetic regression data, gradients are all-reduced over gloo,
# and the gang checkpoints into $FALLOW_CHECKPOINT_DIR and resumes from the newest checkpoint any
# rank still holds. `final loss=%.10f steps=N` and `model digest=HEX` come out the same, bit for
# bit, whether the run went through uninterrupted or was killed and resumed by a gang whose ranks
# moved (to a node with an empty checkpoint directory, or one holding another rank's file).
#
# Usage: train.py [--seed 1] [--steps 60] [--checkpoint-every 5] [--step-sleep 0.2]
#                 [--samples 3000] [--features 16] [--timeout-s 120 (or $FALLOW_GANG_TIMEOUT_S)]
# Needs MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (env:// rendezvous); FALLOW_CHECKPOINT_DIR is
# optional (no checkpoints without it).
# Prints: `fresh start` or `resumed from step K (sent by rank S, local checkpoint step L)`,
# `step K loss=L` per step, `checkpoint step K` per checkpoint, then `final loss=%.10f steps=N`
# (the global mean loss after the last step) and `model digest=HEX`, equal on every rank.
# Exit codes: 0 done; 1 the gang broke (rendezvous timed out, a peer vanished); 2 the environment
#             lacks a variable the rendezvous needs; 4 the checkpoint directory cannot be written.
import argparse
import datetime
import glob
import hashlib
import io
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

REQUIRED = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
CHECKPOINT_FORMAT = 1
HIDDEN_UNITS = 32
LEARNING_RATE = 0.01


def parse_args():
    parser = argparse.ArgumentParser(description="Fallow gang training run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--step-sleep", type=float, default=0.2, help="seconds to sleep after each step")
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--timeout-s", type=float, default=float(os.environ.get("FALLOW_GANG_TIMEOUT_S", "120")))
    return parser.parse_args()


def make_data(seed, samples, features):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=generator, dtype=torch.float64)
    weights = torch.randn(features, 1, generator=generator, dtype=torch.float64)
    noise = torch.randn(samples, 1, generator=generator, dtype=torch.float64)
    y = torch.tanh(x @ weights) + 0.5 * torch.sin(2.0 * x[:, :1]) + 0.1 * noise
    return x, y


def make_model(seed, features):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(features, HIDDEN_UNITS, dtype=torch.float64),
        torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN_UNITS, 1, dtype=torch.float64),
    )


def config_of(args):
    # What a checkpoint must match to be resumed: everything that changes the math.
    return {"seed": args.seed, "samples": args.samples, "features": args.features,
            "hidden": HIDDEN_UNITS, "lr": LEARNING_RATE}


def say(message):
    print(message, flush=True)


def checkpoint_path(directory, rank):
    return os.path.join(directory, f"train-rank{rank}.pt")


def newest_local_checkpoint(directory, config):
    """(step, file bytes) of the newest usable checkpoint in this rank's directory, or (-1, None).

    Any rank's file will do: the ranks of one gang write identical checkpoints, and a directory
    may hold a file of another rank number after the gang was repaired."""
    best = (-1, None)
    if not directory:
        return best
    for path in sorted(glob.glob(os.path.join(directory, "train-rank*.pt"))):
        try:
            with open(path, "rb") as file:
                blob = file.read()
            state = torch.load(io.BytesIO(blob), map_location="cpu")
        except Exception as error:  # a torn or foreign file is skipped, not fatal
            say(f"ignoring checkpoint {path}: {error}")
            continue
        if state.get("format") != CHECKPOINT_FORMAT or state.get("config") != config:
            say(f"ignoring checkpoint {path}: written by another configuration")
            continue
        if state["step"] > best[0]:
            best = (state["step"], blob)
    return best


def write_checkpoint(directory, rank, step, config, model, optimizer):
    state = {"format": CHECKPOINT_FORMAT, "step": step, "config": config,
             "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    path = checkpoint_path(directory, rank)
    temporary = path + ".tmp"
    with open(temporary, "wb") as file:
        torch.save(state, file)
        file.flush()
        os.fsync(file.fileno())
    # Atomic: a replica killed mid-write leaves the previous checkpoint whole.
    os.replace(temporary, path)


def broadcast_bytes(blob, source, rank):
    length = torch.tensor([len(blob) if rank == source else 0], dtype=torch.int64)
    dist.broadcast(length, src=source)
    if rank == source:
        buffer = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    else:
        buffer = torch.empty(int(length.item()), dtype=torch.uint8)
    dist.broadcast(buffer, src=source)
    return buffer.numpy().tobytes()


def resume(directory, config, model, optimizer, rank, world):
    """Agrees with the gang on the newest checkpoint any rank holds and loads it everywhere.

    Returns the step it holds, or 0 for a fresh start."""
    local_step, blob = newest_local_checkpoint(directory, config)
    newest = torch.tensor([local_step], dtype=torch.int64)
    dist.all_reduce(newest, op=dist.ReduceOp.MAX)
    newest = int(newest.item())
    if newest < 0:
        say("fresh start")
        return 0
    # The lowest rank that holds it sends it, so a replica on a fresh node resumes too.
    source = torch.tensor([rank if local_step == newest else world], dtype=torch.int64)
    dist.all_reduce(source, op=dist.ReduceOp.MIN)
    source = int(source.item())
    state = torch.load(io.BytesIO(broadcast_bytes(blob, source, rank)), map_location="cpu")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    say(f"resumed from step {newest} (sent by rank {source}, local checkpoint step {local_step})")
    return newest


def model_digest(model):
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def train(args):
    rank, world = dist.get_rank(), dist.get_world_size()
    directory = os.environ.get("FALLOW_CHECKPOINT_DIR") or None
    config = config_of(args)
    x, y = make_data(args.seed, args.samples, args.features)
    begin, end = rank * args.samples // world, (rank + 1) * args.samples // world
    x_shard, y_shard = x[begin:end], y[begin:end]
    model = make_model(args.seed, args.features)
    parameters = list(model.parameters())
    optimizer = torch.optim.Adam(parameters, lr=LEARNING_RATE)
    say(f"train rank={rank} world={world} shard={begin}..{end} gang_epoch={os.environ.get('FALLOW_GANG_EPOCH', '')}"
        f" checkpoint_dir={directory or '-'}")

    def global_loss_tensor():
        # Sum of squared errors on the shard scaled by world/samples: after SUM then / world it is
        # the global mean, exactly, whatever the shard sizes.
        return ((model(x_shard) - y_shard) ** 2).sum() * (world / args.samples)

    start = resume(directory, config, model, optimizer, rank, world)
    for step in range(start + 1, args.steps + 1):
        optimizer.zero_grad(set_to_none=False)
        loss = global_loss_tensor()
        loss.backward()
        # One collective per step: the gradients and the loss, flattened together.
        flat = torch.cat([parameter.grad.reshape(-1) for parameter in parameters] + [loss.detach().reshape(1)])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat.div_(world)
        offset = 0
        for parameter in parameters:
            count = parameter.numel()
            parameter.grad.copy_(flat[offset:offset + count].view_as(parameter))
            offset += count
        optimizer.step()
        say(f"step {step} loss={flat[-1].item():.10f}")
        if directory and (step % args.checkpoint_every == 0 or step == args.steps):
            write_checkpoint(directory, rank, step, config, model, optimizer)
            say(f"checkpoint step {step}")
        if args.step_sleep > 0:
            time.sleep(args.step_sleep)
    with torch.no_grad():
        final = global_loss_tensor().reshape(1)
    dist.all_reduce(final, op=dist.ReduceOp.SUM)
    final.div_(world)
    say(f"final loss={final.item():.10f} steps={args.steps}")
    say(f"model digest={model_digest(model)}")


def main():
    args = parse_args()
    # One thread: the same arithmetic in the same order on every node and every run.
    torch.set_num_threads(1)
    missing = [name for name in REQUIRED if not os.environ.get(name)]
    if missing:
        print(f"train: the environment lacks {', '.join(missing)}", file=sys.stderr, flush=True)
        return 2
    directory = os.environ.get("FALLOW_CHECKPOINT_DIR")
    if directory:
        try:
            os.makedirs(directory, exist_ok=True)
            probe = os.path.join(directory, f".probe-{os.getpid()}")
            with open(probe, "wb"):
                pass
            os.remove(probe)
        except OSError as error:
            print(f"train: cannot write checkpoints to {directory}: {error}", file=sys.stderr, flush=True)
            return 4
    try:
        dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=args.timeout_s))
        train(args)
        dist.destroy_process_group()
    except Exception as error:  # whatever broke the gang, the caller sees exit 1 and why
        traceback.print_exc()
        print(f"train: the gang broke: {error}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
