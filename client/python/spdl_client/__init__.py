"""spdl_client: receive training batches from the node's spdld daemon, zero-copy.

::

    import torch, spdl_client

    loader = spdl_client.Loader("job.yaml", overrides={"source.root": "/data/train"})
    for epoch in range(epochs):
        loader.set_epoch(epoch)                               # as DistributedSampler.set_epoch
        for batch in loader:                                  # one epoch, len(loader) batches
            images = torch.from_dlpack(batch["image"])        # uint8 [B, H, W, 3], shared memory
            labels = torch.from_dlpack(batch["label"])        # int64 [B]
            ...                                               # drop them: the slot goes back

A :class:`Loader` opens one job on the daemon (``socket``: ``$SPDLD_SOCKET`` or
``/run/spdld/spdld.sock``; ``rank``/``world_size``: ``$RANK``/``$WORLD_SIZE``) and is iterated like a
``torch.utils.data.DataLoader``: each ``iter(loader)`` yields one epoch of :class:`Batch` objects:
mappings of name to :class:`Tensor`, each a zero-copy view of the job's shared memory implementing
the DLPack protocol. A batch's slot goes back to the daemon when the last reference to it — the
Batch, a Tensor, or a torch/numpy view — is gone; see :class:`Batch`. Errors raise
:class:`SpdlError` with the daemon's message; a wait past its timeout raises
:class:`SpdlTimeoutError`.

Your own augmentation runs in this process: ``Loader(..., transform=FN, transform_threads=N)``
calls FN once per batch on N threads ahead of the step and yields its results in order
(``sample_transform=FN``: once per sample, results collated); ``batch.seed`` makes its randomness
reproducible across a resume; ``transform_executor="process"`` runs FN on worker processes (for
code that holds the GIL). See :class:`Loader`.
"""

from ._errors import SpdlError, SpdlTimeoutError
from ._loader import DEFAULT_SOCKET, DEFAULT_TIMEOUT, Batch, EpochIterator, Loader, Tensor
from ._process_executor import TransformWorkerError
from ._producer import Producer

__all__ = ["Loader", "Producer", "EpochIterator", "Batch", "Tensor", "SpdlError", "SpdlTimeoutError", "TransformWorkerError",
           "DEFAULT_SOCKET", "DEFAULT_TIMEOUT"]
__version__ = "0.2.0"
