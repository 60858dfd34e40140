"""Run under torchrun by test_dist_nccl.py (not a pytest module): the NCCL communicator that
Communicator.from_torch_group makes over a torch.distributed process group of the backend
argv[1] ("nccl" or "gloo"), then bf16 CUDA tensors through dispatch, calc_attn forward and
backward and undispatch, against the single-GPU flex_flash_attn_func on the whole sequence
(cuda_compare.py, shared with dist_worker.py). A failure raises (non-zero exit); each rank
prints "rank R: PASS <backend> max rel err E" at the end.
"""

import os
import sys

import torch
import torch.distributed as tdist

import magiattn
from cuda_compare import dist_vs_single_gpu, problem

BACKEND = sys.argv[1]
N, HQ, HKV, D = 2048, 4, 2, 128


def check_communicator(group):
    comm = magiattn.Communicator.from_torch_group(group, timeout=120)
    assert comm.backend == "nccl", comm
    assert (comm.rank, comm.size) == (tdist.get_rank(), tdist.get_world_size()), comm
    assert comm.timeout == 120
    # One per group (creating is collective): None is the default group, and the cache serves it.
    assert magiattn.Communicator.from_torch_group() is comm
    x = torch.full((3, 5), float(comm.rank), device="cuda")
    comm.all_reduce(x)  # on the device: NCCL, ordered on torch's current stream
    assert torch.equal(x, torch.full_like(x, comm.size * (comm.size - 1) / 2)), x
    comm.barrier()
    return comm


def check_attention(group, comm):
    cu = [0, 300, 307, 1100, N]
    key = magiattn.magi_attn_varlen_key(
        cu, cu, HQ, HKV, D, cp_group_or_mesh=group, causal=True,
        dist_attn_config=magiattn.DistAttnConfig(uneven=True))
    assert key.comm is comm  # the group's cached communicator
    gen = torch.Generator(device="cuda").manual_seed(5)  # the same tensors on every rank
    _, err = dist_vs_single_gpu(key, problem(key, N, gen))
    return key, err


def check_device_mesh():
    """A 1-D DeviceMesh is its group; a 2-D one is refused, naming the fix."""
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cuda", (tdist.get_world_size(),))
    key = magiattn.magi_attn_varlen_key([0, N], [0, N], HQ, HKV, D, cp_group_or_mesh=mesh)
    assert key.comm.backend == "nccl" and key.comm.size == tdist.get_world_size()
    mesh2 = init_device_mesh("cuda", (tdist.get_world_size(), 1), mesh_dim_names=("cp", "dp"))
    try:
        magiattn.magi_attn_varlen_key([0, N], [0, N], HQ, HKV, D, cp_group_or_mesh=mesh2)
    except ValueError as e:
        assert "2-D DeviceMesh" in str(e), e
    else:
        raise AssertionError("a 2-D DeviceMesh was accepted")


def main():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    tdist.init_process_group(BACKEND)
    group = tdist.group.WORLD
    comm = check_communicator(group)
    key, err = check_attention(group, comm)
    if BACKEND == "nccl":
        check_device_mesh()
    print(f"rank {key.cp_rank}: PASS {BACKEND} max rel err {err:.2e}", flush=True)
    tdist.destroy_process_group()


main()
