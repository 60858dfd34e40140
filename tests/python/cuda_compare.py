"""Shared by the distributed workers (dist_worker.py under mpirun, torchrun_worker.py under
torchrun; not a pytest module): bf16 CUDA tensors through dispatch, calc_attn forward and
backward and undispatch, against the single-GPU flex_flash_attn_func on the whole sequence
(every rank computes it). Both round P to bf16 and the stages merge in fp32, so they agree
within bf16 rounding: out 2e-2, lse 1e-3, max_logits 1e-6, dq/dk/dv 3e-2 (relative to the
largest entry). A miss raises AssertionError naming the output."""

import torch

import magiattn


def rel(name, a, b, tol):
    err = float((a.double() - b.double()).abs().max() / b.double().abs().max())
    assert torch.isfinite(a).all() and err <= tol, f"{name}: relative error {err:.3g} > {tol}"
    return err


def problem(key, n, generator):
    """q, k, v, dout for key's head counts, bf16 on the current CUDA device, the same on every
    rank (the generator is seeded alike everywhere)."""
    hq, hkv, d = key.num_heads_q, key.num_heads_kv, key.head_dim
    return {x: torch.randn(shape, generator=generator, device="cuda").to(torch.bfloat16)
            for x, shape in (("q", (n, hq, d)), ("k", (n, hkv, d)), ("v", (n, hkv, d)),
                             ("dout", (n, hq, d)))}


def dist_vs_single_gpu(key, p):
    """The largest relative error of out, lse, max_logits, dq, dk, dv (each within its bar)."""
    q, k, v = (p[x].clone().requires_grad_(True) for x in "qkv")
    out, meta = magiattn.calc_attn(*(magiattn.dispatch(x, key) for x in (q, k, v)), key,
                                   return_max_logits=True)
    assert out.is_cuda and out.dtype == torch.bfloat16 and meta.lse.is_cuda
    magiattn.undispatch(out, key).backward(p["dout"])
    q1, k1, v1 = (p[x].clone().requires_grad_(True) for x in "qkv")
    out1, meta1 = magiattn.flex_flash_attn_func(q1, k1, v1, mask=key.mask,
                                                return_max_logits=True)
    out1.backward(p["dout"])
    pos = torch.from_numpy(magiattn.get_position_ids(key)).to("cuda")
    errs = [rel("out", out.detach(), out1.detach()[pos], 2e-2),
            rel("lse", meta.lse, meta1.lse[pos], 1e-3),
            rel("max_logits", meta.max_logits, meta1.max_logits, 1e-6)]
    errs += [rel(f"d{x}", a.grad, b.grad, 3e-2) for x, a, b in
             (("q", q, q1), ("k", k, k1), ("v", v, v1))]
    return out.detach(), max(errs)
