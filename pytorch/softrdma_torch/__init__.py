"""softrdma's torch.distributed backend.

Importing this package registers the backend "softrdma" with torch.distributed
(``torch.distributed.Backend.register_backend``), so that::

    import softrdma_torch  # noqa: F401
    torch.distributed.init_process_group("softrdma")   # env:// as torchrun sets it

runs torch.distributed's collectives over softrdma's collective library (ccl) on RDMA
verbs. The ranks exchange their connection details through the c10d store that torch
passes to the backend (torchrun's TCPStore on MASTER_ADDR:MASTER_PORT).

The process must load softrdma's drop-in libibverbs.so.1 (build/lib), which torch would
otherwise replace by the system's (torch's Gloo links libibverbs): start the program with
``build/bin/softrdma run -- torchrun ...`` (it sets LD_LIBRARY_PATH and PYTHONPATH) or
set ``LD_LIBRARY_PATH=build/lib PYTHONPATH=build/python`` yourself. See docs/pytorch.md.
"""

import warnings

import torch.distributed as dist

from softrdma_torch._C import (  # noqa: F401
    ProcessGroupSoftrdma,
    softrdma_library_dir,
    verbs_library,
    verbs_library_is_softrdma,
)

BACKEND = "softrdma"


def _create(store, rank, size, timeout):
    """The creator torch.distributed calls for backend "softrdma": (store, rank, world
    size, timeout) -> ProcessGroupSoftrdma. Connecting is collective."""
    if not verbs_library_is_softrdma():
        warnings.warn(
            "softrdma backend: this process uses %s, not softrdma's drop-in libibverbs in "
            "%s; start it with `softrdma run -- ...` or LD_LIBRARY_PATH=%s (on RDMA NICs "
            "the system library is what you want)"
            % (verbs_library() or "no libibverbs", softrdma_library_dir(), softrdma_library_dir()),
            RuntimeWarning,
            stacklevel=2,
        )
    return ProcessGroupSoftrdma(store, rank, size, timeout)


if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create)
