"""Micro-benchmark of the softrdma torch.distributed backend against Gloo, in the same run and
the same processes: all_reduce, all_gather and reduce_scatter of float32 torch tensors from
8 B to 64 MiB (total bytes, nccl-tests' convention), median time per operation and bus
bandwidth (docs/architecture.md: busbw = S/t · 2(n−1)/n for AllReduce, · (n−1)/n for
AllGather and ReduceScatter), and the ratio Gloo time / softrdma time.

Run under torchrun (bench/torch_bench.sh does, through `softrdma run`):

    build/bin/softrdma run -- torchrun --redirects 1 --tee 1 --nproc_per_node 2 \\
        bench/torch_bench.py [--max-bytes 64M] [--csv FILE]

Per size and backend: 5 rounds of (Gloo barrier, then N/5 operations back to back, N from
200 at small sizes down to 5 at 64 MiB); a round's time per operation is the slowest rank's;
each size reports the median round (nccl-tests times loops the same way; single timed
operations would mostly measure the skew of the barrier's exit).
Gloo in PyTorch 1.13 has no reduce_scatter: its column is what a Gloo user runs instead,
all_reduce of the whole input then keeping this rank's block ("gloo*").
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def sizes(lo, hi, factor):
    """lo, lo·factor, … up to hi, and hi itself."""
    s = lo
    while s < hi:
        yield s
        s *= factor
    yield hi


def iterations(nbytes, budget_bytes=256 << 20, lo=5, hi=200):
    """More iterations for small sizes: about budget_bytes moved per size and backend."""
    return max(lo, min(hi, budget_bytes // max(nbytes, 1)))


def make_op(coll, nbytes, world, rank, group, backend):
    """A closure running one operation of `coll` on `nbytes` (total) float32 bytes."""
    if coll == "all_reduce":
        t = torch.ones(max(1, nbytes // 4))
        return lambda: dist.all_reduce(t, group=group)
    per_rank = max(1, nbytes // 4 // world)
    if coll == "all_gather":
        x = torch.ones(per_rank)
        outs = [torch.empty(per_rank) for _ in range(world)]
        return lambda: dist.all_gather(outs, x, group=group)
    x = torch.ones(per_rank * world)
    out = torch.empty(per_rank)
    if backend == "gloo":
        def gloo_reduce_scatter():
            y = x.clone()
            dist.all_reduce(y, group=group)
            out.copy_(y[rank * per_rank : (rank + 1) * per_rank])
        return gloo_reduce_scatter
    return lambda: dist.reduce_scatter_tensor(out, x, group=group)


def bus_factor(coll, world):
    return 2 * (world - 1) / world if coll == "all_reduce" else (world - 1) / world


def time_op(op, iters, sync_group, repeats=5):
    """Seconds per operation: `repeats` rounds of (barrier, iters/repeats operations back to
    back), each round's time per operation taken from the slowest rank; the median round."""
    for _ in range(2):  # warm-up: registrations, algorithm scratch
        op()
    k = max(1, iters // repeats)
    times = torch.zeros(repeats, dtype=torch.float64)
    for i in range(repeats):
        dist.barrier(group=sync_group)
        t0 = time.perf_counter()
        for _ in range(k):
            op()
        times[i] = (time.perf_counter() - t0) / k
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=sync_group)
    return statistics.median(times.tolist())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--min-bytes", default="8")
    p.add_argument("--max-bytes", default="64M")
    p.add_argument("--factor", type=int, default=8)
    p.add_argument("--collectives", default="all_reduce,all_gather,reduce_scatter")
    p.add_argument("--csv", default="", help="rank 0 appends rows here")
    a = p.parse_args()
    import softrdma_torch  # noqa: F401

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("softrdma")
    gloo = dist.new_group(backend="gloo")
    groups = {"softrdma": dist.group.WORLD, "gloo": gloo}
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for coll in a.collectives.split(","):
        if rank == 0:
            print(f"# {coll}, {world} ranks, float32; time = µs per operation (median of 5 "
                  f"rounds, slowest rank); busbw GB/s (1e9 B/s)")
            print(f"# {'bytes':>10} {'iters':>6} {'softrdma_us':>12} {'gloo_us':>12} "
                  f"{'softrdma_busbw':>15} {'gloo_busbw':>11} {'gloo/softrdma':>14}", flush=True)
        for nbytes in sizes(parse_size(a.min_bytes), parse_size(a.max_bytes), a.factor):
            if coll != "all_reduce" and nbytes < 4 * world:
                continue
            iters = iterations(nbytes)
            t = {b: time_op(make_op(coll, nbytes, world, rank, g, b), iters, gloo)
                 for b, g in groups.items()}
            bw = {b: nbytes / t[b] * bus_factor(coll, world) / 1e9 for b in t}
            ratio = t["gloo"] / t["softrdma"]
            rows.append((coll, world, nbytes, iters, t["softrdma"], t["gloo"], bw["softrdma"],
                         bw["gloo"], ratio))
            if rank == 0:
                star = "*" if coll == "reduce_scatter" else " "
                print(f"  {nbytes:>10} {iters:>6} {t['softrdma'] * 1e6:>12.1f} "
                      f"{t['gloo'] * 1e6:>11.1f}{star} {bw['softrdma']:>15.3f} "
                      f"{bw['gloo']:>11.3f} {ratio:>14.2f}", flush=True)
    if rank == 0 and a.csv:
        new = not os.path.exists(a.csv)
        with open(a.csv, "a") as f:
            if new:
                f.write("collective,ranks,bytes,iters,softrdma_s,gloo_s,softrdma_busbw,"
                        "gloo_busbw,gloo_over_softrdma\n")
            for r in rows:
                f.write(",".join(str(v) for v in r) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
