"""Fully sharded data-parallel training (FSDP / ZeRO stage 3 style) of a small CNN on
Fashion-MNIST, written out with the backend's AllGather and ReduceScatter.

PyTorch 1.13's FullyShardedDataParallel needs CUDA (it creates CUDA streams in its lazy
initialisation), so on CPU the same algorithm is spelled out here, one layer = one unit:

  1. Sharding. Each layer's parameters are flattened into one vector, padded to a multiple
     of world_size and cut into world_size equal shards; rank r keeps shard r only (an
     nn.Parameter of 1/world_size of the layer) and frees the rest.
  2. Forward. Just before a layer runs, AllGather (all_gather_into_tensor) rebuilds the
     full flat parameter vector from every rank's shard; the layer runs on views of it;
     right after, the vector's storage is freed (resized to 0), so only one layer's full
     parameters exist at a time. Autograd keeps its references to the views.
  3. Backward. A hook on the layer's output fires before gradients flow into the layer:
     AllGather refills the same storage, so the views autograd saved are valid again.
  4. Gradients. A hook on the full vector receives its gradient (every rank's gradient of
     its own batch, for the whole layer); ReduceScatter (reduce_scatter_tensor, SUM)
     leaves on rank r the sum over ranks of shard r's gradient, divided by world_size —
     the same average DDP's AllReduce computes, for 1/world_size of the bytes kept. The
     full vector is freed again.
  5. Optimizer. Adam runs on the shards only: each rank updates its 1/world_size of every
     layer (and keeps Adam's moments for that 1/world_size), and the next forward's
     AllGather distributes the updated values.

Per step and layer that is two AllGathers and one ReduceScatter of the layer's parameters
— the communication of FSDP's FULL_SHARD (Zhao et al., "PyTorch FSDP", VLDB 2023), where
DDP needs one AllReduce (= ReduceScatter + AllGather). Memory per rank: a shard of every
layer plus one full layer at a time.

    build/bin/softrdma run -- torchrun --nproc_per_node 2 pytorch/examples/train_fsdp.py

Gloo in PyTorch 1.13 has neither all_gather_into_tensor nor reduce_scatter; with
--backend gloo the two steps fall back to all_gather into a list and AllReduce + slice
(the same sums by a different route), so the curves can still be compared.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fashion_mnist  # noqa: E402


def all_gather_flat(out, shard, group):
    """out[r·n:(r+1)·n] = rank r's shard (n = shard.numel())."""
    if dist.get_backend(group) == dist.Backend.GLOO:
        dist.all_gather(list(out.chunk(dist.get_world_size(group))), shard, group=group)
    else:
        dist.all_gather_into_tensor(out, shard, group=group)


def reduce_scatter_flat(out, full, group):
    """out = sum over ranks of their full[r·n:(r+1)·n] (this rank r, n = out.numel())."""
    if dist.get_backend(group) == dist.Backend.GLOO:
        summed = full.clone()
        dist.all_reduce(summed, group=group)
        out.copy_(summed.chunk(dist.get_world_size(group))[dist.get_rank(group)])
    else:
        dist.reduce_scatter_tensor(out, full, group=group)


class ShardedLayer(nn.Module):
    """One FSDP unit: a Conv2d or Linear layer whose parameters this rank holds as one
    shard (steps 1-4 of the file comment)."""

    def __init__(self, layer, group):
        super().__init__()
        self.group = group
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        self.shapes = [p.shape for p in layer.parameters()]  # weight, bias
        flat = torch.cat([p.detach().reshape(-1) for p in layer.parameters()])
        self.numel = flat.numel()
        shard_numel = -(-self.numel // world)
        padded = F.pad(flat, (0, shard_numel * world - self.numel))
        # Step 1: keep shard `rank` of the padded vector.
        self.shard = nn.Parameter(padded[rank * shard_numel : (rank + 1) * shard_numel].clone())
        self.full = torch.empty(shard_numel * world)  # storage allocated only while in use
        self._free()
        if isinstance(layer, nn.Conv2d):
            stride, padding = layer.stride, layer.padding
            self.fn = lambda x, w, b: F.conv2d(x, w, b, stride, padding)
        elif isinstance(layer, nn.Linear):
            self.fn = F.linear
        else:
            raise TypeError(f"ShardedLayer: no functional form for {type(layer).__name__}")

    def _free(self):
        self.full.storage().resize_(0)

    def _gather(self):
        # Steps 2 and 3: AllGather into the (re)allocated storage of the full vector.
        self.full.storage().resize_(self.full.numel())
        # Through .data: a write autograd does not version (it would otherwise refuse the
        # backward, as the saved views of self.full seem modified in place).
        all_gather_flat(self.full.data, self.shard.detach(), self.group)

    def _params(self, full):
        views, off = [], 0
        for shape in self.shapes:
            n = shape.numel()
            views.append(full[off : off + n].view(shape))
            off += n
        return views

    def forward(self, x):
        self._gather()
        if not torch.is_grad_enabled():
            y = self.fn(x, *self._params(self.full))
            self._free()
            return y
        # A leaf sharing the storage of self.full: its gradient is the full layer's.
        full = self.full.detach().requires_grad_()
        full.register_hook(self._reduce_scatter_grad)
        y = self.fn(x, *self._params(full))
        y.register_hook(self._regather)
        self._free()
        return y

    def _regather(self, grad):
        self._gather()  # step 3
        return grad

    def _reduce_scatter_grad(self, grad):
        # Step 4: ReduceScatter the full gradient; average; free the full vector.
        g = torch.empty_like(self.shard)
        reduce_scatter_flat(g, grad.contiguous(), self.group)
        g /= dist.get_world_size(self.group)
        self.shard.grad = g if self.shard.grad is None else self.shard.grad + g
        self._free()
        return grad


def shard_model(model, group):
    """Replaces every Conv2d and Linear of an nn.Sequential by its ShardedLayer."""
    return nn.Sequential(*[ShardedLayer(m, group) if isinstance(m, (nn.Conv2d, nn.Linear))
                           else m for m in model])


def distribute(model, group, args):
    """Step 5: Adam over the shards only."""
    module = shard_model(model, group)
    return module, torch.optim.Adam(module.parameters(), lr=args.lr)


if __name__ == "__main__":
    sys.exit(fashion_mnist.main("fsdp", __doc__.splitlines()[0], distribute))
