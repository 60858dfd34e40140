"""bench/det_order_model.py, the model behind the deterministic backward's walk order: its
tiles match the mask, and it shows the effect the order was chosen for."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import det_order_model as model  # noqa: E402

from magiattn import masks  # noqa: E402


def test_key_tiles_cover_the_rows_that_see_them():
    # Causal 512: key tile t (128 keys) is seen by rows 128 t .. 512, heaviest first.
    tiles = model.key_tiles(masks.causal(512, 512))
    assert tiles == [[(0, 512)], [(128, 512)], [(256, 512)], [(384, 512)]]
    # Two documents: each tile sees only its own document's rows.
    tiles = model.key_tiles(masks.varlen_causal([0, 100, 300]))
    assert sorted(map(tuple, tiles)) == [((0, 100), (100, 300)), ((128, 300),), ((256, 300),)]


def test_descending_walk_removes_the_causal_wait():
    tiles = model.key_tiles(masks.causal(4096, 4096))
    run = lambda walk, det: model.simulate(tiles, walk, 2, 2, 16, 2, det)  # noqa: E731
    assert run("asc", True) > 1.3 * run("asc", False)
    assert run("desc", True) == run("desc", False) == run("asc", False)
