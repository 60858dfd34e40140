# One attention layer trained with a varlen-causal mask (3 packed documents) through
# magiattn.flex_flash_attn_func and torch autograd; the printed loss should decrease.
import torch
import magiattn

torch.manual_seed(0)
tokens, dim, heads, head_dim = 256, 64, 4, 16
cu_seqlens = torch.tensor([0, 100, 180, 256])
q_ranges, k_ranges, types, _, _ = magiattn.infer_attn_mask_from_cu_seqlens(cu_seqlens, cu_seqlens, causal=True)
q_ranges, k_ranges = q_ranges.to_tensor(), k_ranges.to_tensor()
attn_type_map = torch.tensor([t.to_int_type() for t in types], dtype=torch.int32)
qkv, proj = torch.nn.Linear(dim, 3 * heads * head_dim), torch.nn.Linear(heads * head_dim, dim)
opt = torch.optim.Adam([*qkv.parameters(), *proj.parameters()], lr=1e-2)
x, target = torch.randn(tokens, dim), torch.randn(tokens, dim)
for step in range(20):
    q, k, v = qkv(x).view(tokens, 3, heads, head_dim).unbind(1)
    out, meta = magiattn.flex_flash_attn_func(q, k, v, q_ranges, k_ranges, attn_type_map)
    loss = torch.nn.functional.mse_loss(proj(out.reshape(tokens, -1)), target)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step:2d} loss {loss.item():.4f}")
