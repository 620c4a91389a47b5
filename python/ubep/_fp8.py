"""fp8 e4m3 arrays at the Python boundary (docs/SEMANTICS.md, "fp8 dispatch").

The extension moves e4m3 codes as bytes (DLPack has no float8 type torch 1.13 or NumPy can
export), so codes cross as uint8 and come back as ``torch.float8_e4m3fn`` where torch has it
(2.1 and later) and as uint8 elsewhere. Scales are fp32, one per 128 channels of a row.
"""
from . import _arrays, _ubep
from ._arrays import NUMPY, TORCH, kind_of



def _float8():
    """torch.float8_e4m3fn; None on torch < 2.1 and where torch is not loaded: codes stay uint8."""
    t = _arrays.torch_module()
    return getattr(t, "float8_e4m3fn", None) if t is not None else None


def is_fp8_codes(a):
    """True for arrays that hold e4m3 codes: float8_e4m3fn tensors, uint8 tensors/arrays."""
    if kind_of(a) == TORCH:
        f8 = _float8()
        return a.dtype == _arrays.torch.uint8 or (f8 is not None and a.dtype == f8)
    return getattr(a, "dtype", None) is not None and str(a.dtype) == "uint8"


def codes_in(codes, what):
    """The codes as a uint8 array the extension takes (a view, no copy)."""
    if not is_fp8_codes(codes):
        raise _ubep.InvalidArgument(
            f"{what}: fp8 codes must be torch.float8_e4m3fn or uint8, got "
            f"{getattr(codes, 'dtype', type(codes).__name__)}")
    f8 = _float8()
    if f8 is not None and kind_of(codes) == TORCH and codes.dtype == f8:
        return codes.view(_arrays.torch.uint8)
    return codes


def codes_out(codes):
    """Received codes (uint8 views) in the caller's framework: float8_e4m3fn when torch has it."""
    f8 = _float8()
    if f8 is not None and kind_of(codes) == TORCH:
        return codes.view(f8)
    return codes


def cast_dtype(x):
    """'bf16' or 'fp32': what a non-fp8 x is, for an fp8 buffer that casts it on send."""
    name = _arrays.dtype_name(getattr(x, "dtype", None))
    if name not in ("bf16", "fp32"):
        raise _ubep.InvalidArgument(
            f"dispatch: x must be bfloat16 or float32 (cast to fp8 on send), or a (codes, scales) "
            f"tuple, got {getattr(x, 'dtype', type(x).__name__)}")
    return name


def pack_ue8m0(scales, what="use_ue8m0"):
    """DeepEP's UE8M0 scale format: each power-of-two fp32 scale as its exponent byte, four
    blocks per int32 (block 4j+i in byte i, little-endian): [..., blocks] -> [..., blocks/4]."""
    blocks = scales.shape[-1]
    if blocks % 4:
        raise _ubep.InvalidArgument(
            f"{what}: packing UE8M0 scales needs hidden to be a multiple of 512 "
            f"({blocks} scale blocks per row is not a multiple of 4)")
    if kind_of(scales) == TORCH:
        t = _arrays.torch
        exp = (scales.contiguous().view(t.int32) >> 23) & 0xFF
        return exp.to(t.uint8).view(t.int32)
    import numpy as np
    exp = (np.ascontiguousarray(scales).view(np.int32) >> 23) & 0xFF
    return exp.astype(np.uint8).view(np.int32)


def is_numpy(a):
    return kind_of(a) == NUMPY
