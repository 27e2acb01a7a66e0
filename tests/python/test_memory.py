"""Zero copy and slot lifetime: views point into the job's shared mapping, and a slot goes back to
the daemon exactly when nothing can read it any more (never under a live view)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import spdl_client  # noqa: E402

torch = pytest.importorskip("torch", reason="these tests take torch views of the batches; torch is not installed here")


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _wait_for(cond, timeout=5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_views_are_zero_copy_into_the_shared_mapping(make_loader):
    loader = make_loader(batch=8)
    lo = loader.region_address()
    hi = lo + loader.region_size()
    batch = next(iter(loader))
    for name, t in batch.items():
        assert t.__dlpack_device__() == (1, 0)  # kDLCPU
        x = torch.from_dlpack(t)
        a = np.from_dlpack(t)
        b = np.asarray(t)  # __array__ goes through DLPack too
        assert x.data_ptr() == t.data_ptr == _addr(a) == _addr(b), name
        assert lo <= t.data_ptr and t.data_ptr + t.nbytes <= hi, name
        assert tuple(x.shape) == t.shape == a.shape and a.dtype == np.dtype(t.dtype) and x.is_contiguous()
        assert t.nbytes == a.nbytes and t.ndim == a.ndim and t.itemsize == a.itemsize
    image = torch.from_dlpack(batch["image"])
    assert image.dtype == torch.uint8 and image.float().std() > 0  # real pixels
    assert torch.from_dlpack(batch["label"]).dtype == torch.int64
    # One memory: a write through the torch view shows in the numpy view.
    arr = np.from_dlpack(batch["image"])
    image[0, 0, 0, 0] = 255 - int(image[0, 0, 0, 0])
    assert int(arr[0, 0, 0, 0]) == int(image[0, 0, 0, 0])
    # The helpers give the same views.
    assert batch.torch()["image"].data_ptr() == image.data_ptr()
    assert _addr(batch.numpy()["label"]) == batch["label"].data_ptr


def test_dropping_batches_gives_the_slots_back(make_loader):
    loader = make_loader(batch=4, prefetch=2, epochs=1)  # 12 batches through 2 slots
    n = 0
    for batch in loader:
        x = torch.from_dlpack(batch["image"])
        assert x.shape[0] == 4
        assert loader.held_batches <= 2
        n += 1
    assert n == 12 == len(loader)
    assert loader.held_batches == 1  # `batch` still refers to the last one
    del batch, x
    assert loader.held_batches == 0


@pytest.mark.filterwarnings("ignore:spdl_client. all 2 slots")
def test_all_slots_held_blocks_until_a_view_dies(make_loader):
    loader = make_loader(batch=4, prefetch=2, epochs=0)
    it = iter(loader)
    a = next(it)
    b = next(it)  # two batches held: both slots
    view = torch.from_dlpack(a["image"])
    del a  # the view still holds a's slot
    assert loader.held_batches == 2
    got = []
    waiter = threading.Thread(target=lambda: got.append(next(it)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and not got, "next() must wait while every slot is leased"
    del view  # the last reference to a's slot: released here, on this thread
    waiter.join(10)
    assert not waiter.is_alive() and got[0].seq == b.seq + 1


def test_a_kept_view_stays_valid_and_unchanged(make_loader):
    loader = make_loader(batch=4, prefetch=3, epochs=2)  # keep 1 view, 2 slots left to iterate with
    it = iter(loader)
    first = next(it)
    kept = torch.from_dlpack(first["image"])
    kept_labels = np.from_dlpack(first["label"])
    copy, copy_labels = kept.clone(), kept_labels.copy()
    kept_slot = first.slot
    del first
    later = 0
    for epoch in (it, loader):  # the rest of epoch 0, then all of epoch 1
        for batch in epoch:
            assert batch.slot != kept_slot, "the daemon refilled a slot that a view still uses"
            torch.from_dlpack(batch["image"]).sum()
            assert torch.equal(kept, copy) and np.array_equal(kept_labels, copy_labels)
            later += 1
    assert later == 2 * len(loader) - 1
    del batch
    assert loader.held_batches == 1
    del kept, kept_labels
    assert loader.held_batches == 0


def test_release_never_frees_memory_under_a_live_view(make_loader):
    loader = make_loader(batch=4, prefetch=2, epochs=1)
    it = iter(loader)
    first = next(it)
    view = torch.from_dlpack(first["image"])
    copy = view.clone()
    first.release()
    assert first.released and first["image"].released
    with pytest.raises(spdl_client.SpdlError) as err:
        torch.from_dlpack(first["image"])  # no new views after release()
    assert err.value.code == "FAILED_PRECONDITION" and "released" in str(err.value)
    assert loader.held_batches == 1  # the view keeps the slot
    for batch in it:  # 11 more batches through the one slot left
        assert batch.slot != first.slot
        assert torch.equal(view, copy)
        batch.release()  # no views: the slot goes back right here
        assert batch.released
    assert loader.held_batches == 1
    del view
    assert loader.held_batches == 0
    first.release()  # idempotent


def test_released_batch_without_views_frees_its_slot_at_once(make_loader):
    loader = make_loader(batch=4, prefetch=2)
    with next(iter(loader)) as batch:  # a Batch is a context manager: released at the end of the block
        assert loader.held_batches == 1
    assert batch.released and loader.held_batches == 0


def test_unconsumed_capsules_and_views_dropped_on_another_thread(make_loader):
    loader = make_loader(batch=4, prefetch=2)
    it = iter(loader)
    batch = next(it)
    capsule = batch["image"].__dlpack__()
    batch.release()
    assert loader.held_batches == 1  # a capsule nobody consumed owns a reference too
    del capsule
    assert loader.held_batches == 0

    batch = next(it)
    views = [torch.from_dlpack(batch["image"]), np.from_dlpack(batch["label"])]
    del batch
    assert loader.held_batches == 1
    dropper = threading.Thread(target=views.clear)
    del views
    dropper.start()
    dropper.join()
    assert _wait_for(lambda: loader.held_batches == 0)
    assert next(it).rows == 4  # and the loader goes on


def test_dlpack_protocol_arguments(make_loader):
    batch = next(iter(make_loader(batch=4)))
    t = batch["image"]
    assert "image" in repr(t) and "uint8" in repr(t) and "image" in repr(batch)
    for kwargs in ({"stream": None}, {"stream": -1}, {"max_version": (1, 0)}, {"dl_device": (1, 0)}, {"copy": False}):
        assert type(t.__dlpack__(**kwargs)).__name__ == "PyCapsule", kwargs
    for kwargs in ({"stream": 7}, {"dl_device": (2, 0)}, {"copy": True}):
        with pytest.raises(BufferError):
            t.__dlpack__(**kwargs)
    assert np.asarray(t, dtype=np.float32).dtype == np.float32  # a converted copy on request


def test_next_with_every_slot_held_warns(make_loader):
    loader = make_loader(batch=4, prefetch=2, epochs=0)
    it = iter(loader)
    a, b = next(it), next(it)
    release_later = threading.Timer(0.2, a.release)
    release_later.start()
    with pytest.warns(RuntimeWarning, match="all 2 slots of the job"):
        c = next(it)  # waits for the timer's release
    release_later.join()
    assert c.seq == b.seq + 1


def test_adaptive_ring_gives_every_slot_to_a_trainer_that_holds_batches(make_loader):
    # The ring starts with 2 of its 4 slots; a trainer holding 3 batches still gets a 4th (the ring
    # grows into the slots it needs), and never more than prefetch slots.
    loader = make_loader(batch=4, prefetch=4, epochs=0)
    assert loader.info["num_slots"] == 4
    it = iter(loader)
    held = [next(it) for _ in range(4)]
    assert len({b.slot for b in held}) == 4 and all(0 <= b.slot < 4 for b in held)
    assert [b.seq for b in held] == [held[0].seq + i for i in range(4)]
    del held


def test_adaptive_ring_delivers_the_same_batches_as_a_fixed_one(make_loader):
    # Batches, their order and their pixels do not depend on how many slots the ring uses:
    # prefetch 4 (adaptive, starts with 2) against prefetch 2 (fixed), two epochs.
    def epochs(prefetch):
        loader = make_loader(batch=4, prefetch=prefetch, epochs=2)
        out = []
        for _ in range(2):
            for b in loader:
                out.append((b.epoch, list(b.paths), torch.from_dlpack(b["image"]).sum().item()))
                del b
        return out

    assert epochs(4) == epochs(2)
