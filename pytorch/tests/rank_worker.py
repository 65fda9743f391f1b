"""One rank of the backend's tests (started by harness.launch under `softrdma run`, with
torchrun's variables). Every check it runs becomes one entry {"ok", "detail"} of the JSON
file --result; pytest (test_*.py) turns the entries into test cases.

Modes:
  collectives  every collective x dtype x op on the softrdma group, each compared with the
               result of the same call on a Gloo group in the same processes (or, where
               Gloo 1.13 refuses the call — AVG, reduce_scatter, all_gather_into_tensor,
               bfloat16 in some collectives — with the result computed from every rank's
               inputs, which the test data makes known to every rank); --quick: the short
               set of the 4-rank run
  work         asynchronous Work semantics: wait / is_completed / wait(timeout) /
               get_future, isend/irecv in both directions, batch_isend_irecv, a pending
               irecv not blocking a later collective, a second softrdma group
  errors       refused calls (unsupported ReduceOp, dtype, any-source recv, non-contiguous
               tensor, bad tag), then a dead rank: rank 1 exits, rank 0's next collective
               must fail naming peer rank 1
"""

import argparse
import datetime
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

import softrdma_torch  # noqa: F401

R = dist.ReduceOp
OPS = {"sum": R.SUM, "prod": R.PRODUCT, "min": R.MIN, "max": R.MAX, "avg": R.AVG}
REDUCE_DTYPES = [torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16,
                 torch.bfloat16, torch.float32, torch.float64]
MOVE_DTYPES = REDUCE_DTYPES + [torch.bool, torch.int16, torch.complex64]


class Checks:
    """The results of this rank's checks, by name."""

    def __init__(self):
        self.entries = {}

    def record(self, name, ok, detail=""):
        prev = self.entries.get(name)
        if prev is not None and not prev["ok"]:
            return  # keep the first failure
        self.entries[name] = {"ok": bool(ok), "detail": str(detail)[:2000]}

    def run(self, name, fn):
        """Runs fn() -> (ok, detail); an exception is a failure with its traceback."""
        try:
            ok, detail = fn()
        except Exception:  # noqa: BLE001 - a test records every failure
            ok, detail = False, traceback.format_exc()
        self.record(name, ok, detail)


def data(dtype, count, rank, salt):
    """Rank `rank`'s input: small integers, so sums, products (of up to 4 ranks), minima,
    maxima and averages by 2 or 4 are exact in every dtype."""
    g = torch.Generator().manual_seed(7919 * salt + rank)
    lo = 0 if dtype in (torch.uint8, torch.bool) else -3
    x = torch.randint(lo, 4, (count,), generator=g)
    if dtype == torch.bool:
        return x > 1
    if dtype == torch.complex64:
        return torch.complex(x.float(), -x.float())
    return x.to(dtype)


def reduce_all(inputs, op, world):
    """The reduction of every rank's input, computed here (float64/int64, then the dtype)."""
    dtype = inputs[0].dtype
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    acc = inputs[0].to(wide)
    for t in inputs[1:]:
        t = t.to(wide)
        if op in ("sum", "avg"):
            acc = acc + t
        elif op == "prod":
            acc = acc * t
        elif op == "min":
            acc = torch.minimum(acc, t)
        else:
            acc = torch.maximum(acc, t)
    if op == "avg":
        acc = acc / world if dtype.is_floating_point else torch.div(acc, world,
                                                                    rounding_mode="trunc")
    return acc.to(dtype)


def same(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False, f"dtype/shape {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
    if torch.equal(a, b):
        return True, ""
    diff = (a != b).nonzero()
    i = diff[0].tolist() if diff.numel() else []
    return False, f"{diff.shape[0]} elements differ, first at {i}: {a[tuple(i)]} vs {b[tuple(i)]}"


def gloo_or(fn_gloo, expected):
    """Gloo's result when Gloo takes the call, else `expected()`; and which it was."""
    try:
        return fn_gloo(), "gloo"
    except (RuntimeError, ValueError):
        return expected(), "inputs"


def run_collectives(checks, quick):
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    if quick:
        reduce_dtypes, move_dtypes = [torch.int32, torch.bfloat16, torch.float32], [torch.float32, torch.bool]
        ops, counts = ["sum", "max", "avg"], [7, 70001]
    else:
        reduce_dtypes, move_dtypes = REDUCE_DTYPES, MOVE_DTYPES
        ops, counts = list(OPS), [1, 4099]
    big = [] if quick else [262147]  # ~1 MiB of float32: the ring and chunked paths
    salt = 0

    def name(coll, dtype, op, count):
        return f"{coll}[{str(dtype).replace('torch.', '')}-{op}-{count}]"

    for dtype in reduce_dtypes:
        for op in ops:
            for count in counts + (big if op == "sum" else []):
                salt += 1
                ins = [data(dtype, count, r, salt) for r in range(world)]
                x = ins[rank]

                def all_reduce():
                    y = x.clone()
                    dist.all_reduce(y, op=OPS[op])
                    ref, src = gloo_or(lambda: _gloo_all_reduce(x, op, gloo),
                                       lambda: reduce_all(ins, op, world))
                    ok, d = same(y, ref)
                    return ok, f"vs {src}: {d}"

                checks.run(name("all_reduce", dtype, op, count), all_reduce)

                def reduce():
                    root = world - 1
                    y = x.clone()
                    dist.reduce(y, dst=root, op=OPS[op])
                    def g():  # every rank joins Gloo's Reduce too
                        z = x.clone()
                        dist.reduce(z, dst=root, op=OPS[op], group=gloo)
                        return z
                    ref, src = gloo_or(g, lambda: reduce_all(ins, op, world))
                    if rank != root:
                        return same(y, x)  # non-roots keep their input
                    ok, d = same(y, ref)
                    return ok, f"vs {src}: {d}"

                checks.run(name("reduce", dtype, op, count), reduce)

                # ReduceScatter: every rank's input is world blocks of `count`.
                salt += 1
                rs_ins = [data(dtype, count * world, r, salt) for r in range(world)]
                xs = rs_ins[rank]

                def rs_ref():
                    # Gloo 1.13 has no reduce_scatter: Gloo's AllReduce, then this rank's block.
                    full, src = gloo_or(lambda: _gloo_all_reduce(xs, op, gloo),
                                        lambda: reduce_all(rs_ins, op, world))
                    return full[rank * count : (rank + 1) * count], src

                def reduce_scatter_tensor():
                    out = torch.empty(count, dtype=dtype)
                    dist.reduce_scatter_tensor(out, xs.clone(), op=OPS[op])
                    ref, src = rs_ref()
                    ok, d = same(out, ref)
                    return ok, f"vs {src}: {d}"

                def reduce_scatter_list():
                    out = torch.empty(count, dtype=dtype)
                    dist.reduce_scatter(out, list(xs.clone().chunk(world)), op=OPS[op])
                    ref, src = rs_ref()
                    ok, d = same(out, ref)
                    return ok, f"vs {src}: {d}"

                checks.run(name("reduce_scatter_tensor", dtype, op, count), reduce_scatter_tensor)
                checks.run(name("reduce_scatter", dtype, op, count), reduce_scatter_list)

    for dtype in move_dtypes:
        for count in counts + big:
            salt += 1
            ins = [data(dtype, count, r, salt) for r in range(world)]
            x = ins[rank]
            run_moves(checks, name, gloo, dtype, count, ins, x, rank, world, salt)

    checks.run("barrier", lambda: (dist.barrier() is None, ""))
    if not quick:
        checks.run("all_reduce_coalesced", lambda: _coalesced(rank, world))
        checks.run("empty_tensor", lambda: _empty(world))


def run_moves(checks, name, gloo, dtype, count, ins, x, rank, world, salt):
    """The collectives that only move data (any dtype)."""

    def broadcast():
        root = 1 % world
        y = x.clone()
        dist.broadcast(y, src=root)
        def g():
            z = x.clone()
            dist.broadcast(z, src=root, group=gloo)
            return z
        ref, src = gloo_or(g, lambda: ins[root])
        ok, d = same(y, ref)
        return ok, f"vs {src}: {d}"

    def all_gather_list():
        outs = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(outs, x)
        def g():
            z = [torch.empty_like(x) for _ in range(world)]
            dist.all_gather(z, x, group=gloo)
            return torch.cat(z)
        ref, src = gloo_or(g, lambda: torch.cat(ins))
        ok, d = same(torch.cat(outs), ref)
        return ok, f"vs {src}: {d}"

    def all_gather_into_tensor():
        out = torch.empty(count * world, dtype=dtype)
        dist.all_gather_into_tensor(out, x)
        def g():
            z = torch.empty(count * world, dtype=dtype)
            dist.all_gather_into_tensor(z, x, group=gloo)
            return z
        ref, src = gloo_or(g, lambda: torch.cat(ins))
        ok, d = same(out, ref)
        return ok, f"vs {src}: {d}"

    def all_gather_in_place():
        out = torch.empty(count * world, dtype=dtype)
        mine = out[rank * count : (rank + 1) * count]
        mine.copy_(x)
        dist.all_gather_into_tensor(out, mine)
        return same(out, torch.cat(ins))

    # AllToAll: rank r sends block j of its input to rank j.
    a2a_ins = [data(dtype, count * world, r, salt + 100000) for r in range(world)]
    xa = a2a_ins[rank]
    a2a_expected = torch.cat([a2a_ins[r][rank * count : (rank + 1) * count] for r in range(world)])

    def all_to_all_single():
        out = torch.empty_like(xa)
        dist.all_to_all_single(out, xa)
        def g():
            z = torch.empty_like(xa)
            dist.all_to_all_single(z, xa, group=gloo)
            return z
        ref, src = gloo_or(g, lambda: a2a_expected)
        ok, d = same(out, ref)
        return ok, f"vs {src}: {d}"

    def all_to_all_list():
        outs = [torch.empty(count, dtype=dtype) for _ in range(world)]
        dist.all_to_all(outs, list(xa.chunk(world)))
        return same(torch.cat(outs), a2a_expected)

    # Uneven splits: rank r sends (j + r) % 3 + count rows to rank j.
    def rows(src, dst):
        return (dst + src) % 3 + (count % 5)

    def all_to_all_uneven():
        send_splits = [rows(rank, j) for j in range(world)]
        recv_splits = [rows(j, rank) for j in range(world)]
        srcs = [data(dtype, sum(rows(r, j) for j in range(world)) * 2, r, salt + 200000)
                .reshape(-1, 2) for r in range(world)]
        out = torch.empty(sum(recv_splits), 2, dtype=dtype)
        dist.all_to_all_single(out, srcs[rank], recv_splits, send_splits)
        expected = []
        for r in range(world):
            off = sum(rows(r, j) for j in range(rank))
            expected.append(srcs[r][off : off + rows(r, rank)])
        exp = torch.cat(expected)
        def g():
            z = torch.empty_like(out)
            dist.all_to_all_single(z, srcs[rank], recv_splits, send_splits, group=gloo)
            return z
        ref, src = gloo_or(g, lambda: exp)
        ok1, d1 = same(out, exp)
        ok2, d2 = same(out, ref)
        return ok1 and ok2, f"expected: {d1}; vs {src}: {d2}"

    def gather():
        root = world - 1
        outs = [torch.empty_like(x) for _ in range(world)] if rank == root else None
        dist.gather(x, outs, dst=root)
        if rank != root:
            return True, ""
        return same(torch.cat(outs), torch.cat(ins))

    def scatter():
        root = 0
        out = torch.empty_like(x)
        src_list = [ins[r] for r in range(world)] if rank == root else None
        dist.scatter(out, src_list, src=root)
        return same(out, ins[rank])

    def send_recv():
        # A ring: send to the next rank, receive from the previous one (isend first, so
        # both directions are in flight at once).
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        out = torch.empty_like(x)
        reqs = [dist.isend(x, nxt, tag=3), dist.irecv(out, prv, tag=3)]
        for r in reqs:
            r.wait()
        return same(out, ins[prv])

    checks.run(name("broadcast", dtype, "-", count), broadcast)
    checks.run(name("all_gather", dtype, "-", count), all_gather_list)
    checks.run(name("all_gather_into_tensor", dtype, "-", count), all_gather_into_tensor)
    checks.run(name("all_gather_in_place", dtype, "-", count), all_gather_in_place)
    checks.run(name("all_to_all_single", dtype, "-", count), all_to_all_single)
    checks.run(name("all_to_all", dtype, "-", count), all_to_all_list)
    checks.run(name("all_to_all_uneven", dtype, "-", count), all_to_all_uneven)
    checks.run(name("gather", dtype, "-", count), gather)
    checks.run(name("scatter", dtype, "-", count), scatter)
    if world > 1:
        checks.run(name("send_recv", dtype, "-", count), send_recv)


def _gloo_all_reduce(x, op, gloo):
    z = x.clone()
    dist.all_reduce(z, op=OPS[op], group=gloo)
    return z


def _coalesced(rank, world):
    ts = [torch.full((n,), float(rank + 1)) for n in (3, 1000, 5)]
    dist.all_reduce_coalesced(ts)
    want = float(sum(range(1, world + 1)))
    return all(torch.all(t == want).item() for t in ts), ""


def _empty(world):
    t = torch.empty(0)
    dist.all_reduce(t)
    out = torch.empty(0)
    dist.all_gather_into_tensor(out, torch.empty(0))
    return t.numel() == 0 and out.numel() == 0, ""


# ---- work semantics -----------------------------------------------------------------------

def run_work(checks):
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    big = 1 << 18  # 1 MiB of float32: the rendezvous path, not eager

    def async_all_reduce():
        t = torch.full((big,), float(rank + 1))
        w = dist.all_reduce(t, async_op=True)
        ok = w.wait() is True and w.is_completed() and w.is_success()
        fut = w.get_future().wait()
        want = float(sum(range(1, world + 1)))
        return ok and torch.all(t == want).item() and fut[0] is not None and \
            torch.equal(fut[0], t), f"wait/is_completed/is_success/future: {ok}"

    def future_then():
        t = torch.ones(4)
        fut = dist.all_reduce(t, async_op=True).get_future()
        chained = fut.then(lambda f: f.value()[0] * 10)
        v = chained.wait()
        return torch.all(v == 10 * world).item(), str(v)

    def pending_irecv():
        # Rank 1's irecv cannot complete before rank 0 sends, which it does only after
        # rank 1 has looked at the Work: is_completed() is False, wait(timeout) times out,
        # then wait() returns once the data is there.
        if rank > 1:
            return True, ""
        buf = torch.zeros(big)
        if rank == 1:
            w = dist.irecv(buf, 0, tag=11)
            first = w.is_completed()
            timed_out = False
            try:
                w.wait(timeout=datetime.timedelta(milliseconds=200))
            except RuntimeError:
                timed_out = True
            still = w.is_completed()
            store.set("work/go", "1")
            ok = w.wait() and w.is_completed() and torch.all(buf == 42).item()
            return (not first and timed_out and not still and ok,
                    f"first={first} timed_out={timed_out} still={still} ok={ok}")
        store.wait(["work/go"])
        dist.send(torch.full((big,), 42.0), 1, tag=11)
        return True, ""

    def exchange_both_ways():
        # Both ranks isend before they irecv, 1 MiB each way: with blocking sends this
        # deadlocks; the backend posts both and lets them progress together.
        peer = rank ^ 1
        if peer >= world:
            return True, ""
        out = torch.zeros(big)
        s = dist.isend(torch.full((big,), float(rank)), peer, tag=5)
        r = dist.irecv(out, peer, tag=5)
        s.wait()
        r.wait()
        return torch.all(out == float(peer)).item(), ""

    def batch_p2p():
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        send = torch.full((big,), float(rank))
        recv = torch.zeros(big)
        ops = [dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prv)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return torch.all(recv == float(prv)).item(), ""

    def irecv_does_not_block_collective():
        # Rank 0 posts an irecv that rank 1 answers only after an AllReduce (and after rank 0
        # has looked at the irecv): the AllReduce queued behind the irecv must complete first.
        if world < 2 or rank > 1:
            dist.all_reduce(torch.ones(1))
            return True, ""
        if rank == 0:
            buf = torch.zeros(8)
            w = dist.irecv(buf, 1, tag=9)
            t = torch.ones(1)
            dist.all_reduce(t)
            before = w.is_completed()
            store.set("work/irecv-checked", "1")
            w.wait()
            return (not before) and t.item() == world and torch.all(buf == 9).item(), \
                f"irecv completed before the AllReduce: {before}"
        t = torch.ones(1)
        dist.all_reduce(t)
        store.wait(["work/irecv-checked"])
        dist.send(torch.full((8,), 9.0), 0, tag=9)
        return t.item() == world, ""

    def second_group():
        # Two softrdma groups (two communicators) in one process, used alternately.
        g2 = dist.new_group(backend="softrdma")
        a, b = torch.ones(1000), torch.full((1000,), 2.0)
        wa = dist.all_reduce(a, async_op=True)
        wb = dist.all_reduce(b, group=g2, async_op=True)
        wb.wait()
        wa.wait()
        return torch.all(a == world).item() and torch.all(b == 2 * world).item(), ""

    def tags_keep_order():
        # Two tags between one pair, the receiver posting them in the opposite order.
        if rank > 1 or world < 2:
            return True, ""
        if rank == 0:
            dist.send(torch.full((4,), 1.0), 1, tag=1)
            dist.send(torch.full((4,), 2.0), 1, tag=2)
            return True, ""
        a, b = torch.zeros(4), torch.zeros(4)
        wb = dist.irecv(b, 0, tag=2)
        wa = dist.irecv(a, 0, tag=1)
        wa.wait()
        wb.wait()
        return torch.all(a == 1).item() and torch.all(b == 2).item(), f"{a} {b}"

    for n, fn in [("async_all_reduce", async_all_reduce), ("future_then", future_then),
                  ("pending_irecv", pending_irecv), ("exchange_both_ways", exchange_both_ways),
                  ("batch_isend_irecv", batch_p2p),
                  ("irecv_does_not_block_collective", irecv_does_not_block_collective),
                  ("second_group", second_group), ("tags_keep_order", tags_keep_order)]:
        checks.run(n, fn)
        dist.barrier()


# ---- errors --------------------------------------------------------------------------------

def expect_error(fn, *words):
    try:
        fn()
    except RuntimeError as e:
        msg = str(e)
        return all(w in msg for w in words), msg.splitlines()[0] if msg else msg
    return False, "no error raised"


def run_errors(checks):
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(16)
    checks.run("refuse_band", lambda: expect_error(
        lambda: dist.all_reduce(t, op=R.BAND), "BAND", "not supported"))
    checks.run("refuse_bxor_reduce_scatter", lambda: expect_error(
        lambda: dist.reduce_scatter_tensor(torch.empty(8), torch.ones(8 * world), op=R.BXOR),
        "BXOR", "not supported"))
    checks.run("refuse_bool_reduction", lambda: expect_error(
        lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool)), "Bool", "cannot be reduced"))
    checks.run("refuse_int16_reduction", lambda: expect_error(
        lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16)), "Short", "cannot be reduced"))
    checks.run("refuse_any_source", lambda: expect_error(
        lambda: dist.recv(torch.empty(4)), "any source"))
    checks.run("refuse_non_contiguous", lambda: expect_error(
        lambda: dist.all_reduce(torch.ones(4, 4).t()), "contiguous"))
    checks.run("refuse_bad_tag", lambda: expect_error(
        lambda: dist.isend(t, (rank + 1) % world, tag=1 << 23), "tag"))
    checks.run("refuse_size_mismatch", lambda: expect_error(
        lambda: dist.all_gather_into_tensor(torch.empty(3), torch.ones(2)), "elements"))

    def still_usable():
        x = torch.ones(4)
        dist.all_reduce(x)
        return torch.all(x == world).item(), ""
    checks.run("usable_after_refusals", still_usable)

    # A dead rank: the last rank leaves without a word; the others' next collective fails
    # with an error that names it.
    dist.barrier()
    dead = world - 1
    if rank == dead:
        sys.stdout.flush()
        os._exit(0)  # no result file: the test expects none from this rank
    time.sleep(0.3)
    t0 = time.monotonic()
    ok, detail = expect_error(lambda: dist.all_reduce(torch.ones(1 << 16)), f"peer rank {dead}")
    checks.record("dead_rank_named", ok, f"{detail} (after {time.monotonic() - t0:.2f} s)")
    ok2, detail2 = expect_error(lambda: dist.all_reduce(torch.ones(4)), "softrdma")
    checks.record("unusable_after_failure", ok2, detail2)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["collectives", "work", "errors"])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--result", required=True)
    a = p.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("softrdma", timeout=datetime.timedelta(seconds=60))
    checks = Checks()
    try:
        if a.mode == "collectives":
            run_collectives(checks, a.quick)
        elif a.mode == "work":
            run_work(checks)
        else:
            run_errors(checks)
    except Exception:  # noqa: BLE001
        checks.record("worker", False, traceback.format_exc())
    with open(a.result, "w") as f:
        json.dump(checks.entries, f)
    if a.mode == "errors":
        os._exit(0)  # the group is in error; skip destroying it
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
