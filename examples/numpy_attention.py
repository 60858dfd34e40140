"""Attention over a varlen-causal mask with numpy arrays, forward and backward, checked
against a dense numpy reference (the README's Python example; CI runs it in a fresh virtualenv
after a plain `pip install .`).

    python examples/numpy_attention.py
"""
import numpy as np

import magiattn

rng = np.random.default_rng(0)
mask = magiattn.varlen_causal(np.array([0, 100, 180, 256]))  # every builder returns a Mask
q = rng.standard_normal((256, 8, 64))                          # [Nq, Hq, D]
k, v = rng.standard_normal((256, 2, 64)), rng.standard_normal((256, 2, 64))  # GQA 8:2
out, meta = magiattn.flex_flash_attn_func(q, k, v, mask.q_ranges(), mask.k_ranges(),
                                          mask.attn_type_map(), return_max_logits=True)
dq, dk, dv, _ = magiattn.flex_flash_attn_backward(np.ones_like(out), q, k, v, out, meta.lse,
                                                  mask=mask)

# The same attention, dense: softmax(scale q k^T) over the visible cells, per q head.
visible = mask.to_dense().astype(bool)
ref = np.empty_like(out)
for h in range(8):
    s = q[:, h] @ k[:, h // 4].T / np.sqrt(64)
    s = np.where(visible, s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    ref[:, h] = (p / p.sum(axis=1, keepdims=True)) @ v[:, h // 4]
err = np.abs(out - ref).max()
print(f"out {out.shape}, lse {meta.lse.shape}, dq {dq.shape}, dk {dk.shape}; "
      f"max |out - dense reference| = {err:.2e}")
assert err < 1e-4, err
print("ok")
