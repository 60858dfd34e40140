"""magiattn: exact attention over slice-list masks (CPU backend), MagiAttention's names.

numpy is the only requirement; torch tensors switch on the autograd / ``torch.compile``
custom ops (``magiattn.torch_ops``, imported on first use) and ``magiattn.viz`` needs
matplotlib. The distributed API (``magiattn.dist``: ``magi_attn_flex_key``, ``dispatch``,
``calc_attn``, ...) needs ``magiattn._dist`` (MPI, NCCL or both), loaded on first use. Errors
from the C++ core arrive as ``ValueError`` naming the culprit.
"""

# First: on a CPU the build does not fit, a clear ImportError instead of an illegal instruction.
from . import _cpu_check  # noqa: F401
from ._C import backward, forward, fwd_flops
from .functional import (
    AttnForwardMeta,
    clear_mask_cache,
    flex_flash_attn_backward,
    flex_flash_attn_func,
    get_mask,
)
from .masks import (
    AttnMaskType,
    Mask,
    block_causal,
    block_sparse,
    block_sparse_topk,
    build_family,
    causal,
    family_names,
    from_dense,
    full,
    infer_attn_mask_from_cu_seqlens,
    infer_attn_mask_from_sliding_window,
    infer_varlen_mask_from_batch,
    load_mask,
    make_mask,
    mask_from_json,
    mask_to_ranges,
    prefix_lm,
    sample_doc_lengths,
    save_mask,
    shared_question,
    sliding_window,
    varlen_block_causal,
    varlen_causal,
    varlen_full,
    varlen_sliding_window,
)
from .ranges import (AttnRange, AttnRanges, RangeError, check_valid_cu_seqlens,
                     is_valid_cu_seqlens)
from .attn_mask import AttnMask
from .plan import DistAttnConfig, load_plan, make_plan, plan_bytes_matrix, plan_cells
from .dist import (
    Communicator,
    DistAttnRuntimeKey,
    calc_attn,
    calc_attn_backward,
    dispatch,
    get_position_ids,
    magi_attn_flex_key,
    magi_attn_varlen_key,
    roll,
    undispatch,
    world_communicator,
)
from .compat import (clear_cache, compute_pad_size, get_most_recent_key, magi_attn_flex_dispatch,
                     magi_attn_varlen_dispatch, roll_simple, squash_batch_dim)
from .qk_clip import QKClipFactors, qk_clip_, qk_clip_factors
from .viz import plot_mask, plot_plan, save_mask_png
from .info import info

try:
    from importlib.metadata import version as _version

    __version__ = _version("magiattn")
except Exception:  # not installed as a distribution (e.g. a build tree on sys.path)
    __version__ = "0.0.0+unknown"

__all__ = [
    "QKClipFactors", "qk_clip_", "qk_clip_factors",
    "AttnForwardMeta", "AttnMask", "AttnMaskType", "AttnRange", "AttnRanges", "Mask",
    "RangeError", "check_valid_cu_seqlens", "is_valid_cu_seqlens",
    "clear_cache", "compute_pad_size", "get_most_recent_key", "magi_attn_flex_dispatch",
    "magi_attn_varlen_dispatch", "roll_simple", "squash_batch_dim",
    "Communicator", "DistAttnConfig", "DistAttnRuntimeKey", "calc_attn", "calc_attn_backward",
    "dispatch", "get_position_ids", "magi_attn_flex_key", "magi_attn_varlen_key", "roll",
    "undispatch", "world_communicator",
    "backward", "block_causal", "block_sparse", "block_sparse_topk", "build_family", "causal",
    "clear_mask_cache", "family_names", "flex_flash_attn_backward", "flex_flash_attn_func",
    "forward", "from_dense", "full", "fwd_flops", "get_mask", "info",
    "infer_attn_mask_from_cu_seqlens",
    "infer_attn_mask_from_sliding_window", "infer_varlen_mask_from_batch", "load_mask",
    "make_mask", "mask_from_json", "mask_to_ranges", "plot_mask", "prefix_lm",
    "load_plan", "make_plan", "plan_bytes_matrix", "plan_cells", "plot_plan",
    "sample_doc_lengths", "save_mask", "save_mask_png", "shared_question", "sliding_window",
    "varlen_block_causal", "varlen_causal", "varlen_full", "varlen_sliding_window",
]
