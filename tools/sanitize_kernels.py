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
fp8 = torch.float8_e4m3fn
for dtype in (torch.float32, torch.bfloat16):
    # Rows in registers (narrow and wide), rows read twice, the single-block and two-kernel
    # dynamic paths, vector tails, and the one-element path of a misaligned slice.
    for tokens, d in ((3, 769), (37, 8), (5, 4096), (2, 40000), (97, 4099)):
        base = torch.randn(tokens, (d + 7) // 8 * 8 + 8, dtype=dtype, device=dev)
        for x in (base[:, :d].contiguous(), base[:, :d], base[:, 1 : d + 1]):
            q = torch.empty(tokens, d, dtype=fp8, device=dev)
            torch.ops._C.static_scaled_fp8_quant(q, x, torch.tensor([0.01], device=dev))
            torch.ops._C.dynamic_scaled_fp8_quant(q, x, torch.empty(1, device=dev))
            ub = torch.tensor([1.0], device=dev)
            scales = torch.empty(tokens, 1, device=dev)
            torch.ops._C.dynamic_per_token_scaled_fp8_quant(q, x, scales, ub)
torch.cuda.synchronize()
print("sanitize_kernels: all kernels ran")
