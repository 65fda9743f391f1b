"""Shared parts of the training examples: Fashion-MNIST from Debian's dataset-fashion-mnist
package, a small CNN, the command line, process-group setup for one or more backends, the
training loop and the evaluation.

Each example (train_ddp.py, train_zero.py, train_fsdp.py) only says how the model and the
optimizer are distributed; everything else is here, so the three train the same network on
the same batches from the same seed and their loss curves can be compared with each other
and across backends.

Run under torchrun (it sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK), e.g.

    build/bin/softrdma run -- torchrun --nproc_per_node 2 pytorch/examples/train_ddp.py

`--backend softrdma,gloo` trains once per backend in the same processes (the first backend
is the default group, the others are torch.distributed.new_group's), from the same seed,
and prints how far apart the loss curves are.
"""

import argparse
import gzip
import json
import os
import statistics
import struct
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

DATA_DIR = "/usr/share/datasets/fashion-mnist"  # Debian: dataset-fashion-mnist
# Mean and standard deviation of the training images' pixels (0..1).
PIXEL_MEAN = 0.2860
PIXEL_STD = 0.3530


def read_idx(path):
    """One gzipped IDX file (the MNIST format: big-endian magic whose low byte is the
    number of dimensions, then the dimensions, then uint8 data) as a uint8 tensor."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    (magic,) = struct.unpack(">I", raw[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, raw[4 : 4 + 4 * ndim])
    return torch.frombuffer(bytearray(raw[4 + 4 * ndim :]), dtype=torch.uint8).reshape(dims)


def load(split, data_dir=DATA_DIR):
    """(images [N, 1, 28, 28] float32 normalised, labels [N] int64) of split "train"
    (60,000) or "t10k" (10,000)."""
    images = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"))
    x = (images.float().div_(255.0).sub_(PIXEL_MEAN).div_(PIXEL_STD)).unsqueeze(1)
    return x, labels.long()


def make_cnn():
    """The network: two 5x5 convolutions with max-pooling, two fully connected layers
    (about 47,000 parameters; ~90% test accuracy on Fashion-MNIST after a few epochs)."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 5),  # 28 -> 24
        nn.ReLU(),
        nn.MaxPool2d(2),  # -> 12
        nn.Conv2d(16, 32, 5),  # -> 8
        nn.ReLU(),
        nn.MaxPool2d(2),  # -> 4
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def parse_args(description, argv=None):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--backend", default="softrdma",
                   help="torch.distributed backend, or a comma-separated list to train once "
                        "per backend and compare the loss curves (default softrdma)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per rank (default 64)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=0,
                   help="stop after this many steps (0: the whole epochs)")
    p.add_argument("--no-eval", action="store_true", help="skip the test-set evaluation")
    p.add_argument("--addrs", default="",
                   help="comma-separated softrdma device address per rank (sets SOFTRDMA_ADDR "
                        "of rank i to the i-th); default: each rank takes the first free "
                        "127.0.0.x")
    p.add_argument("--data", default=DATA_DIR, help="Fashion-MNIST directory")
    p.add_argument("--log-json", default="",
                   help="rank 0 writes the loss curves, step times and accuracy here")
    return p.parse_args(argv)


def setup(args):
    """Initialises torch.distributed (env://) with the first backend of --backend and a
    group per further backend. Returns {backend: group}."""
    backends = [b.strip().lower() for b in args.backend.split(",") if b.strip()]
    if args.addrs:
        addrs = args.addrs.split(",")
        os.environ["SOFTRDMA_ADDR"] = addrs[int(os.environ["RANK"]) % len(addrs)]
    if "softrdma" in backends:
        import softrdma_torch  # noqa: F401  registers backend "softrdma"
    # Gloo binds the interface of the host name; on a host whose name does not resolve
    # (containers) loopback is the one that works for single-host runs.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(backends[0])
    groups = {backends[0]: dist.group.WORLD}
    for b in backends[1:]:
        groups[b] = dist.new_group(backend=b)
    return groups


def train(args, group, distribute):
    """Trains make_cnn() from args.seed on the ranks of `group`.

    distribute(model, group, args) -> (module, optimizer) wraps the freshly seeded model
    for one strategy (DDP, ZeRO, FSDP-style). Every rank takes its batch_size slice
    of each global batch of a permutation seeded by (seed, epoch). Returns {"loss": mean
    loss over the ranks per step, "step_ms": wall time per step, "accuracy": test accuracy
    or None}."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    x, y = load("train", args.data)
    torch.manual_seed(args.seed)
    module, optimizer = distribute(make_cnn(), group, args)

    global_batch = args.batch_size * world
    steps_per_epoch = x.shape[0] // global_batch
    losses, step_ms = [], []
    step = 0
    for epoch in range(args.epochs):
        perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(args.seed + epoch))
        for i in range(steps_per_epoch):
            if args.max_steps and step >= args.max_steps:
                break
            idx = perm[i * global_batch + rank * args.batch_size :][: args.batch_size]
            t0 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(module(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            step_ms.append((time.perf_counter() - t0) * 1e3)
            losses.append(loss.detach())
            step += 1
    # One AllReduce for the whole curve: the per-step mean over the ranks.
    curve = torch.stack(losses) if losses else torch.zeros(0)
    dist.all_reduce(curve, group=group)
    curve /= world
    accuracy = None if args.no_eval else evaluate(module, group, args.data)
    return {"loss": curve.tolist(), "step_ms": step_ms, "accuracy": accuracy}


@torch.no_grad()
def evaluate(module, group, data_dir, batch=1000):
    """Test accuracy on the 10,000 t10k images, each rank scoring its share."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    x, y = load("t10k", data_dir)
    correct = torch.zeros(2, dtype=torch.int64)
    for start in range(rank * batch, x.shape[0], world * batch):
        pred = module(x[start : start + batch]).argmax(1)
        correct[0] += (pred == y[start : start + batch]).sum()
        correct[1] += pred.numel()
    dist.all_reduce(correct, group=group)
    return correct[0].item() / correct[1].item()


def summary_line(name, backend, world, result, warmup=5):
    ms = result["step_ms"][warmup:] or result["step_ms"]
    med = statistics.median(ms) if ms else float("nan")
    acc = result["accuracy"]
    loss = result["loss"]
    return (f"{name} {backend} ranks={world} steps={len(loss)} "
            f"first_loss={loss[0]:.4f} last_loss={loss[-1]:.4f} "
            f"step_ms_median={med:.2f}"
            + (f" test_accuracy={acc:.4f}" if acc is not None else ""))


def main(name, description, distribute, argv=None):
    """Parses the command line, trains once per backend and prints (rank 0) a summary line
    per backend and, for several backends, the largest difference of their loss curves."""
    args = parse_args(description, argv)
    groups = setup(args)
    results = {}
    for backend, group in groups.items():
        results[backend] = train(args, group, distribute)
        if dist.get_rank() == 0:
            print(summary_line(name, backend, dist.get_world_size(group), results[backend]),
                  flush=True)
    names = list(results)
    diffs = {}
    for other in names[1:]:
        a, b = results[names[0]]["loss"], results[other]["loss"]
        diffs[other] = max((abs(p - q) for p, q in zip(a, b)), default=0.0)
        if dist.get_rank() == 0:
            print(f"{name} loss curves {names[0]} vs {other}: max |difference| = "
                  f"{diffs[other]:.3g} over {min(len(a), len(b))} steps", flush=True)
    if args.log_json and dist.get_rank() == 0:
        with open(args.log_json, "w") as f:
            json.dump({"example": name, "world_size": dist.get_world_size(),
                       "results": results, "max_loss_difference": diffs}, f)
    dist.barrier()
    dist.destroy_process_group()
    return 0

