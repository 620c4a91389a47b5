"""Framework glue: which framework an array comes from, owned copies, devices, small helpers.

Arrays cross into C++ through DLPack only (``__dlpack__``); results come back as DLPack views
converted with ``torch.utils.dlpack.from_dlpack`` (torch inputs) or taken by ``numpy.asarray``
through the same view object's buffer protocol (NumPy inputs), matching the input. Results of a
GPU buffer are kDLCUDA views (CUDA tensors); of a cpu or cuda-sim buffer, host memory.
"""
import importlib
import sys

import numpy as np

from . import _ubep

TORCH, NUMPY, DLPACK = 0, 1, 2  # python/src/arrays.hpp Kind

# torch is optional and adopted lazily: ``import ubep`` does not import it (about 1 s, most of a
# cold start: what a replacement host's ranks pay before they serve, docs/ELASTIC.md). No torch
# object (tensor, dtype, device) can exist before torch is imported, so every function that may
# meet one first calls torch_module(), which adopts torch once sys.modules has it. Adoption runs
# under the GIL and publishes ``torch`` last, after the extension holds its converters, so a
# thread that sees ``torch`` set also finds the converters registered.
torch = None
_TorchTensor = None
_ubep._set_converters(None, np.asarray)


def _device_ones(n, k, like):
    """Dispatch weights when none are given, on the GPU of ``like`` (topk_idx)."""
    t = torch_module()
    device = like.device if isinstance(like, t.Tensor) else t.device(
        "cuda", like.__dlpack_device__()[1])
    return t.ones((n, k), dtype=t.float32, device=device)


def _adopt_torch():
    """Registers torch's converters with the extension once torch is imported; the module or
    None."""
    global torch, _TorchTensor
    t = sys.modules.get("torch")
    if t is None or getattr(t, "Tensor", None) is None:  # absent, or still importing
        return None
    dlpack = importlib.import_module("torch.utils.dlpack")
    # The C function behind torch.utils.dlpack.from_dlpack, for capsules (what the extension
    # hands over): skips the Python wrapper's protocol checks on every result. NumPy results go
    # through the buffer protocol of the DLPack view object: numpy.from_dlpack (1.24) makes
    # read-only arrays and has no bfloat16, and the combine buffer must be writable.
    _ubep._set_converters(getattr(t._C, "_from_dlpack", dlpack.from_dlpack), np.asarray)
    # Exact torch.Tensor inputs go through torch.to_dlpack (C) instead of the Python body of
    # Tensor.__dlpack__: the same DLPack export, a microsecond less per argument.
    _ubep._set_torch_fast_path(t.Tensor, dlpack.to_dlpack)
    _ubep._set_device_ones(_device_ones)
    _TorchTensor = t.Tensor
    torch = t
    return t


def torch_module():
    """The torch module if anything imported it (adopted on first sight), else None."""
    return torch if torch is not None else _adopt_torch()


def kind_of(x):
    """The framework results are returned in: the one of ``x``."""
    t = type(x)
    if t is np.ndarray:
        return NUMPY
    if t is _TorchTensor:
        return TORCH
    if _TorchTensor is None:
        torch_module()
    if _TorchTensor is not None and isinstance(x, _TorchTensor):
        return TORCH
    if isinstance(x, np.ndarray):
        return NUMPY
    return DLPACK


def owned(a):
    """An owned copy of a result view (``copy=True``)."""
    if a is None:
        return None
    if kind_of(a) == TORCH:
        return a.clone()
    if isinstance(a, np.ndarray):
        return a.copy()
    return np.array(a, copy=True)


def copy_into(out, y):
    """out[...] = y for torch or NumPy ``out``; returns out."""
    if kind_of(out) == TORCH:
        out.copy_(y if kind_of(y) == TORCH else torch.utils.dlpack.from_dlpack(y))
    else:
        np.copyto(out, np.asarray(y))
    return out


def accumulate(total, counts):
    """total += counts in total's dtype and on its device (DeepEP's
    cumulative_local_expert_recv_stats is int32)."""
    if kind_of(total) == TORCH:
        c = counts if kind_of(counts) == TORCH else torch.from_dlpack(counts)
        total.add_(c.to(device=total.device, dtype=total.dtype))
    else:
        total += np.asarray(counts).astype(total.dtype)


def dtype_name(dtype):
    """'bf16', 'fp32' or 'fp8' from a string, torch dtype or NumPy dtype."""
    if isinstance(dtype, str):
        return {"bf16": "bf16", "bfloat16": "bf16", "fp32": "fp32", "float32": "fp32",
                "fp8": "fp8", "fp8_e4m3": "fp8", "float8_e4m3fn": "fp8"}.get(dtype, dtype)
    if torch_module() is not None and isinstance(dtype, torch.dtype):
        names = {torch.bfloat16: "bf16", torch.float32: "fp32"}
        if hasattr(torch, "float8_e4m3fn"):
            names[torch.float8_e4m3fn] = "fp8"
        return names.get(dtype, str(dtype))
    try:
        d = np.dtype(dtype)
    except TypeError:
        return str(dtype)
    # NumPy has no bfloat16: uint16 stands for bf16 bit patterns.
    return {np.dtype(np.float32): "fp32", np.dtype(np.uint16): "bf16"}.get(d, str(d))


def bf16_bits(a):
    """float32 NumPy array -> uint16 bf16 bit patterns (round to nearest even, as ubep)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    return np.where(nan, (u >> 16) | 0x40, rounded).astype(np.uint16)


def bf16_to_float32(bits):
    """uint16 bf16 bit patterns -> float32 (exact)."""
    bits = np.ascontiguousarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def device_name(device):
    """The canonical name of a Buffer's device ("cpu", "cuda:N", "cuda-sim:N") from a string
    ("cpu", "cuda", "cuda:N", "cuda-sim", "cuda-sim:N"), a ``torch.device`` or None ("cpu").
    "cuda" without an index is torch's current CUDA device where torch has one, else cuda:0."""
    if device is None:
        return "cpu"
    if torch_module() is not None and isinstance(device, torch.device):
        if device.type == "cpu":
            return "cpu"
        if device.type != "cuda":
            raise _ubep.InvalidArgument(
                f"device {device!s}: ubep runs on cpu, cuda[:N] and cuda-sim[:N]")
        device = "cuda" if device.index is None else f"cuda:{device.index}"
    if not isinstance(device, str):
        raise _ubep.InvalidArgument(
            f"device: expected a string (cpu, cuda[:N], cuda-sim[:N]) or a torch.device, got "
            f"{type(device).__name__}")
    if device == "cuda" and torch is not None and torch.cuda.is_available():
        device = f"cuda:{torch.cuda.current_device()}"
    return _ubep._parse_device(device)


def dispatch_layout_torch(idx, num_experts, num_ranks):
    """get_dispatch_layout for a torch topk_idx, computed on its device (CUDA tensors stay on
    the GPU): (num_tokens_per_rank, None, num_tokens_per_expert, is_token_in_rank)."""
    if num_experts % num_ranks:
        raise _ubep.InvalidArgument(
            f"get_dispatch_layout: num_experts {num_experts} is not a multiple of the "
            f"{num_ranks} ranks")
    torch_module()
    idx = idx.to(torch.int64)
    bad = (idx < -1) | (idx >= num_experts)
    if bool(bad.any()):
        raise _ubep.InvalidArgument(
            f"get_dispatch_layout: expert id {int(idx[bad][0])} outside [-1, {num_experts})")
    valid = idx >= 0
    ids = idx[valid]  # row-major order, as the rows of nonzero() below
    per_expert = torch.bincount(ids, minlength=num_experts).to(torch.int32)
    in_rank = torch.zeros((idx.shape[0], num_ranks), dtype=torch.bool, device=idx.device)
    rows = valid.nonzero()[:, 0]
    in_rank[rows, ids // (num_experts // num_ranks)] = True
    per_rank = in_rank.sum(dim=0).to(torch.int32)
    return per_rank, None, per_expert, in_rank
