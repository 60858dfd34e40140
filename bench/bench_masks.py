"""The benchmark masks (SPEC §4), without torch: the families every bench script runs, built
with the parameters the benchmark protocol fixes."""
from __future__ import annotations

from magiattn import masks

SPEC_MASKS = ["full", "causal", "varlen-full", "varlen-causal", "sliding-window",
              "varlen-block-causal", "shared-prefix", "block-sparse"]


def build_mask(name: str, seqlen: int):
    kw = {}
    if name == "varlen-block-causal":
        kw["block"] = 2048
    if name == "block-sparse":
        kw.update(block=128, density=0.1)
    return masks.build_family(name, seqlen, seed=0, **kw)
