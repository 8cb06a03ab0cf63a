"""The HBM table against XLA's own figures: what one TPU device can use, as XLA's out-of-memory messages print it
("Used X of Y hbm"; Y in GiB), for every generation tpulaunch knows."""

import pytest

from tpulaunch.tpu.types import GENERATIONS, GiB, parse_tpu_type

# The "of Y hbm" each generation's XLA prints (tpu/types.py says where each was printed).
XLA_USABLE_GIB = {"v2": 8.00, "v3": 15.48, "v4": 30.75, "v5e": 15.75, "v5p": 95.74, "v6e": 31.25}


def test_every_generation_has_xla_figure():
    assert set(GENERATIONS) == set(XLA_USABLE_GIB)


@pytest.mark.parametrize("name", sorted(XLA_USABLE_GIB))
def test_usable_hbm_is_xlas_figure(name):
    generation = GENERATIONS[name]
    # XLA prints two decimals: the table's bytes read back as the same figure.
    assert f"{generation.usable_bytes_per_device / GiB:.2f}" == f"{XLA_USABLE_GIB[name]:.2f}"


@pytest.mark.parametrize("name", sorted(XLA_USABLE_GIB))
def test_usable_hbm_fits_in_the_chip(name):
    generation = GENERATIONS[name]
    per_device = generation.hbm_per_chip_bytes // generation.devices_per_chip
    assert generation.usable_bytes_per_device <= per_device
    # The runtime keeps a reserve, never more than a couple of GiB.
    assert per_device - generation.usable_bytes_per_device < 2 * GiB


def test_v5p_chip_holds_more_than_95_gib():
    assert GENERATIONS["v5p"].hbm_per_chip_bytes > 95.74 * GiB


@pytest.mark.parametrize("name, gib", [("v5litepod-8", 15.75), ("v6e-8", 31.25), ("v5p-8", 95.74)])
def test_slices_use_their_generations_figure(name, gib):
    assert parse_tpu_type(name).usable_bytes_per_device == int(gib * GiB)
