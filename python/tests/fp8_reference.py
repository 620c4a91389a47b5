"""An independent model of ubep's fp8 e4m3 codec (docs/SEMANTICS.md, "fp8 dispatch"): codes by
nearest search over the table of all 256 e4m3fn values (ties to the even code), not by the bit
tricks of include/ubep/fp8.hpp."""
import numpy as np


def _table():
    vals = np.zeros(256, dtype=np.float64)
    for c in range(256):
        e, m = (c >> 3) & 0xF, c & 7
        v = m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        vals[c] = -v if c & 0x80 else v
    vals[0x7F] = vals[0xFF] = np.nan
    return vals


E4M3 = _table()
_POS = E4M3[:0x7F]  # codes 0..126, increasing magnitudes up to 448


def encode(v):
    """float32 array -> e4m3 codes (uint8): nearest, ties to even, saturating, NaN -> 0x7F."""
    v = np.asarray(v, dtype=np.float32)
    mag = np.minimum(np.abs(v).astype(np.float64), 448.0)
    hi = np.clip(np.searchsorted(_POS, mag), 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    d_lo, d_hi = mag - _POS[lo], _POS[hi] - mag
    pick = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = pick.astype(np.uint8) | np.where(np.signbit(v), 0x80, 0).astype(np.uint8)
    return np.where(np.isnan(v), np.uint8(0x7F), code).astype(np.uint8)


def decode(codes):
    return E4M3[np.asarray(codes, dtype=np.uint8)].astype(np.float32)


def scales_of(x, pow2):
    """x float32 [rows, hidden] -> fp32 scales [rows, ceil(hidden/128)]."""
    rows, hidden = x.shape
    nb = -(-hidden // 128)
    s = np.empty((rows, nb), dtype=np.float32)
    for b in range(nb):
        blk = np.abs(x[:, b * 128:(b + 1) * 128]).astype(np.float32)
        blk = np.where(np.isfinite(blk), blk, 0)
        s[:, b] = np.maximum(blk.max(axis=1), np.float32(1e-4)) / np.float32(448)
    if pow2:
        e = np.ceil(np.log2(s.astype(np.float64)))
        s = np.power(2.0, e).astype(np.float32)
    return s


def quantize(x, pow2=False):
    """float32 [rows, hidden] -> (codes uint8, scales fp32), as ubep's cast on send."""
    x = np.asarray(x, dtype=np.float32)
    s = scales_of(x, pow2)
    inv = (np.float32(1) / s).astype(np.float32)
    rep = np.repeat(inv, 128, axis=1)[:, :x.shape[1]]
    return encode((x * rep).astype(np.float32)), s


def dequantize(codes, scales):
    """float32 values: decode(code) * scale (one fp32 product)."""
    rep = np.repeat(np.asarray(scales, np.float32), 128, axis=-1)[..., :codes.shape[-1]]
    return (decode(codes) * rep).astype(np.float32)
