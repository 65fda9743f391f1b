"""Every collective x dtype x ReduceOp of the softrdma backend against Gloo's results (or,
where Gloo 1.13 refuses the call, the result computed from every rank's inputs), with 2
ranks (sizes 1 and 4099 elements, ~1 MiB for SUM and the data-moving collectives) and a
short 4-rank set. One launch per world size (rank_worker.py collectives); each test below
reads that launch's entries for one collective."""

import os

import pytest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "rank_worker.py")

REDUCING = ["all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"]
MOVING = ["broadcast", "all_gather", "all_gather_into_tensor", "all_gather_in_place",
          "all_to_all_single", "all_to_all", "all_to_all_uneven", "gather", "scatter",
          "send_recv"]
REDUCE_DTYPES = ["int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
MOVE_DTYPES = REDUCE_DTYPES + ["bool", "int16", "complex64"]
OPS = ["sum", "prod", "min", "max", "avg"]


def run(build_dir, nranks, quick):
    argv = [WORKER, "collectives"] + (["--quick"] if quick else [])
    ranks = harness.launch(build_dir, nranks, argv, timeout=240)
    assert all(k.returncode == 0 and k.result is not None for k in ranks), \
        harness.describe(ranks)
    return ranks


@pytest.fixture(scope="module")
def two_ranks(build_dir):
    return run(build_dir, 2, quick=False)


@pytest.fixture(scope="module")
def four_ranks(build_dir):
    return run(build_dir, 4, quick=True)


def entries(ranks, collective):
    """{(rank, entry name): entry} of one collective ("all_reduce[...]")."""
    return {(k.rank, n): e for k in ranks for n, e in k.result.items()
            if n.split("[")[0] == collective}


def check(ranks, collective, dtypes, ops):
    got = entries(ranks, collective)
    assert got, f"no {collective} results"
    failed = [f"rank {r}: {n}: {e['detail']}" for (r, n), e in sorted(got.items()) if not e["ok"]]
    assert not failed, "\n".join(failed[:20])
    names = {n for (_, n) in got}
    for d in dtypes:
        for op in ops:
            assert any(n.startswith(f"{collective}[{d}-{op}-") for n in names), \
                f"{collective}: {d} {op} not covered"


@pytest.mark.parametrize("collective", REDUCING)
def test_reducing_collective_matches_gloo_2_ranks(two_ranks, collective):
    check(two_ranks, collective, REDUCE_DTYPES, OPS)


@pytest.mark.parametrize("collective", MOVING)
def test_data_moving_collective_matches_gloo_2_ranks(two_ranks, collective):
    check(two_ranks, collective, MOVE_DTYPES, ["-"])


def test_barrier_coalesced_and_empty_tensors_2_ranks(two_ranks):
    for k in two_ranks:
        for n in ("barrier", "all_reduce_coalesced", "empty_tensor"):
            assert k.result[n]["ok"], f"rank {k.rank}: {n}: {k.result[n]['detail']}"


def test_some_results_compared_with_gloo_itself(two_ranks):
    # The fallback reference must not hide every comparison with Gloo.
    details = [e["detail"] for k in two_ranks for e in k.result.values()]
    assert sum("vs gloo" in d for d in details) > 100


@pytest.mark.parametrize("collective", REDUCING + MOVING)
def test_collective_matches_gloo_4_ranks(four_ranks, collective):
    reducing = collective in REDUCING
    check(four_ranks, collective, ["float32"] + (["int32", "bfloat16"] if reducing else ["bool"]),
          ["sum", "max", "avg"] if reducing else ["-"])
