"""The paged KV cache (kernels/cache): writing keys and values into it, in the paged layout
that paged attention reads or in the flash layout, and copying or swapping whole blocks.

Layouts (x = 16 // cache element size: 8 for 16-bit caches, 16 for fp8, 4 for fp32):
  paged: key_cache [num_blocks, num_kv_heads, head_size // x, block_size, x],
         value_cache [num_blocks, num_kv_heads, head_size, block_size]
  flash: key_cache and value_cache [num_blocks, block_size, num_kv_heads, head_size]
Slot s of a cache is offset s % block_size of block s // block_size; a negative slot in
slot_mapping is padding and is skipped. fp8 caches (uint8 or float8_e4m3fn) hold
e4m3(x * (1 / scale)), rounded to nearest even and saturated to +-448.
"""

from __future__ import annotations

import torch

from .. import load

FP8_MAX = 448.0


def paged_key_chunk(cache_dtype: torch.dtype) -> int:
    """x: cache elements per 16-byte key chunk of the paged layout."""
    return 16 // torch.empty((), dtype=cache_dtype).element_size()


def _scale(scale: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    if scale is None:
        return torch.ones(1, dtype=torch.float32, device=like.device)
    return scale


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "auto",
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Writes key/value [num_tokens, num_kv_heads, head_size] into paged-layout caches."""
    load("_C")
    torch.ops._C.reshape_and_cache(
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        kv_cache_dtype,
        _scale(k_scale, key),
        _scale(v_scale, key),
    )


def reshape_and_cache_flash(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "auto",
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Writes key/value [num_tokens, num_kv_heads, head_size] into flash-layout caches."""
    load("_C")
    torch.ops._C.reshape_and_cache_flash(
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        kv_cache_dtype,
        _scale(k_scale, key),
        _scale(v_scale, key),
    )


def copy_blocks(
    key_caches: list[torch.Tensor], value_caches: list[torch.Tensor], block_mapping: torch.Tensor
) -> None:
    """For every layer, copies block src to block dst for each (src, dst) row of block_mapping
    (int64 [num_pairs, 2])."""
    load("_C")
    torch.ops._C.copy_blocks(key_caches, value_caches, block_mapping)


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """Copies block src of `src` to block dst of `dst` for each row of block_mapping (int64
    [num_pairs, 2] on the CPU); the tensors may be on the GPU and the CPU."""
    load("_C")
    torch.ops._C.swap_blocks(src, dst, block_mapping)


# ---------------------------------------------------------------------------------------------
# References in plain torch.


def to_cache_ref(x: torch.Tensor, cache_dtype: torch.dtype, scale: torch.Tensor | None):
    """The cache elements for x: x itself for caches of x's dtype, else e4m3(x * (1 / scale))
    (as float8_e4m3fn, or its bits as uint8)."""
    if cache_dtype == x.dtype:
        return x
    inv = 1.0 / scale.float().reshape(())
    q = (x.float() * inv).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(torch.uint8) if cache_dtype == torch.uint8 else q


def from_cache_ref(c: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """fp32 values of cache elements (fp8 ones times scale)."""
    if c.dtype in (torch.uint8, torch.float8_e4m3fn):
        return c.view(torch.float8_e4m3fn).float() * scale.float().reshape(())
    return c.float()


def _valid(slot_mapping: torch.Tensor):
    keep = slot_mapping >= 0
    return keep, slot_mapping[keep]


def reshape_and_cache_ref(
    key, value, key_cache, value_cache, slot_mapping, k_scale=None, v_scale=None, flash=False
) -> tuple[torch.Tensor, torch.Tensor]:
    """New (key_cache, value_cache): copies of the caches with the tokens written (fp8 caches
    when their dtype is uint8 or float8_e4m3fn; otherwise the caches hold key's dtype)."""
    keep, slots = _valid(slot_mapping)
    n = slot_mapping.shape[0]
    k = to_cache_ref(key[:n][keep], key_cache.dtype, k_scale)
    v = to_cache_ref(value[:n][keep], value_cache.dtype, v_scale)
    key_cache, value_cache = key_cache.clone(), value_cache.clone()
    if flash:
        block_size = key_cache.shape[1]
        blocks, offsets = slots // block_size, slots % block_size
        key_cache[blocks, offsets] = k
        value_cache[blocks, offsets] = v
    else:
        block_size, x = key_cache.shape[3], key_cache.shape[4]
        blocks, offsets = slots // block_size, slots % block_size
        key_cache[blocks, :, :, offsets, :] = k.reshape(k.shape[0], k.shape[1], -1, x)
        value_cache[blocks, :, :, offsets] = v
    return key_cache, value_cache


def gather_ref(key_cache, value_cache, slots, flash=False) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache elements at `slots` (all >= 0), as [len(slots), num_kv_heads, head_size]."""
    if flash:
        block_size = key_cache.shape[1]
        blocks, offsets = slots // block_size, slots % block_size
        return key_cache[blocks, offsets], value_cache[blocks, offsets]
    block_size = key_cache.shape[3]
    blocks, offsets = slots // block_size, slots % block_size
    k = key_cache[blocks, :, :, offsets, :]
    return k.reshape(k.shape[0], k.shape[1], -1), value_cache[blocks, :, :, offsets]


def copy_blocks_ref(key_caches, value_caches, block_mapping) -> tuple[list, list]:
    """New per-layer caches with the blocks copied."""
    src, dst = block_mapping[:, 0].cpu(), block_mapping[:, 1].cpu()
    out = []
    for caches in (key_caches, value_caches):
        new = [c.clone() for c in caches]
        for c, n in zip(caches, new, strict=True):
            n[dst.to(c.device)] = c[src.to(c.device)]
        out.append(new)
    return out[0], out[1]


def swap_blocks_ref(src, dst, block_mapping) -> torch.Tensor:
    """A new dst with the blocks of src copied in."""
    out = dst.clone()
    out[block_mapping[:, 1].to(dst.device)] = src[block_mapping[:, 0].to(src.device)].to(dst.device)
    return out
