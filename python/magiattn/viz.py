"""Pictures of masks: the visible area (downsampled to at most ``max_cells`` per side) with
each slice's outline on top, coloured by type.

matplotlib is imported on first use only, so the package never requires it. The outline of a
slice is its rectangle clipped to the diagonal band ``lo - 1/2 <= k - q <= hi + 1/2`` (cell
centres sit on integer diagonals): the midline of a causal edge's staircase.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from .masks import Mask

__all__ = ["plot_mask", "save_mask_png", "block_coverage", "plot_plan", "plan_owner_images"]

_TYPE_NAMES = ("full", "causal", "inv_causal", "bi_causal")
_TYPE_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red")
# Dense path up to this many cells (16 MB of bools); beyond it, tile classes stand in.
_DENSE_LIMIT = 1 << 24


def _matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:  # pragma: no cover - exercised only without matplotlib
        raise ImportError("magiattn.viz needs matplotlib: python3 -m pip install matplotlib") from e
    return matplotlib


def block_coverage(mask: Mask, max_cells: int = 512) -> tuple[np.ndarray, int, int]:
    """``(coverage [nq, nk] in [0, 1], block_q, block_k)``: the visible fraction of each block.

    Exact (from the dense mask) while ``sq * sk`` stays under 16M cells; above that, blocks
    are classified empty / partial / full by ``Mask.classify_tiles`` and partial shows as 0.5.
    """
    if max_cells <= 0:
        raise ValueError(f"max_cells {max_cells} must be positive")
    sq, sk = mask.total_seqlen_q, mask.total_seqlen_k
    bq, bk = max(1, math.ceil(sq / max_cells)), max(1, math.ceil(sk / max_cells))
    if sq == 0 or sk == 0:
        return np.zeros((0 if sq == 0 else 1, 0 if sk == 0 else 1)), bq, bk
    if sq * sk <= _DENSE_LIMIT:
        dense = mask.to_dense()
        nq, nk = math.ceil(sq / bq), math.ceil(sk / bk)
        padded = np.zeros((nq * bq, nk * bk), np.float32)
        padded[:sq, :sk] = dense
        counts = padded.reshape(nq, bq, nk, bk).sum(axis=(1, 3))
        rows = np.minimum(bq, sq - bq * np.arange(nq))[:, None]
        cols = np.minimum(bk, sk - bk * np.arange(nk))[None, :]
        return counts / (rows * cols), bq, bk
    tiles = mask.classify_tiles(bq, bk)
    return np.choose(tiles, [0.0, 0.5, 1.0]), bq, bk


def _clip(poly: list[tuple[float, float]], keep) -> list[tuple[float, float]]:
    """Sutherland-Hodgman: clip a convex polygon by the half-plane ``keep(x, y) >= 0``."""
    out: list[tuple[float, float]] = []
    for i, cur in enumerate(poly):
        prev = poly[i - 1]
        fc, fp = keep(*cur), keep(*prev)
        if (fc >= 0) != (fp >= 0):
            t = fp / (fp - fc)
            out.append((prev[0] + t * (cur[0] - prev[0]), prev[1] + t * (cur[1] - prev[1])))
        if fc >= 0:
            out.append(cur)
    return out


def slice_outline(qs: int, qe: int, ks: int, ke: int, kind: int) -> list[tuple[float, float]]:
    """Polygon (x = key, y = query) of a slice's visible cells; empty if it has none."""
    poly = [(ks, qs), (ke, qs), (ke, qe), (ks, qe)]
    if kind in (1, 3):  # CAUSAL edge: k - q <= ke - qe
        hi = ke - qe
        poly = _clip(poly, lambda x, y: hi + 0.5 - (x - y)) if poly else poly
    if kind in (2, 3):  # INV_CAUSAL edge: k - q >= ks - qs
        lo = ks - qs
        poly = _clip(poly, lambda x, y: (x - y) - (lo - 0.5)) if poly else poly
    return poly if len(poly) >= 3 else []


def plot_mask(mask: Mask, ax: Any = None, max_cells: int = 512, title: Optional[str] = None,
              outlines: bool = True) -> Any:
    """Draw ``mask`` on ``ax`` (a new pyplot figure if None) and return the axes.

    Queries run down, keys across. Colour = visible fraction of each displayed block; slice
    outlines are coloured by type (full, causal, inv_causal, bi_causal). ``ax.figure`` is the
    figure.
    """
    _matplotlib()
    from matplotlib.lines import Line2D
    from matplotlib.collections import PolyCollection

    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(6, 6))
    sq, sk = mask.total_seqlen_q, mask.total_seqlen_k
    coverage, bq, bk = block_coverage(mask, max_cells)
    if coverage.size:
        # vmax 2: a fully visible block is mid grey, so the coloured outlines stay readable.
        ax.imshow(coverage, cmap="Greys", vmin=0.0, vmax=2.0, interpolation="nearest",
                  extent=(0, coverage.shape[1] * bk, coverage.shape[0] * bq, 0), aspect="auto")
    by_type: dict[int, list] = {}
    if outlines:  # one PolyCollection per type: fast for masks with thousands of slices
        for qs, qe, ks, ke, kind in mask.slices():
            poly = slice_outline(qs, qe, ks, ke, int(kind))
            if poly:
                by_type.setdefault(int(kind), []).append(poly)
    for kind, polys in sorted(by_type.items()):
        ax.add_collection(PolyCollection(polys, closed=True, facecolors="none", linewidths=0.8,
                                         edgecolors=_TYPE_COLORS[kind], label=_TYPE_NAMES[kind]))
    if by_type:
        ax.legend(handles=[Line2D([], [], color=_TYPE_COLORS[t], label=_TYPE_NAMES[t])
                           for t in sorted(by_type)], loc="upper right", fontsize="small")
    ax.set_xlim(0, max(sk, 1))
    ax.set_ylim(max(sq, 1), 0)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title is None:
        title = (f"{len(mask)} slices, {sq} x {sk}, area {mask.area()} "
                 f"(sparsity {mask.sparsity():.3f})")
    ax.set_title(title, fontsize="medium")
    return ax


def save_mask_png(mask: Mask, path: str, max_cells: int = 512, title: Optional[str] = None,
                  dpi: int = 120) -> None:
    """Render ``mask`` to a PNG without touching pyplot's global state (Agg canvas)."""
    _matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    plot_mask(mask, ax=ax, max_cells=max_cells, title=title)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)


def plan_owner_images(plan, max_cells: int = 256) -> tuple[np.ndarray, np.ndarray, int]:
    """``(rank [g, g], stage [g, g], block)``: which rank and stage compute each block of the
    global score matrix (-1 where nothing is visible; a block shared by several owners shows the
    last one drawn). A block is marked when any of its cells is visible."""
    from .plan import load_plan, plan_cells

    plan = load_plan(plan)
    total = plan["dispatch"]["total_seqlen"]
    block = max(1, math.ceil(total / max_cells))
    g = max(1, math.ceil(total / block))
    rank_img = np.full((g, g), -1, np.int32)
    stage_img = np.full((g, g), -1, np.int32)
    for rank, stage, qs, qe, ks, ke, kind in plan_cells(plan):
        lo = ks - qs if kind & 2 else -(1 << 60)
        hi = ke - qe if kind & 1 else 1 << 60
        for bi in range(qs // block, (qe - 1) // block + 1):
            r0, r1 = max(qs, bi * block), min(qe, (bi + 1) * block)  # rows of this block row
            k0, k1 = max(ks, r0 + lo), min(ke, r1 - 1 + hi + 1)  # union of their visible keys
            if k1 <= k0:
                continue
            cols = slice(k0 // block, (k1 - 1) // block + 1)
            rank_img[bi, cols] = rank
            stage_img[bi, cols] = stage
    return rank_img, stage_img, block


def plot_plan(plan, mask: Optional[Mask] = None, max_cells: int = 256, path: Optional[str] = None):
    """Three panels: the mask coloured by owning rank, by stage (0 = host), and the rank x rank
    K/V bytes matrix. ``plan`` is a dict from ``magiattn.make_plan`` or a path to the JSON that
    ``magiattn plan --json`` writes. Returns the figure; saves it when ``path`` is given."""
    _matplotlib()
    import matplotlib.pyplot as plt

    from .plan import load_plan, plan_bytes_matrix

    plan = load_plan(plan)
    rank_img, stage_img, block = plan_owner_images(plan, max_cells)
    cp = plan["dispatch"]["cp"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    panels = ((rank_img, f"owning rank (cp {cp})", "tab20" if cp <= 20 else "viridis"),
              (stage_img, "stage (0 = host)", "viridis"))
    for ax, (img, title, cmap) in zip(axes[:2], panels):
        shown = np.ma.masked_less(img, 0)
        im = ax.imshow(shown, cmap=cmap, interpolation="nearest", origin="upper")
        ax.set_title(f"{title}, one pixel = {block} tokens")
        ax.set_xlabel("k")
        ax.set_ylabel("q")
        fig.colorbar(im, ax=ax, fraction=0.046)
    traffic = plan_bytes_matrix(plan) / 2**20
    im = axes[2].imshow(traffic, cmap="magma", interpolation="nearest")
    axes[2].set_title(f"K/V MiB sent (row) -> received (column), total {traffic.sum():.1f}")
    axes[2].set_xlabel("receiving rank")
    axes[2].set_ylabel("sending rank")
    fig.colorbar(im, ax=axes[2], fraction=0.046)
    if mask is not None:
        fig.suptitle(repr(mask))
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig
