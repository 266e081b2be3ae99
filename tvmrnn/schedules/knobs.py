"""The knobs of each schedule template: the parameters that tuning searches (as MetaSchedule
sampling decisions, :mod:`tvmrnn.tune.spaces`), their candidate values for a kernel on a device,
and their defaults.

A template is one of the schedules :func:`tvmrnn.schedules.apply` gives a kernel (its *family*):
the CPU register-blocked GEMM, the GPU split-K step, its persistent form, row tiles (persistent
or not: one family), the tiled SIMT GEMM, its TF32 tensor-core form,
the column sum, and the pointwise rule on either target. Every knob is a keyword argument of that
template (``tiles``); :func:`tiles_of` turns a knob setting into them. The default schedule is the
setting where every knob takes its default, and each listed variant
(:func:`tvmrnn.schedules.variants`) is a setting too (:func:`values_of`): the search starts from
them and mutates them like any other point of the space.

Candidates are filtered by the device model (:mod:`tvmrnn.device`): threads per block at most
1024, shared memory per block at most what the GPU gives, register tiles within the CPU's vector
registers.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir
from ..device import device_model
from ..kernels import Kernel

from .bf16 import is_bf16_gemm, is_bf16_step, is_state_rounding, supports_amx
from .common import GPU_THREADS, _gemm_axes, _gpu_kind, is_gpu, uses_tf32, vector_lanes
from .cpu import guarded_gemm, is_transposition
from .cuda import (GPU_MATMUL, GPU_MATMUL_SHAPES, GPU_SMS, TF32_SHAPES, matmul_defaults, matmul_extents, matmul_shape,
                   slice_variants, tf32_default)
from .split_k import PERSISTENT_TILES, persistent_blocks
from .variants import variants

KNOB = "tvmrnn.knob."  # the root block's annotations that carry a candidate's knob values
# Knobs added after records were made whose AUTO is not the schedule of those records: the value
# that reproduces it (guarded_vectors, v79: AUTO widens what one vector tiled before)
VALUES_BEFORE = {"guarded_vectors": 1}

AUTO = -1  # a knob's value meaning "the template derives it from the kernel's sizes"

MAX_THREADS = 1024  # threads per block on every CUDA GPU since sm_20


@dataclass(frozen=True)
class Knob:
    name: str
    values: tuple[int, ...]  # candidates; AUTO where the template's own rule is one of them
    default: int

    def __post_init__(self):
        if self.default not in self.values:
            raise ValueError(f"knob {self.name}: default {self.default} is not among {self.values}")


def family(kernel: Kernel, target: tvm.target.Target) -> str:
    """Which template :func:`tvmrnn.schedules.apply` gives ``kernel`` on ``target``."""
    if kernel.gemm is not None and not is_gpu(target):
        sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))
        return "cpu_step_bf16" if is_bf16_step(sch) else "cpu_gemm_bf16" if is_bf16_gemm(sch) else "cpu_gemm"
    if not is_gpu(target):
        if is_state_rounding(s_tir.Schedule(s_tir.renew_defs(kernel.func))):
            return "cpu_round_bf16"
        return "cpu_transpose" if is_transposition(kernel, target) else "cpu_pointwise"
    if kernel.gemm is not None:
        kind = _gpu_kind(s_tir.Schedule(s_tir.renew_defs(kernel.func)), kernel)
        if persistent_blocks(kernel.func) and kind == "split-K":
            return "persistent"
        if kind == "matmul" and uses_tf32(kernel.func):
            return "matmul_tf32"
        if kind is not None:
            return {"column sum": "column_sum", "split-K": "split_k", "row tiles": "row_tiles", "matmul": "matmul"}[kind]
    return "gpu_pointwise"


def _cpu_gemm_tiles_outputs(kernel: Kernel) -> bool:
    """Whether :func:`tvmrnn.schedules.cpu_gemm` tiles this GEMM from its outputs (a fused step's
    gate math: ``row_block`` and ``red_block`` do not apply)."""
    sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))
    gemm = sch.get_sblock(kernel.gemm)
    epilogues = sch.get_consumers(gemm)
    spatial, _ = _gemm_axes(sch, gemm)
    return bool(epilogues) and (len(sch.get_loops(epilogues[0])) < len(spatial) or len(epilogues) > 1)


def knobs(kernel: Kernel, target: tvm.target.Target) -> tuple[Knob, ...]:
    """The knobs of ``kernel``'s template on ``target``, each with the candidates this device allows."""
    kind = family(kernel, target)
    model = device_model(target)
    if kind == "cpu_gemm":
        lanes = vector_lanes(target)
        registers = 16 if lanes == 8 else 32  # AVX2's ymm, AVX-512's zmm
        accumulators = tuple(a for a in (6, 8, 12, 16, 24, 32) if a <= registers - 4 or a == 12)
        # (an AVX-512 backward step with column_vectors AUTO takes accumulators as a cap: cpu.step_tile)
        found = (Knob("accumulators", accumulators, 12 if lanes == 8 else 24),
                 Knob("column_vectors", (AUTO, 1, 2, 4), AUTO))
        if not _cpu_gemm_tiles_outputs(kernel):
            found += (Knob("row_block", (AUTO, 1, 2, 4, 8, 16), AUTO),
                      Knob("red_block", (AUTO, 16, 32, 64, 128, 256), AUTO))
            if guarded_gemm(kernel, target):  # AUTO: cpu.guarded_tile_units' rule (v79: 2 on AVX-512)
                found += (Knob("guarded_vectors", (AUTO, 1, 2, 3, 4), AUTO),)
        return found
    if kind == "cpu_step_bf16":  # amx: the AMX microkernel (where the target has it) or vdpbf16ps
        amx = (Knob("amx", (0, 1), 1),) if supports_amx(target) else ()
        return (Knob("accumulators", (8, 12, 16, 24, 28), 24), *amx)
    if kind == "cpu_gemm_bf16":  # amx: as the step's; panel_blocks (AMX): AUTO about one a core
        amx = (Knob("amx", (0, 1), 1), Knob("panel_blocks", (AUTO, 1, 2, 4, 8), AUTO)) if supports_amx(target) else ()
        return (Knob("accumulators", (8, 12, 16, 24, 28), 24), Knob("tasks_per_core", (1, 2, 4, 8), 2), *amx)
    if kind == "cpu_pointwise":
        return (Knob("tasks_per_core", (1, 2, 4, 8), 4),)
    if kind == "cpu_round_bf16":  # (bf16.cpu_round_state: rows a task)
        return (Knob("tasks_per_core", (1, 2, 4), 1),)
    if kind == "cpu_transpose":  # transpose 0: the pointwise rule (tasks_per_core) instead of tiles
        return (Knob("transpose", (0, 1), 1), Knob("row_tile", (8, 16, 32, 64), 32),
                Knob("column_tile", (16, 32, 64), 16), Knob("tasks_per_core", (1, 2, 4, 8), 4))
    if kind == "gpu_pointwise":
        return (Knob("threads", (32, 64, 128, 256, 512, MAX_THREADS), GPU_THREADS),)
    if kind == "column_sum":
        # AUTO: cuda.column_sum_tile (columns that give half the SMs a block, 256 threads)
        return (Knob("columns", (AUTO, 8, 16, 32, 64), AUTO), Knob("slices", (AUTO, 4, 8, 16, 32), AUTO),
                Knob("unroll", (1, 4, 8), 8))
    if kind == "split_k":
        # thread_columns AUTO: 8 for a step's GEMM of 2048+ units, else 4 (split_k.default_thread_columns)
        return (Knob("threads", (64, 128, 256, 512), 256), Knob("thread_columns", (AUTO, 1, 2, 4, 8), AUTO),
                Knob("min_blocks", (100, 200, 400), 200), Knob("block_slices", (AUTO, 1, 2, 4, 8, 16), AUTO),
                Knob("unroll", (1, 4, 8, 16), 8), Knob("accumulators", (24, 48, 96), 96))
    if kind == "row_tiles":  # AUTO: the rule of default_row_tiles() (a register tile, blocks that fill the GPU)
        found = (Knob("thread_rows", (AUTO, 1, 2, 4, 8), AUTO), Knob("thread_units", (AUTO, 1, 2, 4), AUTO),
                 Knob("row_threads", (AUTO, 1, 2, 4, 8, 16), AUTO), Knob("unit_threads", (AUTO, 8, 16, 32, 64), AUTO),
                 Knob("k_tile", (8, 16, 32), 16), Knob("unroll", (1, 2, 4, 8), 4), Knob("stage", (0, 1), 1),
                 Knob("prefetch", (0, 1), 1))
        if persistent_blocks(kernel.func):  # how a block stages its rows: AUTO whole where they fit, else
            # the largest chunk that fits (row_tiles.persistent_row_tiles); a value: chunks of that many columns
            found += (Knob("row_chunk", (AUTO, 64, 128, 256, 512), AUTO),)
            # a thread a gate column, each thread's weights in registers: AUTO the measured default
            # (row_tiles.gpu_row_tiles), a value: that form or not
            found += (Knob("gate_threads", (AUTO, 0, 1), AUTO), Knob("register_weights", (AUTO, 0, 1), AUTO))
        return found
    if kind == "persistent":
        shared = tuple(b for b in (48 * 1024, 96 * 1024, 160 * 1024) if b <= model.shared_bytes_per_block)
        return (Knob("threads", (256, 512, MAX_THREADS), PERSISTENT_TILES["threads"]),
                Knob("accumulators", (24, 32, 48, 64, 96), PERSISTENT_TILES["accumulators"]),
                Knob("thread_columns", (1, 2, 4, 8), PERSISTENT_TILES["thread_columns"]),
                Knob("unroll", (1, 4, 8, 16), 8),
                # vector_k AUTO: 4 for 4-gate units of 128+ rows, else 1 (split_k.gpu_split_k)
                Knob("row_vector", (1, 2, 4), 1), Knob("vector_k", (AUTO, 1, 4), AUTO),
                Knob("stage_epilogue", (0, 1), int(PERSISTENT_TILES["stage_epilogue"])),
                Knob("max_shared_bytes", shared, 48 * 1024),
                # 0: whole where it fits, else the fewest phases (up to 8) whose part of the hidden state fits
                Knob("row_phases", (0, 1, 2, 4, 8, 16), PERSISTENT_TILES["row_phases"]))
    if kind == "matmul_tf32":  # the block tile (an index into TF32_SHAPES), the reduction tile,
        # double buffering, the staging tile's row padding, and the reduction split over blocks
        # (not for a step's GEMM, whose epilogue reads whole sums)
        own = tf32_default(kernel, model.multiprocessors or GPU_SMS)
        found = (Knob("tf32_shape", tuple(range(len(TF32_SHAPES))), TF32_SHAPES.index((own["warps"], own["fragments"]))),
                 Knob("k_tile", tuple(sorted({16, 32, 64, 128, own["k_tile"]})), own["k_tile"]),
                 Knob("pipeline", (0, 1), int(own.get("pipeline", False))),
                 Knob("stage_pad", (0, 4), int(own.get("stage_pad", 0))))
        slices = slice_variants(kernel, tf32=True)
        return found + ((Knob("k_slices", (AUTO, *slices), AUTO),) if slices else ())
    # matmul: the block shape (an index into GPU_MATMUL_SHAPES), the reduction tile, double
    # buffering, and the reduction split over blocks
    default_shape = GPU_MATMUL_SHAPES.index(_default_shape(kernel, target))
    # the shared tiles' stages filled by cp.async (0: none; sm_80 on)
    stages = (0, 2, 3) if model.async_copies else (0,)
    return (Knob("shape", tuple(range(len(GPU_MATMUL_SHAPES))), default_shape),
            Knob("k_tile", (8, 16, 32), GPU_MATMUL["k_tile"]), Knob("pipeline", (0, 1), int(GPU_MATMUL["pipeline"])),
            Knob("async_stages", stages, matmul_defaults(model.async_copies)["async_stages"]),
            Knob("k_slices", (AUTO, *slice_variants(kernel)), AUTO))


def _default_shape(kernel: Kernel, target):
    rows, cols, _ = matmul_extents(kernel)
    return matmul_shape(rows, cols, device_model(target).multiprocessors or GPU_SMS)


def defaults(found: tuple[Knob, ...]) -> dict[str, int]:
    return {k.name: k.default for k in found}


def tiles_of(kernel: Kernel, target: tvm.target.Target, values: dict[str, int]) -> dict:
    """The keyword arguments of :func:`tvmrnn.schedules.apply` for a knob setting."""
    if family(kernel, target) == "matmul_tf32":
        warps, fragments = TF32_SHAPES[values["tf32_shape"]]
        matmul = dict(tf32=dict(warps=warps, fragments=fragments, k_tile=values["k_tile"],
                                pipeline=bool(values["pipeline"]), stage_pad=values.get("stage_pad", 0)))
        if values.get("k_slices", AUTO) != AUTO:
            matmul["k_slices"] = values["k_slices"]
        return {"matmul": matmul}
    if family(kernel, target) == "matmul":
        rows, cols = GPU_MATMUL_SHAPES[values["shape"]]
        matmul = dict(rows=rows, cols=cols, k_tile=values["k_tile"], pipeline=bool(values["pipeline"]),
                      async_stages=values.get("async_stages", 0))
        if values["k_slices"] != AUTO:
            matmul["k_slices"] = values["k_slices"]
        return {"matmul": matmul}
    tiles = {name: value for name, value in values.items() if value != AUTO}
    for flag in ("stage_epilogue", "stage", "gate_threads", "register_weights"):
        if flag in tiles:
            tiles[flag] = bool(tiles[flag])
    return tiles


def values_of(kernel: Kernel, target: tvm.target.Target, tiles: dict) -> dict[str, int] | None:
    """The knob setting of :func:`tvmrnn.schedules.apply`'s ``tiles`` (a listed variant), or None
    where a value is not among the knob's candidates on this device."""
    found = knobs(kernel, target)
    values = defaults(found)
    if family(kernel, target) == "matmul_tf32":
        matmul = dict(tiles.get("matmul", {}))
        tile = dict(matmul.pop("tf32", {}))
        if "warps" in tile or "fragments" in tile:
            shape = TF32_SHAPES[values["tf32_shape"]]
            shape = (tuple(tile.pop("warps", shape[0])), tuple(tile.pop("fragments", shape[1])))
            if shape not in TF32_SHAPES:
                return None
            values["tf32_shape"] = TF32_SHAPES.index(shape)
        tiles = {**tile, **matmul}
    elif family(kernel, target) == "matmul":
        matmul = dict(tiles.get("matmul", {}))
        if "rows" in matmul or "cols" in matmul:
            shape = _default_shape(kernel, target)
            shape = (matmul.pop("rows", shape[0]), matmul.pop("cols", shape[1]))
            if shape not in GPU_MATMUL_SHAPES:
                return None
            values["shape"] = GPU_MATMUL_SHAPES.index(shape)
        tiles = matmul
    for name, value in tiles.items():
        value = int(value)
        knob = next((k for k in found if k.name == name), None)
        if knob is None or value not in knob.values:
            return None
        values[name] = value
    return values


def seeded_settings(kernel: Kernel, target) -> list[dict[str, int]]:
    """The knob settings tuning measures first: the default, then each listed variant
    (:func:`tvmrnn.schedules.variants`) that is a point of the space on this device."""
    settings = [defaults(knobs(kernel, target))]
    for tiles in variants(kernel, target)[1:]:
        values = values_of(kernel, target, tiles)
        if values is not None and values not in settings:
            settings.append(values)
    return settings


def knob_values_json(trace_json) -> dict[str, int] | None:
    """The knob setting of a template-space trace in its JSON form (``[instructions, decisions]``,
    as tuning logs hold it), or None for another space's trace."""
    try:
        instructions, decisions = trace_json
        decided = {int(i): int(d) for i, d in decisions}
    except (TypeError, ValueError):
        return None
    sampled, values = {}, {}
    for index, inst in enumerate(instructions):
        if not inst:
            continue
        if inst[0] == "SampleCategorical" and index in decided:
            sampled[inst[3][0]] = int(inst[2][0][decided[index]])
        elif inst[0] == "Annotate" and str(inst[2][0]).startswith(KNOB) and inst[1][1] in sampled:
            values[str(inst[2][0])[len(KNOB):]] = sampled[inst[1][1]]
    return values or None
