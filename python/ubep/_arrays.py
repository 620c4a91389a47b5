"""Framework glue: which framework an array comes from, owned copies, small helpers.

Arrays cross into C++ through DLPack only (``__dlpack__``); results come back as DLPack views
converted with ``torch.utils.dlpack.from_dlpack`` (torch inputs) or taken by ``numpy.asarray``
through the same view object's buffer protocol (NumPy inputs), matching the input.
"""
import numpy as np

from . import _ubep

try:  # torch is optional: NumPy-only use works without it
    import torch
    import torch.utils.dlpack
except ImportError:  # pragma: no cover - exercised only on machines without torch
    torch = None

TORCH, NUMPY, DLPACK = 0, 1, 2  # python/src/arrays.hpp Kind

_TorchTensor = torch.Tensor if torch is not None else None

# NumPy results through the buffer protocol of the DLPack view object: numpy.from_dlpack (1.24)
# makes read-only arrays and has no bfloat16, and the combine buffer must be writable.
if torch is not None:
    # The C function behind torch.utils.dlpack.from_dlpack, for capsules (what the extension
    # hands over): skips the Python wrapper's protocol checks on every result.
    _from_capsule = getattr(torch._C, "_from_dlpack", torch.utils.dlpack.from_dlpack)
    _ubep._set_converters(_from_capsule, np.asarray)
    # Exact torch.Tensor inputs go through torch.to_dlpack (C) instead of the Python body of
    # Tensor.__dlpack__: the same DLPack export, a microsecond less per argument.
    _ubep._set_torch_fast_path(torch.Tensor, torch.utils.dlpack.to_dlpack)
else:  # pragma: no cover
    _ubep._set_converters(None, np.asarray)


def kind_of(x):
    """The framework results are returned in: the one of ``x``."""
    t = type(x)
    if t is _TorchTensor or (_TorchTensor is not None and isinstance(x, _TorchTensor)):
        return TORCH
    if t is np.ndarray or isinstance(x, np.ndarray):
        return NUMPY
    return DLPACK


def owned(a):
    """An owned copy of a result view (``copy=True``)."""
    if a is None:
        return None
    if _TorchTensor is not None and isinstance(a, _TorchTensor):
        return a.clone()
    if isinstance(a, np.ndarray):
        return a.copy()
    return np.array(a, copy=True)


def copy_into(out, y):
    """out[...] = y for torch or NumPy ``out``; returns out."""
    if _TorchTensor is not None and isinstance(out, _TorchTensor):
        out.copy_(y if kind_of(y) == TORCH else torch.utils.dlpack.from_dlpack(y))
    else:
        np.copyto(out, np.asarray(y))
    return out


def accumulate(total, counts):
    """total += counts in total's dtype (DeepEP's cumulative_local_expert_recv_stats is int32)."""
    if _TorchTensor is not None and isinstance(total, _TorchTensor):
        total.add_(counts.to(total.dtype) if kind_of(counts) == TORCH else
                   torch.from_numpy(np.asarray(counts)).to(total.dtype))
    else:
        total += np.asarray(counts).astype(total.dtype)


def dtype_name(dtype):
    """'bf16', 'fp32' or 'fp8' from a string, torch dtype or NumPy dtype."""
    if isinstance(dtype, str):
        return {"bf16": "bf16", "bfloat16": "bf16", "fp32": "fp32", "float32": "fp32",
                "fp8": "fp8", "fp8_e4m3": "fp8", "float8_e4m3fn": "fp8"}.get(dtype, dtype)
    if torch is not None and isinstance(dtype, torch.dtype):
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
