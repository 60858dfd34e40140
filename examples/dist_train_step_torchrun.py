# torchrun --nproc_per_node=N examples/dist_train_step_torchrun.py: one training step of an
# attention layer under context parallelism over N GPUs (NCCL). The tokens are dispatched once,
# before the model: every per-token layer runs on this rank's rows, only calc_attn communicates.
# The weights are replicated, so their gradients are summed over the cp group (what DDP or
# FSDP does over a data x context mesh). Rank 0 checks the step against the same layer on the
# whole sequence on one GPU.
import os

import torch
import torch.distributed as dist

import magiattn

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
n, width, heads, kv_heads, d = 16384, 1024, 8, 2, 128
cu_seqlens = [0, 3000, 7000, 7100, 12000, n]  # five packed documents, each causal
key = magiattn.magi_attn_varlen_key(cu_seqlens, cu_seqlens, heads, kv_heads, d, causal=True,
                                    cp_group_or_mesh=dist.group.WORLD)


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(width, (heads + 2 * kv_heads) * d, bias=False)
        self.out = torch.nn.Linear(heads * d, width, bias=False)

    def forward(self, x, attend):  # x: [tokens, width]
        q, k, v = self.qkv(x).split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
        o = attend(q.unflatten(-1, (heads, d)), k.unflatten(-1, (kv_heads, d)),
                   v.unflatten(-1, (kv_heads, d)))
        return self.out(o.flatten(-2))


torch.manual_seed(0)  # the same weights and tokens on every rank
model = Attention().cuda().to(torch.bfloat16)
tokens = torch.randn(n, width, device="cuda", dtype=torch.bfloat16)
x = magiattn.dispatch(tokens, key)  # this rank's rows, in the plan's order
y = model(x, lambda q, k, v: magiattn.calc_attn(q, k, v, key)[0])
loss = y.float().square().sum() / n  # this rank's share of the global mean
loss.backward()
for p in model.parameters():  # replicated weights: sum the cp ranks' gradients
    dist.all_reduce(p.grad)
grads = [p.grad.clone() for p in model.parameters()]
torch.optim.SGD(model.parameters(), lr=1e-3).step()

if dist.get_rank() == 0:
    torch.manual_seed(0)
    one = Attention().cuda().to(torch.bfloat16)  # the same initial weights
    mask = key.mask
    (one(tokens, lambda q, k, v: magiattn.flex_flash_attn_func(q, k, v, mask=mask)[0])
     .float().square().sum() / n).backward()

    def rel(a, b):  # max |a - b| / max |b|
        return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()

    errs = [rel(g, p.grad) for g, p in zip(grads, one.parameters())]
    print(f"{key.cp_size} GPUs, {n} tokens, {key.num_local_tokens} on rank 0: weight "
          f"gradients vs one GPU, max relative error {max(errs):.2e}")
    assert max(errs) < 3e-2, errs  # bf16 rounding
    print("OK")
dist.destroy_process_group()
