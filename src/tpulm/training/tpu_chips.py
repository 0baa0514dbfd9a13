"""Cloud TPU chips and topologies: published figures per chip, and ``v5litepod-8``-style names.

Nothing here imports JAX: ``tpulm plan`` parses the topology (and says what is wrong with it)
before it starts the compiler.

Chip figures are Google's published per-chip numbers (Cloud TPU documentation: the v4, v5e,
v5p and v6e pages under https://cloud.google.com/tpu/docs, linked from "System architecture"):
dense bfloat16 peak, HBM capacity and HBM bandwidth.
Prices are the on-demand USD per chip-hour listed on https://cloud.google.com/tpu/pricing in
2025 (US regions); they change and differ by region, so ``--price-per-chip-hour`` overrides them.
"""

from __future__ import annotations

import dataclasses
import re

from tpulm.errors import TpulmError


@dataclasses.dataclass(frozen=True)
class Chip:
    """Published figures of one TPU chip.

    Attributes:
        name: the generation as Cloud TPU names it (``v5e``).
        bf16_tflops: dense bfloat16 peak, TFLOP/s.
        hbm_gib: HBM per chip, GiB.
        hbm_gbps: HBM bandwidth, GB/s.
        price_per_chip_hour: on-demand USD per chip-hour (see the module docstring).
        jax_name: the generation in ``get_topology_desc`` topology names (``v5e:2x2``).
        megacore: two TensorCores act as one device (v4, v5p): the type names count cores.
    """

    name: str
    bf16_tflops: float
    hbm_gib: float
    hbm_gbps: float
    price_per_chip_hour: float
    jax_name: str
    megacore: bool


CHIPS = {
    "v4": Chip("v4", 275.0, 32.0, 1228.0, 3.22, "v4", True),
    "v5e": Chip("v5e", 197.0, 16.0, 819.0, 1.20, "v5e", False),
    "v5p": Chip("v5p", 459.0, 95.0, 2765.0, 4.20, "v5p", True),
    "v6e": Chip("v6e", 918.0, 32.0, 1640.0, 2.70, "v6e", False),
}
# Accelerator-type prefixes of the Cloud TPU names (``gcloud ... --accelerator-type``).
_PREFIXES = {"v4": "v4", "v5litepod": "v5e", "v5e": "v5e", "v5p": "v5p", "v6e": "v6e"}
_NAME = re.compile(r"^(?:(\d+)x)?(v4|v5litepod|v5e|v5p|v6e)-(\d+)$")


@dataclasses.dataclass(frozen=True)
class Topology:
    """A Cloud TPU slice (or several, for multislice) in the terms of JAX's topology API.

    Attributes:
        name: the name given (``v5litepod-8``, ``2xv5p-16`` for two slices).
        chip: the chip's figures.
        shape: chips along each axis of one slice (2 axes for v5e/v6e, 3 for v4/v5p).
        slices: slices joined over the data-center network (multislice).
        chips_per_host: chips along each axis of one host of the slice.
    """

    name: str
    chip: Chip
    shape: tuple[int, ...]
    slices: int
    chips_per_host: tuple[int, int, int]

    @property
    def chips(self) -> int:
        """Chips in all slices together (= JAX devices, megacore counting a chip once)."""
        n = self.slices
        for size in self.shape:
            n *= size
        return n

    @property
    def jax_topology(self) -> str:
        """The ``topology_name`` of ``get_topology_desc``, e.g. ``v5e:2x4`` or ``v4:2x2x1``."""
        return f"{self.chip.jax_name}:{'x'.join(map(str, self.shape))}"

    @property
    def chip_config(self) -> str:
        """The ``chip_config_name``: ``megacore`` where two cores form one device."""
        return "megacore" if self.chip.megacore else "default"


def _cube(chips: int) -> tuple[int, int, int]:
    """v4/v5p slice shape: from 2x2x1, double the smallest axis (the last among equals).

    That reproduces Google's table: 2x2x1 (4 chips), 2x2x2, 2x2x4, 2x4x4, 4x4x4, 4x4x8, ...
    """
    shape = [2, 2, 1]
    while shape[0] * shape[1] * shape[2] < chips:
        smallest = min(shape)
        axis = max(i for i, size in enumerate(shape) if size == smallest)
        shape[axis] *= 2
    return shape[0], shape[1], shape[2]


def _square(chips: int) -> tuple[int, int]:
    """v5e/v6e slice shape: 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16."""
    if chips == 1:
        return 1, 1
    rows = 2
    while rows * rows * 4 <= chips:
        rows *= 2
    return rows, chips // rows


def parse_topology(name: str) -> Topology:
    """The topology of a Cloud TPU type name.

    ``v4-N`` and ``v5p-N`` count TensorCores (2 per chip): ``v4-8`` is 4 chips, 2x2x1.
    ``v5litepod-N`` and ``v6e-N`` count chips: ``v5litepod-8`` is 2x4. A ``Kx`` prefix asks for
    K such slices (multislice): ``2xv5p-8``.

    Args:
        name: the accelerator type, as ``gcloud compute tpus tpu-vm create --accelerator-type``.

    Raises:
        TpulmError: an unknown generation or a size Cloud TPU does not offer.
    """
    match = _NAME.match(name.strip().lower())
    if not match:
        raise TpulmError(
            f"--topology {name!r}: expected a Cloud TPU type such as v4-8, v5litepod-8, v5p-8 "
            "or v6e-8 (a 2x prefix for two slices: 2xv5p-8)"
        )
    slices = int(match.group(1) or 1)
    chip = CHIPS[_PREFIXES[match.group(2)]]
    count = int(match.group(3))
    chips = count // 2 if chip.megacore else count
    valid = _valid_sizes(chip)
    if chips not in valid or (chip.megacore and count % 2) or slices < 1:
        sizes = ", ".join(str(c * 2 if chip.megacore else c) for c in valid[:6])
        raise TpulmError(
            f"--topology {name!r}: {match.group(2)} slices come in sizes {sizes}, ... "
            f"({'TensorCores, 2 per chip' if chip.megacore else 'chips'})"
        )
    if chip.megacore:
        shape: tuple[int, ...] = _cube(chips)
        per_host = (2, 2, 1)
    else:
        shape = _square(chips)
        # v5e/v6e hosts hold 8 chips on single-host slices (-8), else 4 (multi-host) or fewer.
        per_host = (shape[0], shape[1], 1) if chips <= 8 else (2, 2, 1)
    return Topology(name, chip, shape, slices, per_host)


def _valid_sizes(chip: Chip) -> list[int]:
    """Chip counts of one slice: v4/v5p 4 to 4096 (powers of two), v5e/v6e 1, 4 to 256."""
    if chip.megacore:
        return [4 * 2**k for k in range(11)]
    return [1] + [4 * 2**k for k in range(7)]
