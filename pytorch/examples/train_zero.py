"""ZeRO stage 1 on Fashion-MNIST: DistributedDataParallel for the gradients and
torch.distributed.optim.ZeroRedundancyOptimizer for the optimizer state.

ZeRO-1 (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", SC 2020) shards the optimizer state: each rank keeps Adam's two moments only for
its own partition of the parameters and updates only that partition; the updated
partitions then reach every rank (PyTorch 1.13 broadcasts each partition from its owner —
an AllGather of the updated parameters expressed as world_size broadcasts). Gradients are
still AllReduced in full by DDP (stage 2 would ReduceScatter them).

    build/bin/softrdma run -- torchrun --nproc_per_node 2 pytorch/examples/train_zero.py
"""

import os
import sys

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fashion_mnist  # noqa: E402


def distribute(model, group, args):
    """DDP for the gradients, Adam's state sharded over the ranks of `group`."""
    module = DDP(model, process_group=group)
    optimizer = ZeroRedundancyOptimizer(module.parameters(), optimizer_class=torch.optim.Adam,
                                        process_group=group, lr=args.lr)
    return module, optimizer


if __name__ == "__main__":
    sys.exit(fashion_mnist.main("zero1", __doc__.splitlines()[0], distribute))
