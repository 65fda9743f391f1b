"""Starts the ranks of a backend test: `nranks` processes, each `softrdma run -- python3
SCRIPT ARGS --result FILE` (softrdma run puts the drop-in libibverbs.so.1 and build/python
first in LD_LIBRARY_PATH / PYTHONPATH) with the variables torchrun would set (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT = a free TCP
port). Each rank takes the first free 127.0.0.x as its device address. Every rank is killed
when the deadline passes, so a hang ends as a failure, never as a stuck test."""

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time


@dataclasses.dataclass
class Rank:
    rank: int
    returncode: int  # None: killed at the deadline
    log: str
    result: dict  # the rank's JSON result, None if it wrote none


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(build_dir, nranks, argv, timeout=150, env=None, result_flag="--result"):
    """Runs the ranks; returns [Rank] once all exited or the deadline passed."""
    softrdma = os.path.join(build_dir, "bin", "softrdma")
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="softrdma-torch-")
    procs, logs, results = [], [], []
    for r in range(nranks):
        e = dict(os.environ)
        e.update(RANK=str(r), WORLD_SIZE=str(nranks), LOCAL_RANK=str(r),
                 LOCAL_WORLD_SIZE=str(nranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                 GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        e.pop("SOFTRDMA_ADDR", None)
        e.update(env or {})
        res = os.path.join(tmp, f"rank{r}.json")
        log = os.path.join(tmp, f"rank{r}.log")
        cmd = [softrdma, "run", "--", sys.executable, *argv]
        if result_flag:
            cmd += [result_flag, res]
        with open(log, "w") as f:
            procs.append(subprocess.Popen(cmd, env=e, stdout=f, stderr=subprocess.STDOUT))
        logs.append(log)
        results.append(res)
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    for p, c in zip(procs, codes):
        if c is None:
            p.kill()
            p.wait()
    ranks = []
    for r in range(nranks):
        with open(logs[r], errors="replace") as f:
            text = f.read()
        result = None
        if os.path.exists(results[r]):
            with open(results[r]) as f:
                result = json.load(f)
        ranks.append(Rank(r, codes[r], text, result))
    shutil.rmtree(tmp, ignore_errors=True)
    return ranks


def describe(ranks):
    """Exit codes and the tail of each rank's log, for assertion messages."""
    out = []
    for k in ranks:
        out.append(f"--- rank {k.rank}: exit {k.returncode}\n{k.log[-3000:]}")
    return "\n".join(out)
