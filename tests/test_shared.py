"""Buffers: numpy and torch views of one memory, shared and pinned."""
import multiprocessing
from collections import namedtuple

import numpy as np
import pytest
import torch

from rlplay.engine.nested import StructureError, flatten
from rlplay.engine.shared import (Aliased, aliased, check_device, copy_,
                                  numpify, torchify)

from bounds import JOIN  # the reason in bounds.py

State = namedtuple("State", "obs act")

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
needs_no_cuda = pytest.mark.skipif(HAS_CUDA, reason="CUDA is present")


def example():
    return State(obs={"image": np.zeros((3, 2), np.uint8),
                      "flag": np.zeros((), bool)},
                 act=(np.zeros((), np.int64), np.zeros(2, np.float32)))


def same_memory(array, tensor):
    return array.ctypes.data == tensor.data_ptr() \
        and array.nbytes == tensor.numel() * tensor.element_size()


# aliased

def test_aliased_layout_dtypes_and_zeros():
    buf = aliased(example(), 5, 4)
    assert isinstance(buf, Aliased)
    assert type(buf.npy) is State and type(buf.pyt) is State
    assert buf.pyt.obs["image"].shape == (5, 4, 3, 2)
    assert buf.pyt.obs["image"].dtype == torch.uint8
    assert buf.pyt.obs["flag"].shape == (5, 4)
    assert buf.pyt.obs["flag"].dtype == torch.bool
    assert buf.pyt.act[0].dtype == torch.int64
    assert buf.pyt.act[1].shape == (5, 4, 2)
    assert buf.npy.act[1].dtype == np.float32
    for array in flatten(buf.npy):
        assert isinstance(array, np.ndarray) and not array.any()
    for array, tensor in zip(flatten(buf.npy), flatten(buf.pyt)):
        assert same_memory(array, tensor)


def test_aliased_numpy_write_is_seen_by_torch():
    buf = aliased(example(), 2, 3)
    buf.npy.obs["image"][1, 2] = 7
    buf.npy.act[1][0, 1] = [0.5, -1.5]
    buf.npy.obs["flag"][1, 0] = True
    assert buf.pyt.obs["image"][1, 2].tolist() == [[7, 7]] * 3
    assert buf.pyt.act[1][0, 1].tolist() == [0.5, -1.5]
    assert bool(buf.pyt.obs["flag"][1, 0])
    assert int(buf.pyt.obs["image"].sum()) == 7 * 6


def test_aliased_torch_write_is_seen_by_numpy():
    buf = aliased(example(), 2, 3)
    buf.pyt.act[0][0].copy_(torch.tensor([4, 5, 6]))
    buf.pyt.obs["image"][:, :, 0, 0] += 3
    assert buf.npy.act[0].tolist() == [[4, 5, 6], [0, 0, 0]]
    assert (buf.npy.obs["image"][..., 0, 0] == 3).all()
    assert buf.npy.obs["image"].sum() == 3 * 6


def test_aliased_from_tensor_examples_and_no_leading():
    buf = aliased({"h": torch.ones(2, 3, dtype=torch.float64)})
    assert buf.pyt["h"].shape == (2, 3) and buf.pyt["h"].dtype == \
        torch.float64
    assert not buf.pyt["h"].any()  # zero-filled, not the example's values
    assert aliased(None, 3) == Aliased(None, None)
    assert aliased((), 3) == Aliased((), ())


def test_aliased_scalars():
    buf = aliased({"f": 0.0, "i": 0, "b": False}, 4)
    assert buf.npy["f"].dtype == np.float64 and buf.npy["i"].dtype == \
        np.int64
    assert buf.npy["b"].dtype == bool and buf.pyt["b"].shape == (4,)


def test_aliased_shared_memory():
    buf = aliased(example(), 2, 2, shared=True)
    for tensor in flatten(buf.pyt):
        assert tensor.is_shared()
    for array, tensor in zip(flatten(buf.npy), flatten(buf.pyt)):
        assert same_memory(array, tensor)
    assert not any(t.is_shared() for t in flatten(aliased(example(), 2).pyt))


def _write_in_child(tensor):
    tensor[1] = 42


def test_aliased_shared_memory_is_seen_across_processes():
    buf = aliased(np.zeros(3, np.int64), 2, shared=True)
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=_write_in_child, args=(buf.pyt,))
    proc.start()
    proc.join(JOIN)
    assert proc.exitcode == 0
    assert buf.npy.tolist() == [[0, 0, 0], [42, 42, 42]]


# torchify and numpify

def test_torchify_without_copy_shares_memory():
    arrays = {"a": np.arange(3.0), "b": [np.zeros(2, np.int32)]}
    tensors = torchify(arrays)
    assert tensors["a"].dtype == torch.float64
    assert tensors["b"][0].dtype == torch.int32
    arrays["a"][0] = 9
    tensors["b"][0][1] = 5
    assert tensors["a"][0] == 9 and arrays["b"][0][1] == 5


def test_torchify_copy_and_leading():
    array = np.arange(3, dtype=np.float32)
    copied = torchify(array, copy=True)
    array[0] = 100
    assert copied.tolist() == [0, 1, 2]
    stacked = torchify({"x": array, "s": np.int64(7), "f": 1.5}, 2, 4)
    assert stacked["x"].shape == (2, 4, 3)
    assert stacked["x"][1, 3].tolist() == [100, 1, 2]  # broadcast
    assert stacked["s"].shape == (2, 4) and stacked["s"].dtype == \
        torch.int64 and (stacked["s"] == 7).all()
    assert stacked["f"].dtype == torch.float64
    stacked["x"][0, 0, 0] = -1
    assert array[0] == 100  # a new memory


def test_torchify_shared():
    tensors = torchify({"x": np.ones(3)}, shared=True)
    assert tensors["x"].is_shared() and tensors["x"].tolist() == [1, 1, 1]


def test_numpify_shares_memory_both_ways():
    tensors = {"a": torch.zeros(3), "b": (torch.arange(4),)}
    arrays = numpify(tensors)
    arrays["a"][1] = 2.5
    tensors["b"][0][0] = 10
    assert tensors["a"].tolist() == [0, 2.5, 0]
    assert arrays["b"][0].tolist() == [10, 1, 2, 3]


def test_numpify_detaches_and_leading():
    weight = torch.ones(2, requires_grad=True)
    array = numpify(weight)
    assert array.tolist() == [1, 1]
    stacked = numpify({"w": weight, "n": np.float32(2)}, 3)
    assert stacked["w"].shape == (3, 2) and stacked["n"].shape == (3,)
    stacked["w"][0, 0] = 5
    assert weight[0] == 1


def test_numpify_refuses_non_cpu_tensors():
    with pytest.raises(TypeError, match="numpify needs CPU tensors, got a "
                                        "tensor on meta"):
        numpify({"x": torch.empty(2, device="meta")})


# copy_

def test_copy_in_place_and_mismatch():
    dst = {"a": torch.zeros(2), "b": (torch.zeros(2, dtype=torch.int64),)}
    src = {"a": torch.ones(2), "b": (torch.tensor([3, 4]),)}
    a = dst["a"]
    assert copy_(dst, src) is dst
    assert dst["a"] is a and a.tolist() == [1, 1]
    assert dst["b"][0].tolist() == [3, 4]
    with pytest.raises(StructureError, match=r"at <root>: .*missing keys "
                                             r"\['b'\]"):
        copy_(dst, {"a": torch.ones(2)})


# devices

def test_check_device_on_the_host():
    assert check_device() is None
    assert check_device("cpu") == torch.device("cpu")
    assert check_device(torch.device("cpu")) == torch.device("cpu")


@needs_no_cuda
def test_pinned_without_cuda_raises_up_front():
    with pytest.raises(RuntimeError, match=r"pinned=True needs CUDA, but "
                                           r"torch.cuda.is_available\(\) is "
                                           r"False"):
        check_device(pinned=True)
    with pytest.raises(RuntimeError, match="pinned=True needs CUDA"):
        aliased(example(), 2, pinned=True)
    with pytest.raises(RuntimeError, match="pinned=True needs CUDA"):
        torchify({"x": np.zeros(2)}, pinned=True)


@needs_no_cuda
@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda")])
def test_cuda_device_without_cuda_raises_up_front(device):
    with pytest.raises(RuntimeError, match=r"device='cuda(:1)?' needs CUDA"):
        check_device(device)


@needs_cuda
def test_pinned_allocation():
    buf = aliased(example(), 2, pinned=True)
    assert all(t.is_pinned() for t in flatten(buf.pyt))
    buf.npy.act[0][1] = 3
    assert int(buf.pyt.act[0][1]) == 3
    assert torchify(np.zeros(2), pinned=True).is_pinned()


@needs_cuda
def test_cuda_device():
    assert check_device("cuda") == torch.device("cuda")
    dst = {"x": torch.zeros(2, device="cuda")}
    copy_(dst, {"x": torch.ones(2).pin_memory()}, non_blocking=True)
    torch.cuda.synchronize()
    assert dst["x"].tolist() == [1, 1]
