"""Data-parallel training of a small CNN on Fashion-MNIST with DistributedDataParallel.

Every rank holds the whole model and optimizer; after each backward pass DDP averages the
gradients with AllReduce (bucketed, overlapped with the backward pass), so every rank takes
the same optimizer step.

    build/bin/softrdma run -- torchrun --nproc_per_node 2 pytorch/examples/train_ddp.py
    ... train_ddp.py --backend gloo                 # the same with Gloo
    ... train_ddp.py --backend softrdma,gloo --max-steps 20   # both, curves compared
"""

import os
import sys

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fashion_mnist  # noqa: E402


def distribute(model, group, args):
    """DDP over `group`: it broadcasts rank 0's parameters, then AllReduces gradients."""
    module = DDP(model, process_group=group)
    return module, torch.optim.Adam(module.parameters(), lr=args.lr)


if __name__ == "__main__":
    sys.exit(fashion_mnist.main("ddp", __doc__.splitlines()[0], distribute))
