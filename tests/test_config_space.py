"""Compile-time config spaces: the plain template's "max" space for exhaustive effort levels."""

import pytest

from gemmtune.templates.triton.base import SPACE_SIZES
from gemmtune.templates.triton.mm import TritonMMTemplate, config_space, fit_configs
from gemmtune.templates.triton import splitk as triton_splitk, tma as triton_tma


def test_plain_default_unchanged_and_max_is_a_larger_superset():
    default, big = config_space(), config_space("max")
    assert len(default) == 150 and TritonMMTemplate().space == default
    assert len(big) >= 100 and len(big) > len(default)
    assert all(c in big for c in default)
    assert len({tuple(sorted(c.items())) for c in big}) == len(big)  # no duplicates
    assert TritonMMTemplate(size="max").space == big


def test_max_space_additions_stay_within_hardware_limits():
    default = config_space()
    for c in (c for c in config_space("max") if c not in default):  # fit_configs prunes the rest per problem
        assert c["BLOCK_M"] * c["BLOCK_N"] // (32 * c["num_warps"]) <= 128
        assert c["num_stages"] * (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] * 2 <= 232_448


@pytest.mark.parametrize("space", [config_space, triton_splitk.config_space, triton_tma.config_space])
def test_every_triton_template_has_100_configs_before_pruning_in_max(space):
    # The requirement: >= 100 compile-time configs x 4 swizzles per Triton template.
    assert len(space("max")) >= 100
    for size in SPACE_SIZES:
        assert space(size)
    with pytest.raises(ValueError, match="unknown size"):
        space("everything")


def test_max_space_fitted_to_a_large_problem_keeps_100_configs():
    assert len(fit_configs(config_space("max"), 4096, 4096, 4096, 2, 232_448)) >= 100


def test_effort_max_uses_the_max_space():
    import gemmtune
    from gemmtune.templates import default_templates

    assert gemmtune.Settings().with_(effort="max").config_space == "max"
    plain = next(t for t in default_templates(size="max") if t.uid == "triton_mm")
    assert len(plain.space) >= 100 and len(plain.space) > len(next(
        t for t in default_templates() if t.uid == "triton_mm").space)
