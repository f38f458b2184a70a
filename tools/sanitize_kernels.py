"""Calls every GPU kernel once on small, odd-sized inputs; run under compute-sanitizer
(memcheck, racecheck) by tools/gpu_run.sh."""

import torch

import aphrodite_ext

aphrodite_ext.load("_C")
aphrodite_ext.load("_moe_C")
dev = "cuda"
for dtype in (torch.float32, torch.bfloat16):
    for tokens, d in ((3, 769), (5, 4096)):
        x = torch.randn(tokens, 2 * d, dtype=dtype, device=dev)
        out = torch.empty(tokens, d, dtype=dtype, device=dev)
        for name in ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"):
            getattr(torch.ops._C, name)(out, x)
        w = torch.randn(d, dtype=dtype, device=dev)
        h = x[:, :d].contiguous()
        torch.ops._C.rms_norm(out, h, w, 1e-6)
        torch.ops._C.fused_add_rms_norm(h, out, w, 1e-6)
for experts, k in ((8, 2), (64, 8), (256, 8), (83, 5), (600, 4)):
    g = torch.randn(9, experts, device=dev)
    tw = torch.empty(9, k, device=dev)
    ti = torch.empty(9, k, dtype=torch.int32, device=dev)
    torch.ops._moe_C.topk_softmax(tw, ti, torch.empty_like(ti), g, True)


def _pa_call(op, **named):
    """torch.ops._C.<op> by argument name; arguments beyond ours take neutral values."""
    packet = getattr(torch.ops._C, op)
    neutral = {
        "tp_rank": 0,
        "blocksparse_local_blocks": 0,
        "blocksparse_vert_stride": 0,
        "blocksparse_block_size": 64,
        "blocksparse_head_sliding_step": 0,
    }
    args = [
        named[a.name] if a.name in named else neutral.get(a.name, a.default_value)
        for a in packet.default._schema.arguments
    ]
    packet(*args)


# paged attention: v1, v2 (partitions of 512: seq len 600 has two, one of them partial), plain
# and XL, GQA 4, ALiBi, odd seq lens, block sizes 16 and 32, fp8 caches where built.
for head, block, cache in ((80, 16, "auto"), (128, 32, "auto"), (128, 16, "fp8")):
    seq_lens = torch.tensor([1, 17, 600, 0], dtype=torch.int32, device=dev)
    nseq, heads, kv_heads, max_len = 4, 8, 2, 600
    nblk = (max_len + block - 1) // block
    elem = torch.uint8 if cache == "fp8" else torch.bfloat16
    x = 16 // torch.empty((), dtype=elem).element_size()
    num_blocks = nseq * nblk + 3
    kc = torch.randint(0, 100, (num_blocks, kv_heads, head // x, block, x), device=dev)
    vc = torch.randint(0, 100, (num_blocks, kv_heads, head, block), device=dev)
    if cache == "fp8":
        kc, vc = kc.to(torch.uint8), vc.to(torch.uint8)
    else:
        kc, vc = kc.to(torch.bfloat16) / 50, vc.to(torch.bfloat16) / 50
    tables = torch.randperm(num_blocks, device=dev)[: nseq * nblk].view(nseq, nblk).int()
    q = torch.randn(nseq, heads, head, dtype=torch.bfloat16, device=dev)
    out = torch.empty_like(q)
    parts = (max_len + 511) // 512
    scratch = dict(
        exp_sums=torch.empty(nseq, heads, parts, device=dev),
        max_logits=torch.empty(nseq, heads, parts, device=dev),
        tmp_out=torch.empty(nseq, heads, parts, head, device=dev),
    )
    one = torch.ones((), device=dev)
    common = dict(
        out=out,
        query=q,
        key_cache=kc,
        value_cache=vc,
        num_kv_heads=kv_heads,
        scale=head**-0.5,
        block_tables=tables,
        seq_lens=seq_lens,
        block_size=block,
        max_seq_len=max_len,
        kv_cache_dtype=cache,
        k_scale=one,
        v_scale=one,
    )
    alibi = torch.rand(heads, device=dev)
    xl = dict(
        pos_bias_u=torch.randn_like(q),
        matrix_bd=torch.randn(nseq, heads, max_len, dtype=q.dtype, device=dev),
    )
    try:
        _pa_call("paged_attention_v1", alibi_slopes=alibi, **common)
    except RuntimeError as e:
        if "not built" not in str(e) and "were not built" not in str(e):
            raise
        continue  # this build's generator options left the combination out
    _pa_call("paged_attention_v2", alibi_slopes=None, **scratch, **common)
    _pa_call("xl_paged_attention_v1", alibi_slopes=None, **xl, **common)
    _pa_call("xl_paged_attention_v2", alibi_slopes=alibi, **xl, **scratch, **common)
torch.cuda.synchronize()
print("sanitize_kernels: all kernels ran")
