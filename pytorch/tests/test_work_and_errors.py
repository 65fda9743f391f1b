"""Asynchronous Work semantics and error paths of the softrdma backend, 2 ranks
(rank_worker.py work / errors)."""

import os

import pytest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "rank_worker.py")

WORK = ["async_all_reduce", "future_then", "pending_irecv", "exchange_both_ways",
        "batch_isend_irecv", "irecv_does_not_block_collective", "second_group",
        "tags_keep_order"]
REFUSALS = ["refuse_band", "refuse_bxor_reduce_scatter", "refuse_bool_reduction",
            "refuse_int16_reduction", "refuse_any_source", "refuse_non_contiguous",
            "refuse_bad_tag", "refuse_size_mismatch", "usable_after_refusals"]


@pytest.fixture(scope="module")
def work_ranks(build_dir):
    ranks = harness.launch(build_dir, 2, [WORKER, "work"], timeout=150)
    assert all(k.returncode == 0 and k.result is not None for k in ranks), \
        harness.describe(ranks)
    return ranks


@pytest.fixture(scope="module")
def error_ranks(build_dir):
    return harness.launch(build_dir, 2, [WORKER, "errors"], timeout=150)


@pytest.mark.parametrize("check", WORK)
def test_work(work_ranks, check):
    for k in work_ranks:
        assert k.result[check]["ok"], f"rank {k.rank}: {k.result[check]['detail']}"


@pytest.mark.parametrize("check", REFUSALS)
def test_refused_call_raises_clear_error(error_ranks, check):
    k = error_ranks[0]
    assert k.result is not None, harness.describe(error_ranks)
    assert k.result[check]["ok"], k.result[check]["detail"]


def test_dead_rank_is_named_in_the_error(error_ranks):
    survivor, dead = error_ranks
    assert survivor.returncode == 0 and survivor.result is not None, \
        harness.describe(error_ranks)
    assert dead.result is None  # it left before writing one
    for check in ("dead_rank_named", "unusable_after_failure"):
        assert survivor.result[check]["ok"], survivor.result[check]["detail"]
