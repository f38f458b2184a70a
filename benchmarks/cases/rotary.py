"""rotary_embedding, neox, bf16, on slices of a fused qkv projection: 32 query heads, 8 kv heads,
head 128, full rotary, a bf16 cos/sin cache of real angles (so that repeated in-place calls keep
the values' magnitudes)."""

import torch

from . import Case

NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE = 32, 8, 128
MAX_POSITION = 32768


def _cos_sin_cache(device, base=10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, HEAD_SIZE, 2, dtype=torch.float32) / HEAD_SIZE)
    angles = torch.arange(MAX_POSITION, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1).to(torch.bfloat16).to(device)


def _ref(positions, query, key, cos_sin_cache):
    """The same rotation in plain torch (what torch.compile fuses); returns new query and key."""
    cos, sin = cos_sin_cache[positions].float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]

    def rotate(x):
        xf = x.unflatten(-1, (-1, HEAD_SIZE)).float()
        x1, x2 = xf.chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        return out.flatten(-2).to(x.dtype)

    return rotate(query), rotate(key)


def cases(device, shape):
    q_size, k_size = NUM_HEADS * HEAD_SIZE, NUM_KV_HEADS * HEAD_SIZE
    cache = _cos_sin_cache(device)
    for tokens in [shape.large_tokens, *shape.decode]:
        qkv = torch.randn(tokens, q_size + 2 * k_size, dtype=torch.bfloat16, device=device)
        query, key = qkv[:, :q_size], qkv[:, q_size : q_size + k_size]
        positions = torch.randint(0, MAX_POSITION, (tokens,), device=device)
        # q and k read and written once, and each token's cos/sin row read once.
        nbytes = 2 * (query.numel() + key.numel()) * 2 + tokens * HEAD_SIZE * 2
        yield Case(
            "rotary_embedding",
            tokens,
            q_size + k_size,
            nbytes,
            lambda p=positions, q=query, k=key: torch.ops._C.rotary_embedding(
                p, q, k, HEAD_SIZE, cache, True
            ),
            lambda p=positions, q=query, k=key: _ref(p, q, k, cache),
        )
