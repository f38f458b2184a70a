"""reshape_and_cache (paged layout) and reshape_and_cache_flash: bf16 keys and values of 8 kv
heads x 128, sliced from a fused qkv projection (32 query heads), written into block-16 caches.
Prefill tokens (the large size) fill whole blocks taken in shuffled order; decode tokens (the
decode sizes, 64 included: one token per sequence) go to random slots of distinct blocks. The
peer is the same scatter as advanced-index assignment."""

import torch

from . import Case

HEADS, HEAD_SIZE, BLOCK_SIZE, Q_HEADS = 8, 128, 16, 32
X = 8  # bf16 elements per 16-byte key chunk of the paged layout


def _paged_ref(key, value, key_cache, value_cache, slots):
    blocks, offsets = slots // BLOCK_SIZE, slots % BLOCK_SIZE
    key_cache[blocks, :, :, offsets, :] = key.reshape(key.shape[0], HEADS, HEAD_SIZE // X, X)
    value_cache[blocks, :, :, offsets] = value


def _flash_ref(key, value, key_cache, value_cache, slots):
    blocks, offsets = slots // BLOCK_SIZE, slots % BLOCK_SIZE
    key_cache[blocks, offsets] = key
    value_cache[blocks, offsets] = value


def _slots(tokens, num_blocks, device, decode):
    perm = torch.randperm(num_blocks)
    if decode:  # one token per sequence
        offsets = torch.randint(0, BLOCK_SIZE, (tokens,))
        return (perm[:tokens] * BLOCK_SIZE + offsets).to(device)
    t = torch.arange(tokens)
    return (perm[t // BLOCK_SIZE] * BLOCK_SIZE + t % BLOCK_SIZE).to(device)


def cases(device, shape):
    dtype = torch.bfloat16
    for tokens in [shape.large_tokens, *shape.decode]:
        num_blocks = max(2 * tokens // BLOCK_SIZE, 64)
        qkv = torch.randn(tokens, (Q_HEADS + 2 * HEADS) * HEAD_SIZE, dtype=dtype, device=device)
        kv = qkv[:, Q_HEADS * HEAD_SIZE :].view(tokens, 2, HEADS, HEAD_SIZE)
        key, value = kv[:, 0], kv[:, 1]
        slots = _slots(tokens, num_blocks, device, tokens in shape.decode)
        scale = torch.ones(1, device=device)
        nbytes = 4 * tokens * HEADS * HEAD_SIZE * qkv.element_size()
        kc = torch.zeros(
            num_blocks, HEADS, HEAD_SIZE // X, BLOCK_SIZE, X, dtype=dtype, device=device
        )
        vc = torch.zeros(num_blocks, HEADS, HEAD_SIZE, BLOCK_SIZE, dtype=dtype, device=device)
        yield Case(
            "reshape_and_cache",
            tokens,
            HEADS * HEAD_SIZE,
            nbytes,
            lambda k=key, v=value, kc=kc, vc=vc, s=slots, sc=scale: torch.ops._C.reshape_and_cache(
                k, v, kc, vc, s, "auto", sc, sc
            ),
            lambda k=key, v=value, kc=kc, vc=vc, s=slots: _paged_ref(k, v, kc, vc, s),
        )
        fc = torch.zeros(num_blocks, 2, BLOCK_SIZE, HEADS, HEAD_SIZE, dtype=dtype, device=device)
        yield Case(
            "reshape_and_cache_flash",
            tokens,
            HEADS * HEAD_SIZE,
            nbytes,
            lambda k=key, v=value, fc=fc, s=slots, sc=scale: torch.ops._C.reshape_and_cache_flash(
                k, v, fc[:, 0], fc[:, 1], s, "auto", sc, sc
            ),
            lambda k=key, v=value, fc=fc, s=slots: _flash_ref(k, v, fc[:, 0], fc[:, 1], s),
        )
