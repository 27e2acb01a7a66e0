#!/usr/bin/env python3
"""spdld with JAX: batches taken zero-copy with jax.numpy.from_dlpack (on CPU the JAX array is the
slot's shared memory), a jitted linear probe trained for one epoch.

    pip install 'jax[cpu]'
    spdld --socket /tmp/spdld.sock --allow-root /data &
    python3 jax_example.py --socket /tmp/spdld.sock --data /data/train

On a GPU, jax.device_put(x) of the CPU view copies the batch to the device once.
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp

import spdl_client

JOB = """
source: {type: image_folder}
sampler: {shuffle: true, seed: 0}
batch: {size: 16, drop_last: true}
transforms:
  - resize: {shorter: 32}
  - center_crop: {size: 32}
prefetch: 3
"""


def features(images):
    x = images.astype(jnp.float32) / 255.0  # [B, 32, 32, 3]
    x = x.reshape(x.shape[0], 8, 4, 8, 4, 3).mean(axis=(2, 4))  # 8x8 average pooling
    return x.reshape(x.shape[0], -1)


@jax.jit
def step(params, images, labels, lr=0.5):
    def loss_fn(p):
        logits = features(images) @ p["w"] + p["b"]
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), loss


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="an image folder (one sub-folder per class)")
    p.add_argument("--socket", help="spdld's socket (default: $SPDLD_SOCKET or /run/spdld/spdld.sock)")
    p.add_argument("--epochs", type=int, default=1)
    args = p.parse_args()

    with spdl_client.Loader(JOB, socket=args.socket, overrides={"source.root": os.path.abspath(args.data)},
                            epochs=args.epochs) as loader:
        classes = len(loader.classes or [0])
        params = {"w": jnp.zeros((8 * 8 * 3, classes)), "b": jnp.zeros(classes)}
        for epoch in range(args.epochs):
            losses = []
            for batch in loader:
                images = jnp.from_dlpack(batch["image"])  # uint8 [B, 32, 32, 3], zero-copy on CPU
                labels = jnp.from_dlpack(batch["label"])
                assert images.unsafe_buffer_pointer() == batch["image"].data_ptr
                params, loss = step(params, images, labels)
                losses.append(float(loss))  # waits for the step: the views may die now
                del images, labels, batch  # the slot goes back to the daemon
            print(f"epoch {epoch}: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
