"""An analytic cost model for the `triton_mm` template: rank configs before timing anything.

`estimate_ms(config, M, N, K)` is a roofline over one kernel launch:

- compute: the busiest SM runs `ceil(tiles / SMs)` tiles (wave quantization over SMs), each over
  the padded problem (`ceil(M/BM)*BM`, same for N and K: padding waste), at the per-SM tensor-core
  rate, slowed when the tile is too small to feed the tensor cores from shared memory (a BM x BN
  tile does BM*BN/(BM+BN) flops per shared-memory byte; Hopper needs ~32 at full rate);
- memory: the larger of (a) the unique bytes (A, B, C once) over DRAM bandwidth and (b) operand
  re-reads, `M*N*K*bytes*(1/BN + 1/BM)` (small tiles re-read A and B more), over L2 bandwidth,
  and (c) Little's law on the busiest SM: each resident block keeps `stages - 1` K-steps of
  loads in flight, one load latency each, so shallow pipelines, small BK and few blocks starve;
- per wave of `SMs * occupancy` blocks, one memory latency of pipeline fill; stages < 3 cost 30%;
  threads holding fewer than 8 accumulator elements (a small tile on many warps) are mostly loop
  overhead: time x (1 + 0.25 * (8 / elements - 1));
- occupancy (blocks per SM) from shared memory `stages*(BM+BN)*BK*bytes`, registers (fp32
  accumulator + a fixed overhead per thread) and warps; a config that does not fit returns inf.

Absolute numbers are rough; the model is meant for ranking (stage 0 of `model_pruned`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class Hardware:
    """What the model knows about a GPU: numbers measured on an H200 where marked (docs/ARCHITECTURE.md),
    else assumed."""

    name: str
    sms: int = 132
    peak_tflops: float = 790.0  # dense bf16, measured on an H200 (datasheet: 989)
    dram_tbs: float = 4.3  # copy bandwidth, measured on an H200
    l2_tbs: float = 8.6  # assumed, not measured: ~2x the copy bandwidth
    load_latency_us: float = 1.2  # global-load latency under load; assumed
    launch_us: float = 2.0  # fixed cost of one launch
    smem_per_sm: int = 228 * 1024
    smem_per_block: int = 232_448  # opt-in maximum per block
    smem_reserved: int = 1024  # per block, taken by the runtime
    regs_per_sm: int = 65_536
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    smem_flops_per_byte: float = 32.0  # tile intensity needed to run the tensor cores at full rate

    def scaled(self, **changes: Any) -> "Hardware":
        """A copy with some fields changed, e.g. `H200.scaled(peak_tflops=700)`."""
        return Hardware(**{**self.__dict__, **changes})


H200 = Hardware("H200 SXM")
H100 = H200.scaled(name="H100 SXM", dram_tbs=3.0, l2_tbs=8.6)  # same SMs; HBM3 3.35 TB/s datasheet -> ~3.0 copy
_MIN_ACC = 8  # accumulator elements per thread below which warps idle
_EXTRA_REGS = 40  # per thread beyond the accumulator: addresses, loop state, operand fragments


def occupancy(config: Mapping[str, int], dtype_bytes: int = 2, hw: Hardware = H200) -> int:
    """Blocks of `config` resident on one SM (0: the config does not fit).

    Example:
        >>> occupancy(dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=4, num_warps=8))
        1
        >>> occupancy(dict(BLOCK_M=256, BLOCK_N=256, BLOCK_K=128, num_stages=5, num_warps=8))
        0
    """
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    stages, warps = config.get("num_stages", 3), config.get("num_warps", 4)
    smem = stages * (bm + bn) * bk * dtype_bytes
    regs = bm * bn // (32 * warps) + _EXTRA_REGS
    if smem > hw.smem_per_block or regs > 255:
        return 0
    regs = -(-regs // 8) * 8  # allocation granularity
    return max(0, min(hw.smem_per_sm // (smem + hw.smem_reserved), hw.regs_per_sm // (regs * 32 * warps),
                      hw.max_warps_per_sm // warps, hw.max_blocks_per_sm))


def estimate_ms(config: Mapping[str, int], M: int, N: int, K: int, dtype_bytes: int = 2, batch: int = 1,
                hw: Hardware = H200) -> float:
    """Estimated milliseconds of one `C[M,N] = A[M,K] @ B[K,N]` with a Triton template config.

    Example:
        >>> cfg = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=4, num_warps=8)
        >>> 1.3 < estimate_ms(cfg, 8192, 8192, 8192) < 2.5
        True
        >>> estimate_ms(dict(cfg, BLOCK_K=128, num_stages=5), 8192, 8192, 8192)
        inf
    """
    if int(config.get("SPLIT_K", 1)) > 1:
        return split_k_ms(config, M, N, K, dtype_bytes, batch, hw)
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    stages = config.get("num_stages", 3)
    occ = occupancy(config, dtype_bytes, hw)
    if occ == 0:
        return math.inf
    tm, tn = -(-M // bm), -(-N // bn)
    tiles = tm * tn * batch
    kp = -(-K // bk) * bk

    # Compute: the busiest SM's tiles at the SM's tensor-core rate, limited by shared-memory feed.
    intensity = bm * bn / (bm + bn)  # flops per byte of A/B tile read from shared memory (bf16)
    feed = min(1.0, intensity * 2 / dtype_bytes / hw.smem_flops_per_byte)
    sm_flops = hw.peak_tflops * 1e12 / hw.sms * feed
    compute_s = math.ceil(tiles / hw.sms) * 2.0 * bm * bn * kp / sm_flops

    # Memory: unique bytes from DRAM; tile re-reads from L2; and what the resident blocks keep in flight.
    unique = batch * (M * K + K * N + M * N) * dtype_bytes
    rereads = batch * tm * bm * tn * bn * kp * dtype_bytes * (1.0 / bn + 1.0 / bm)
    # Little's law on the busiest SM: its blocks keep (stages - 1) K-steps of loads in flight each.
    per_sm = math.ceil(tiles / hw.sms)
    latency_s = hw.load_latency_us * 1e-6
    stream_s = math.ceil(per_sm / min(occ, per_sm)) * (kp // bk) * latency_s / max(1, stages - 1)
    memory_s = max(unique / (hw.dram_tbs * 1e12), rereads / (hw.l2_tbs * 1e12), stream_s)

    waves = math.ceil(tiles / (hw.sms * occ))
    pipeline = 1.3 if stages < 3 else 1.0
    acc = bm * bn / (32 * config.get("num_warps", 4))  # accumulator elements per thread
    thin = 1.0 + 0.25 * max(0.0, _MIN_ACC / acc - 1.0)  # threads with little work are mostly loop overhead
    total_s = hw.launch_us * 1e-6 + waves * latency_s + pipeline * thin * max(compute_s, memory_s)
    return total_s * 1e3


def split_k_ms(config: Mapping[str, int], M: int, N: int, K: int, dtype_bytes: int = 2, batch: int = 1,
               hw: Hardware = H200) -> float:
    """Estimated milliseconds of a two-pass split-K config (`SPLIT_K` slices of K, `triton_splitk`).

    Pass 1 is modelled as `batch * SPLIT_K` independent GEMMs of depth `ceil(K / SPLIT_K)`; pass 2
    reads the fp32 partials and writes the output once, at DRAM bandwidth, plus a second launch.

    Example:
        >>> cfg = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_stages=3, num_warps=4)
        >>> split_k_ms(dict(cfg, SPLIT_K=8), 16, 4096, 14336) < estimate_ms(cfg, 16, 4096, 14336)
        True
        >>> split_k_ms(dict(cfg, SPLIT_K=8), 4096, 4096, 4096) > estimate_ms(cfg, 4096, 4096, 4096)
        True
    """
    split = int(config.get("SPLIT_K", 1))
    base = {k: v for k, v in config.items() if k != "SPLIT_K"}
    first = estimate_ms(base, M, N, -(-K // split), dtype_bytes, batch * split, hw)
    reduce_bytes = batch * M * N * (split * 4 + dtype_bytes)
    return first + (hw.launch_us * 1e-6 + reduce_bytes / (hw.dram_tbs * 1e12)) * 1e3


def hardware_for(device_name: str) -> Hardware:
    """The model's Hardware for a device name (`torch.cuda.get_device_name()`): H100 or H200.

    Example:
        >>> hardware_for("NVIDIA H100 80GB HBM3").name, hardware_for("NVIDIA H200").name
        ('H100 SXM', 'H200 SXM')
    """
    return H100 if "H100" in device_name.upper() else H200


def rank_configs(configs: list[Mapping[str, int]], M: int, N: int, K: int, dtype_bytes: int = 2,
                 batch: int = 1, hw: Hardware = H200) -> list[tuple[float, Mapping[str, int]]]:
    """(estimated ms, config), fastest first.

    Example:
        >>> small = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, num_stages=3, num_warps=4)
        >>> big = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=4, num_warps=8)
        >>> rank_configs([small, big], 4096, 4096, 4096)[0][1] is big
        True
    """
    return sorted(((estimate_ms(c, M, N, K, dtype_bytes, batch, hw), c) for c in configs), key=lambda t: t[0])
