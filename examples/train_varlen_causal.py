# One attention layer trained on 3 packed documents with a varlen-causal mask through
# magiattn.flex_flash_attn_func and torch autograd; the printed loss should decrease.
import torch
import magiattn

torch.manual_seed(0)
tokens, dim, heads, head_dim = 256, 64, 4, 16
ranges = torch.tensor([[0, 100], [100, 180], [180, 256]], dtype=torch.int32)  # q = k per doc
attn_type_map = torch.tensor([1, 1, 1], dtype=torch.int32)  # 1 = causal
qkv, proj = torch.nn.Linear(dim, 3 * heads * head_dim), torch.nn.Linear(heads * head_dim, dim)
opt = torch.optim.Adam([*qkv.parameters(), *proj.parameters()], lr=1e-2)
x, target = torch.randn(tokens, dim), torch.randn(tokens, dim)
for step in range(20):
    q, k, v = qkv(x).view(tokens, 3, heads, head_dim).unbind(1)
    out, meta = magiattn.flex_flash_attn_func(q, k, v, ranges, ranges, attn_type_map)
    loss = torch.nn.functional.mse_loss(proj(out.reshape(tokens, -1)), target)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step:2d} loss {loss.item():.4f}")
