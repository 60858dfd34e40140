# torchrun --nproc_per_node=N examples/dist_attn_torchrun.py: context parallelism over N GPUs
# with NCCL. Every rank plans the same varlen causal mask over 16k tokens, keeps its share of
# the tokens, runs attention forward and backward and gets the global results back; rank 0
# compares them with the single-GPU kernel on the whole sequence.
import os

import torch
import torch.distributed as dist

import magiattn

torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
group = dist.group.WORLD  # the cp group: any ProcessGroup (gloo too) or a 1-D DeviceMesh
n, hq, hkv, d = 16384, 8, 2, 128
cu_seqlens = [0, 3000, 7000, 7100, 12000, n]  # five documents, each causal
ranges = [[a, b] for a, b in zip(cu_seqlens, cu_seqlens[1:])]
key = magiattn.magi_attn_flex_key(ranges, ranges, "causal", n, n, hq, hkv, d,
                                  cp_group_or_mesh=group)  # NCCL, made once per group

torch.manual_seed(0)  # the same global tensors on every rank
q, k, v = (torch.randn(n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for h in (hq, hkv, hkv))
dout = torch.randn(n, hq, d, device="cuda", dtype=torch.bfloat16)
local_q, local_k, local_v = (magiattn.dispatch(x, key) for x in (q, k, v))  # no communication
out, meta = magiattn.calc_attn(local_q, local_k, local_v, key)  # this rank's rows
global_out = magiattn.undispatch(out, key)  # every rank's rows, in the global order
global_out.backward(dout)  # q.grad, k.grad, v.grad: the global gradients, on every rank

if dist.get_rank() == 0:
    q1, k1, v1 = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    out1, _ = magiattn.flex_flash_attn_func(q1, k1, v1, mask=key.mask)  # one GPU, all tokens
    out1.backward(dout)

    def rel(a, b):  # max |a - b| / max |b|
        return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()

    errs = {"out": rel(global_out, out1), "dq": rel(q.grad, q1.grad),
            "dk": rel(k.grad, k1.grad), "dv": rel(v.grad, v1.grad)}
    print(f"{key.cp_size} GPUs, {n} tokens, {key.num_local_tokens} on rank 0; max relative "
          "error vs one GPU: " + ", ".join(f"{name} {e:.2e}" for name, e in errs.items()))
    assert errs["out"] < 2e-2 and max(errs.values()) < 3e-2, errs  # bf16 rounding
    print("OK")
dist.destroy_process_group()
