"""The training examples' first steps over softrdma against Gloo: each example trains 6
steps with --backend softrdma,gloo (the same seed, batches and initial weights on both, in
the same 2 processes) and the two loss curves must agree to 1e-5 (with 2 ranks every
reduction is a + b on both backends, so they agree exactly in practice). DDP, ZeRO-1 and
the FSDP-style loop train the same network on the same batches, so their curves must also
agree with each other (to 1e-4: FSDP averages by ReduceScatter then divide, DDP divides
then AllReduces)."""

import os

import pytest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "examples")
STEPS = 6
BACKEND_TOLERANCE = 1e-5
STRATEGY_TOLERANCE = 1e-4

curves = {}


@pytest.mark.parametrize("example", ["ddp", "zero", "fsdp"])
def test_example_first_steps_match_gloo(build_dir, example):
    script = os.path.join(EXAMPLES, f"train_{example}.py")
    ranks = harness.launch(
        build_dir, 2,
        [script, "--backend", "softrdma,gloo", "--epochs", "1", "--max-steps", str(STEPS),
         "--no-eval"],
        timeout=200, result_flag="--log-json")
    assert all(k.returncode == 0 for k in ranks), harness.describe(ranks)
    assert ranks[0].result is not None, harness.describe(ranks)
    res = ranks[0].result["results"]
    ours, gloo = res["softrdma"]["loss"], res["gloo"]["loss"]
    assert len(ours) == len(gloo) == STEPS
    diff = max(abs(a - b) for a, b in zip(ours, gloo))
    assert diff <= BACKEND_TOLERANCE, f"softrdma {ours}\ngloo     {gloo}"
    assert ours[-1] < ours[0], f"loss did not decrease: {ours}"
    curves[example] = ours


def test_ddp_zero_and_fsdp_train_alike():
    if len(curves) < 3:
        pytest.skip("needs the three example runs")
    for other in ("zero", "fsdp"):
        diff = max(abs(a - b) for a, b in zip(curves["ddp"], curves[other]))
        assert diff <= STRATEGY_TOLERANCE, f"ddp {curves['ddp']}\n{other} {curves[other]}"
