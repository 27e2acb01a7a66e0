"""spdl_client: receive training batches from the node's spdld daemon, zero-copy.

::

    import torch, spdl_client

    with spdl_client.Loader("job.yaml", overrides={"source.root": "/data/train"}) as loader:
        for batch in loader:                                  # one Batch per step
            images = torch.from_dlpack(batch["image"])        # uint8 [B, H, W, 3], shared memory
            labels = torch.from_dlpack(batch["label"])        # int64 [B]
            ...                                               # drop them: the slot goes back

A :class:`Loader` opens one job on the daemon (``socket``: ``$SPDLD_SOCKET`` or
``/run/spdld/spdld.sock``; ``rank``/``world_size``: ``$RANK``/``$WORLD_SIZE``) and yields
:class:`Batch` objects: mappings of name to :class:`Tensor`, each a zero-copy view of the job's
shared memory implementing the DLPack protocol. A batch's slot goes back to the daemon when the last
reference to it — the Batch, a Tensor, or a torch/numpy view — is gone; see :class:`Batch`.
Errors raise :class:`SpdlError` with the daemon's message.
"""

from ._errors import SpdlError
from ._loader import DEFAULT_SOCKET, Batch, Loader, Tensor

__all__ = ["Loader", "Batch", "Tensor", "SpdlError", "DEFAULT_SOCKET"]
__version__ = "0.1.0"
