"""The documentation says true things: the README opens with the two commands, cites only files
that exist in this repository (nothing beside it, such as a spec users do not have), shows the
MagiAttention compatibility table, and the JSON mask of docs/semantics.md loads."""

import json
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
USER_DOCS = ["README.md", "docs/semantics.md", "docs/numerics.md"]


def read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def test_readme_opens_with_the_setup_and_test_commands():
    lines = read("README.md").splitlines()
    assert lines[0].startswith("```"), lines[0]
    commands = lines[1:lines.index("```", 1)]
    assert [c.split("#")[0].strip() for c in commands] == ["bash scripts/setup.sh",
                                                          "bash scripts/test.sh"], commands
    assert os.path.exists(os.path.join(ROOT, ".ci", "run"))
    assert "scripts/test.sh" in read(".ci/run")


@pytest.mark.parametrize("doc", USER_DOCS)
def test_user_docs_cite_nothing_outside_the_repository(doc):
    text = read(doc)
    for outside in ("SPEC", "DESIGN.md", "../shared", "magi_notes", "kernel_anchors",
                    "cp_anchors"):
        assert outside not in text, f"{doc} cites {outside!r}, which users do not have"
    # Every repository path it names exists (scripts, docs, examples, sources, tests).
    paths = set(re.findall(r"`((?:scripts|docs|examples|include|src|python|tests|bench|apps)"
                           r"/[A-Za-z0-9_./-]+\.(?:sh|md|py|h|cc|cuh|cu|json))`", text))
    missing = sorted(p for p in paths if not os.path.exists(os.path.join(ROOT, p)))
    assert not missing, f"{doc} names files that do not exist: {missing}"


def test_readme_has_the_magiattention_compatibility_table():
    text = read("README.md")
    section = text[text.index("## MagiAttention compatibility"):]
    for name in ("flex_flash_attn_func", "index_attn_indices", "sm_margin", "AttnRanges",
                 "AttnMask", "magi_attn_flex_key", "compute_pad_size", "squash_batch_dim",
                 "magi_attn_flex_dispatch", "make_flex_key_for_new_mask_after_dispatch",
                 "roll_simple", "clear_cache", "get_most_recent_key", "DispatchConfig",
                 "OverlapConfig"):
        assert f"`{name}" in section, f"the compatibility table does not list {name}"


def test_semantics_json_example_loads():
    import magiattn

    text = read("docs/semantics.md")
    block = re.search(r"```json\n(.*?)```", text, re.S).group(1)
    mask = magiattn.mask_from_json(block)
    spec = json.loads(block)
    assert mask.total_seqlen_q == spec["total_seqlen_q"] == 4096
    # Two causal documents of 1000 and 3096 tokens.
    assert mask.area() == 1000 * 1001 // 2 + 3096 * 3097 // 2
