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
# marlin: repacks, and the GEMM with and without split-K, every weight type and group mode.
from aphrodite_ext.ops import marlin  # noqa: E402

for k, n in ((208, 192), (1152, 320)):
    codes = torch.randint(0, 16, (k, n), dtype=torch.int32, device=dev)
    perm = torch.randperm(k, device=dev).to(torch.int32)
    torch.ops._C.gptq_marlin_repack(marlin.pack_gptq(codes), perm, k, n, 4)
    torch.ops._C.awq_marlin_repack(marlin.pack_awq(codes), k, n, 4)
    for dtype in (torch.float16, torch.bfloat16):
        for weight_type in ("uint4b8", "uint4"):
            for group in (32, -1) if k % 32 == 0 else (-1,):
                for act_order in (False, True) if group != -1 else (False,):
                    w = torch.randn(k, n, device=dev) * 0.05
                    q = marlin.quantize_weights(w, weight_type, group, act_order, dtype)
                    p = q["perm"] if act_order else None
                    packed = marlin.gptq_marlin_repack(marlin.pack_gptq(q["codes"]), p, k, n)
                    zeros = marlin.pack_plain(q["zeros"]) if weight_type == "uint4" else None
                    for m in (1, 33, 130):
                        marlin.gptq_marlin_gemm(
                            torch.randn(m, k, dtype=dtype, device=dev),
                            packed,
                            q["scales"],
                            marlin.make_workspace(dev),
                            weight_type,
                            b_zeros=zeros,
                            g_idx=q["g_idx"] if act_order else None,
                            perm=p,
                            bias=torch.randn(n, dtype=dtype, device=dev),
                        )
torch.cuda.synchronize()
print("sanitize_kernels: all kernels ran")
