"""Plans from Python: the JSON value of the C++ planner mapped back to global cells covers the
mask exactly once, the bytes matrix matches the receive splits, and the plan pictures draw."""

import json

import numpy as np
import pytest

import magiattn


def _random_mask(rng, n):
    cu = np.concatenate([[0], np.sort(rng.choice(np.arange(1, n), 5, replace=False)), [n]])
    return magiattn.varlen_sliding_window(cu, left=int(rng.integers(1, 40)), right=0, num_global=2)


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_plan_cells_cover_the_mask_exactly_once(rng, cp):
    mask = _random_mask(rng, 192)
    plan = magiattn.make_plan(mask, cp, num_stages=2, chunk_size=16)
    count = np.zeros((192, 192), np.int32)
    for _, _, qs, qe, ks, ke, kind in magiattn.plan_cells(plan):
        piece = magiattn.Mask(192, 192, [[qs, qe]], [[ks, ke]], [kind])
        count += piece.to_dense()
    np.testing.assert_array_equal(count, mask.to_dense().astype(np.int32))


def test_bytes_matrix_matches_receives():
    mask = magiattn.varlen_causal(np.array([0, 50, 130, 256]))
    plan = magiattn.make_plan(mask, 4, num_stages=3, chunk_size=16)
    m = magiattn.plan_bytes_matrix(plan)
    assert np.all(np.diag(m) == 0)
    received = sum(sum(st["output_split_sizes"]) for r in plan["ranks"] for st in r["stages"])
    assert m.sum() == pytest.approx(received * plan["cost"]["bytes_per_row"])


def test_config_and_keywords_are_one_definition():
    mask = magiattn.varlen_causal(np.array([0, 50, 130, 256]))
    config = magiattn.DistAttnConfig(num_stages=2, chunk_size=16)
    assert magiattn.make_plan(mask, 4, config) == magiattn.make_plan(mask, 4, num_stages=2,
                                                                     chunk_size=16)
    assert magiattn.make_plan(mask, 4, config, num_stages=1) == magiattn.make_plan(
        mask, 4, num_stages=1, chunk_size=16)  # keywords override the config
    with pytest.raises(TypeError, match="stages"):
        magiattn.make_plan(mask, 4, stages=2)


def test_plan_errors_name_the_culprit():
    with pytest.raises(ValueError, match="algorithm 'greedy'"):
        magiattn.make_plan(magiattn.causal(64, 64), 2, algorithm="greedy")
    with pytest.raises(ValueError):
        magiattn.make_plan(magiattn.causal(64, 64), 0)


def test_plot_plan(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    mask = magiattn.varlen_causal(np.array([0, 300, 700, 1024]))
    plan = magiattn.make_plan(mask, 4, num_stages=2)
    rank_img, stage_img, block = magiattn.viz.plan_owner_images(plan, max_cells=64)
    assert rank_img.shape == (64, 64) and block == 16
    assert set(np.unique(rank_img)) == {-1, 0, 1, 2, 3}
    assert stage_img.max() >= 1  # some cells come from remote stages
    path = tmp_path / "plan.png"
    magiattn.plot_plan(plan, mask=mask, path=str(path))
    assert path.stat().st_size > 10_000


@pytest.mark.parametrize("cp", [1, 3])
def test_the_runtime_module_plans_as_the_planner_api(rng, cp):
    # The key's plan is made in magiattn._dist as a C++ value (no JSON between the modules);
    # it is the plan that magiattn.make_plan returns for the same mask and config.
    dist = pytest.importorskip("magiattn._dist", reason="magiattn built without MPI")
    mask = _random_mask(rng, 192)
    plan = dist.make_plan(192, 192, mask.q_ranges(), mask.k_ranges(), mask.attn_type_map(), cp,
                          2, 16, "minheap", False)
    assert plan.cp == cp and plan.total_seqlen == 192
    assert json.loads(plan.to_json()) == magiattn.make_plan(mask, cp, num_stages=2, chunk_size=16,
                                                           algorithm="minheap")
    with pytest.raises(ValueError, match="algorithm 'fast' is not"):
        dist.make_plan(192, 192, mask.q_ranges(), mask.k_ranges(), mask.attn_type_map(), cp, 2,
                       16, "fast", False)
    with pytest.raises(ValueError, match="q_ranges has 1 entries but k_ranges has 2"):
        dist.make_plan(192, 192, [[0, 192]], [[0, 96], [96, 192]], [0], cp, 0, 0, "refined",
                       False)
