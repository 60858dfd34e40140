"""magiattn.viz with the Agg backend: block coverage against the dense mask (both the exact
and the tile-class path), slice outlines, and PNG output. Skipped without matplotlib."""

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

import magiattn  # noqa: E402
from magiattn import viz  # noqa: E402


def test_block_coverage_exact_and_tiles(monkeypatch):
    mask = magiattn.varlen_causal(np.array([0, 300, 700, 1000]))
    dense = mask.to_dense().astype(float)
    cov, bq, bk = viz.block_coverage(mask, max_cells=128)
    assert (bq, bk) == (8, 8) and cov.shape == (125, 125)
    np.testing.assert_allclose(cov[3, 2], dense[24:32, 16:24].mean())
    np.testing.assert_allclose(cov.sum() * 64, dense.sum())
    cov1, _, _ = viz.block_coverage(magiattn.causal(10, 7), max_cells=512)
    assert np.array_equal(cov1, magiattn.causal(10, 7).to_dense())
    monkeypatch.setattr(viz, "_DENSE_LIMIT", 0)  # force the classify_tiles path
    tiles, _, _ = viz.block_coverage(mask, max_cells=128)
    assert set(np.unique(tiles)) <= {0.0, 0.5, 1.0}
    assert np.array_equal(tiles == 0, cov == 0) and np.array_equal(tiles == 1, cov == 1)


def test_slice_outline_areas():
    def area(poly):
        x, y = np.array(poly).T
        return 0.5 * abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1)))

    assert area(viz.slice_outline(0, 4, 0, 6, 0)) == 24
    for sq, sk, kind in ((40, 60, 1), (60, 40, 1), (50, 50, 2), (30, 50, 3)):
        cells = magiattn.Mask(sq, sk, [[0, sq]], [[0, sk]], [kind]).area()
        # The outline follows the staircase's midline: off by at most half a cell per row.
        assert abs(area(viz.slice_outline(0, sq, 0, sk, kind)) - cells) <= max(sq, sk) / 2 + 1
    assert viz.slice_outline(0, 10, 0, 4, 3) == []  # sq > sk bi-causal: empty


def test_plot_mask_draws_outlines_and_title():
    mask = magiattn.varlen_sliding_window(np.array([0, 40, 100]), None, 8, 0, 2)
    fig = Figure()
    ax = fig.add_subplot()
    assert viz.plot_mask(mask, ax=ax) is ax
    drawn = sum(len(c.get_paths()) for c in ax.collections)
    assert drawn == sum(1 for s in mask.slices() if viz.slice_outline(*s)) > 0
    assert "slices" in ax.get_title() and ax.get_xlim() == (0, 100)
    ax2 = magiattn.plot_mask(mask, title="custom", outlines=False)
    assert ax2.get_title() == "custom" and len(ax2.collections) == 0
    import matplotlib.pyplot as plt

    plt.close(ax2.figure)


def test_save_mask_png(tmp_path):
    path = tmp_path / "mask.png"
    magiattn.save_mask_png(magiattn.build_family("block-sparse", 4096, seed=1), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    none = np.zeros((0, 2), int)
    magiattn.save_mask_png(magiattn.Mask(0, 0, none, none, None), str(tmp_path / "empty.png"))
