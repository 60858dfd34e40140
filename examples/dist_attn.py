# mpirun -np 4 python examples/dist_attn.py: every rank plans the same mask, keeps its share
# of the tokens, runs attention forward and backward and gets the global results back.
import torch
import magiattn

torch.manual_seed(0)  # the same global tensors on every rank
n, hq, hkv, d = 1024, 8, 2, 64
cu_seqlens = torch.tensor([0, 300, 700, 1024])
key = magiattn.magi_attn_varlen_key(cu_seqlens, cu_seqlens, hq, hkv, d, causal=True)
q, k, v = (torch.randn(n, h, d, requires_grad=True) for h in (hq, hkv, hkv))
local_q, local_k, local_v = (magiattn.dispatch(x, key) for x in (q, k, v))  # no communication
out, meta = magiattn.calc_attn(local_q, local_k, local_v, key)  # this rank's rows
magiattn.undispatch(out, key).square().sum().backward()  # global out; q.grad on every rank
print(f"rank {key.cp_rank} of {key.cp_size}: {key.num_local_tokens} tokens from position "
      f"{magiattn.get_position_ids(key)[0]}, |dq| {q.grad.norm():.6f}")
