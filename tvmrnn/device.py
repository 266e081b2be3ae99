"""Targets: what ``build(target=...)`` accepts, and the host CPU when none is given."""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import tvm

from .options import BuildOptions


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


# The x86 features an LLVM CPU target may compile in that a CPU must have to run its code, as LLVM
# names them and as Linux's /proc/cpuinfo does
_X86_FEATURES = {"avx2": "avx2", "fma": "fma", "avx512f": "avx512f", "avx512bw": "avx512bw",
                 "avx512vl": "avx512vl", "avx512dq": "avx512dq", "avx512bf16": "avx512_bf16",
                 "amx-tile": "amx_tile", "amx-bf16": "amx_bf16"}


def missing_host_features(target: tvm.target.Target) -> list[str]:
    """The instruction-set features that code built for the CPU ``target`` uses and this machine's
    CPU does not report (its /proc/cpuinfo flags): running that code would die of an illegal
    instruction. Empty for other targets, for this machine's own (:func:`host_target`: what it
    reports, by construction), and where the flags cannot be read."""
    if target.kind.name != "llvm" or str(target) == str(host_target()):
        return []
    flags = _cpu_flags()
    if not flags:
        return []
    from tvm.target import codegen
    return [linux for llvm, linux in _X86_FEATURES.items()
            if linux not in flags and codegen.target_has_features(llvm, target)]


def host_target() -> tvm.target.Target:
    """This machine's CPU as an LLVM target, from LLVM's host detection.

    The CPU name alone can promise more than a virtual machine exposes, so AVX-512 is only
    used when the kernel reports ``avx512f`` (else we fall back to the AVX2 level).
    """
    cpu = tvm.target.codegen.llvm_get_system_cpu()
    flags = _cpu_flags()
    if flags and "avx512f" not in flags:
        cpu = "x86-64-v3" if "avx2" in flags else "x86-64"
    elif flags:
        cpu = _with_reported_features(cpu, flags)
    return _with_llvm_opt_level(tvm.target.Target({"kind": "llvm", "mcpu": cpu, "num-cores": os.cpu_count() or 1}))


def _with_llvm_opt_level(target: tvm.target.Target) -> tvm.target.Target:
    """``target`` with LLVM's optimisation level from ``TVMRNN_LLVM_OPT_LEVEL`` (0-3) where that is
    set and the target says none itself (TVM's ``opt-level`` attribute; LLVM's default is 3).
    For quick builds where the kernels' speed does not matter: at 0, a small CPU build compiles
    ~40% quicker and runs ~25% slower (the test suite, tests/conftest.py). The level is part of
    the target, so the build cache and packages tell such builds apart."""
    level = os.environ.get("TVMRNN_LLVM_OPT_LEVEL", "")
    if not level or "opt-level" in target.attrs:
        return target
    if level not in ("0", "1", "2", "3"):
        raise ValueError(f"TVMRNN_LLVM_OPT_LEVEL: expected 0, 1, 2 or 3, got {level!r}")
    return tvm.target.Target({**target.export(), "opt-level": int(level)})


def llvm_opt_level(target: tvm.target.Target) -> int | None:
    """LLVM's optimisation level that ``target`` names for its CPU code (a GPU target's: its
    host's), None where it names none (LLVM's default, 3)."""
    llvm = target if target.kind.name == "llvm" else target.host
    if llvm is None or llvm.kind.name != "llvm" or "opt-level" not in llvm.attrs:
        return None
    return int(llvm.attrs["opt-level"])


# A virtual machine can report a CPU model older than its features (a KVM guest with AMX-BF16 and
# AVX512-BF16 that LLVM named ``rocketlake``, 2026-11-28): then the oldest CPU LLVM knows with
# the feature. (/proc/cpuinfo's flag, LLVM's feature, the CPU)
_FEATURE_CPUS = (("amx_bf16", "amx-bf16", "sapphirerapids"), ("avx512_bf16", "avx512bf16", "cooperlake"))


def _with_reported_features(cpu: str, flags: set) -> str:
    """``cpu``, or a CPU that has the bf16 features the kernel reports and LLVM's ``cpu`` lacks; or
    one without AMX where LLVM's has it and the kernel does not report it (AMX code would not run)."""
    def has(feature, name):
        return bool(tvm.target.codegen.llvm_cpu_has_features(feature, tvm.target.Target({"kind": "llvm", "mcpu": name})))
    for flag, feature, newer in _FEATURE_CPUS:
        if flag in flags and not has(feature, cpu):
            return newer
    if "amx_bf16" not in flags and has("amx-bf16", cpu):
        return "cooperlake" if "avx512_bf16" in flags else "icelake-server"
    return cpu


def cuda_target(device_index: int = 0) -> tvm.target.Target:
    """The CUDA target for the GPU the driver reports (its compute capability as ``arch``)."""
    dev = tvm.cuda(device_index)
    if not dev.exist:
        raise ValueError(f"target: no CUDA device {device_index} on this machine")
    arch = "sm_" + dev.compute_version.replace(".", "")
    # the limits MetaSchedule's rules and the GPU verifier read (the tags carry them too)
    return tvm.target.Target({"kind": "cuda", "arch": arch, "max_threads_per_block": dev.max_threads_per_block,
                              "max_shared_memory_per_block": dev.max_shared_memory_per_block,
                              "thread_warp_size": dev.warp_size, "max_num_threads": dev.max_threads_per_block,
                              "registers_per_block": 65536}, host=host_target())


def is_arch_of(arch: str, dev) -> bool:
    """Whether ``arch`` (``sm_90``, or ``sm_90a``: same chip, arch-specific features) is the
    compute capability of the CUDA device ``dev``."""
    return arch.replace("sm_", "").rstrip("a") == dev.compute_version.replace(".", "")


# What builds need to know of a GPU they may not see (a tag such as nvidia/nvidia-h100 names
# sm_90a): SMs, and the shared memory a block may opt in to. The H100 SXM's 132 SMs (the PCIe
# card's 114: the check at load time, tvmrnn.runtime.package, catches that) and 227 KB; the
# A100's 108 and 163 KB; the L40S's 142 and 99 KB (sm_89 also names desktop cards with fewer
# SMs, which the driver reports when the GPU is present). From NVIDIA's CUDA C++ Programming
# Guide, "Compute capabilities" (shared memory per block, opt-in) and the products' data sheets.
GPU_FACTS = {"sm_90": dict(multiprocessors=132, shared_bytes_per_block=227 * 1024),
             "sm_80": dict(multiprocessors=108, shared_bytes_per_block=163 * 1024),
             "sm_89": dict(multiprocessors=142, shared_bytes_per_block=99 * 1024)}
# every CUDA GPU gives a block this much without opting in
SHARED_BYTES_WITHOUT_OPT_IN = 48 * 1024


@dataclass(frozen=True)
class DeviceModel:
    """The hardware facts a build reads, in one place: a GPU's SMs and shared memory per block
    (opt-in), a CPU's cores and vector width. None where unknown (then whatever needs it is off:
    no persistent kernels without an SM count)."""

    kind: str  # "cuda" or "cpu"
    arch: str | None = None  # "sm_90" (without the "a" of arch-specific features)
    multiprocessors: int | None = None
    shared_bytes_per_block: int = SHARED_BYTES_WITHOUT_OPT_IN
    registers_per_block: int = 65536  # 32-bit registers a block may use: every CUDA GPU since sm_50
    cores: int | None = None
    vector_lanes: int | None = None  # float32 lanes of the widest vectors
    # independent vector accumulators that keep a CPU's FMA units busy: FMA latency x FMA pipes
    # (4 cycles x 2 on Zen 3-5 and on Intel's cores since Skylake); a register tile of fewer runs
    # at that share of the FMA rate (tvmrnn.schedules.cpu.padded_batch)
    busy_accumulators: int = 8
    # whether AVX512-BF16's dot products (vdpbf16ps, 32 products an instruction) outrun fp32 FMAs
    # (16): on AMD's Zen 4 and 5 they issue as FMAs do, twice the products (bf16 projections,
    # 1.3-1.7x the fp32 build's inference, notes/performance.md v40); on Intel's Xeons one port
    # takes them, as many products a cycle as the two FMA ports, and the rounding costs the rest
    # (an Emerald Rapids Xeon, 16 cores: LSTM DS2 inference 0.45x its fp32 build, v41), unless
    # they have AMX, whose tiles run the bf16 GEMMs (tvmrnn.schedules.bf16.cpu_step_amx; a 2-core
    # Sapphire Rapids-class VM: LSTM DS2 bf16 inference 2.86x PyTorch's fp32, v43)
    bf16_dot_pays: bool = False

    @property
    def async_copies(self) -> bool:
        """Whether the GPU copies global to shared memory asynchronously (``cp.async``: sm_80 on)."""
        number = re.fullmatch(r"sm_(\d+)", self.arch or "")
        return self.kind == "cuda" and number is not None and int(number.group(1)) >= 80


def device_model(target: tvm.target.Target, device_index: int = 0) -> DeviceModel:
    """The :class:`DeviceModel` of ``target``: for CUDA, this machine's GPU when its architecture
    is the target's (SMs from the driver), else the architecture's known facts (:data:`GPU_FACTS`);
    for CPUs, the target's cores and vector width."""
    if target.kind.name != "cuda":
        lanes = 16 if tvm.target.codegen.llvm_cpu_has_features("avx512f", target) else 8
        cores = target.attrs.get("num-cores")
        zen = re.fullmatch(r"znver(\d+)", str(target.attrs.get("mcpu", "")))
        amx = bool(tvm.target.codegen.llvm_cpu_has_features("amx-bf16", target))
        return DeviceModel("cpu", cores=int(cores) if cores else None, vector_lanes=lanes,
                           bf16_dot_pays=(zen is not None and int(zen.group(1)) >= 4) or amx)
    arch = str(target.attrs.get("arch", "")).rstrip("a")
    facts = dict(GPU_FACTS.get(arch, {}))
    dev = tvm.cuda(device_index)
    if dev.exist and is_arch_of(arch, dev):
        facts["multiprocessors"] = int(dev.multi_processor_count)
    return DeviceModel("cuda", arch, **facts)


def multiprocessors(target: tvm.target.Target, device_index: int = 0) -> int | None:
    """How many SMs the CUDA target's GPU has (:func:`device_model`); None for CPUs and where unknown."""
    return device_model(target, device_index).multiprocessors if target.kind.name == "cuda" else None


# Batches up to this many rows have too little work in a step for one block per SM: their
# persistent loops take fewer blocks (:func:`small_step_blocks`)
SMALL_STEP_BATCH = 8
# a block's share of shared memory that its slice of the recurrent weights may take (the rest: the
# hidden state and the partial sums of the split reduction)
WEIGHT_SHARE = 0.85
# the blocks of a small step: this many times the fewest that hold the weights (to the nearest
# power of two), measured on the H100 (notes v39)
SMALL_STEP_SPREAD = 3
# Batches of more rows, up to this many, take a block per FEW_ROWS_UNITS units of a direction (to
# the nearest power of two; none fewer than the rule above gives), one per SM where that is more
# than half the SMs. A split-K step gives each block all the rows and a few units: 132 blocks of one unit each
# spend a step mostly at the grid barrier. H100, T = 100, inference / training ms, 132 blocks ->
# this rule's (notes/performance.md v76, block_sweep.py): LSTM N=16 H=128 0.380 / 0.846 -> 0.237 /
# 0.689 (32 blocks); N=24 H=256 0.403 / 1.176 -> 0.361 / 1.124 (64); N=12 H=320 0.373 / 1.060 ->
# 0.351 / 1.093 (64); at N=13-64 and H=64-128 16-32 blocks were best too (those steps now take row
# groups where a block holds the weights: common.GPU_ROW_GROUP_STEPS).
FEW_ROWS_BATCH = 64
FEW_ROWS_UNITS = 4


def small_step_blocks(model: DeviceModel, config, directions: int | None = None) -> int | None:
    """The blocks a persistent loop of ``config`` takes by default where a step has few rows
    (batch up to :data:`SMALL_STEP_BATCH`; up to :data:`FEW_ROWS_BATCH`, a block per
    :data:`FEW_ROWS_UNITS` units), None for one per SM. A step of one row is ~2 us of
    work, much of it the grid barrier that every block of every step meets: fewer blocks meet
    sooner, but each must hold its slice of the recurrent weights in shared memory. Where one
    block holds one direction's weights, one block a direction (one block alone meets at
    ``__syncthreads``: no grid barrier); else :data:`SMALL_STEP_SPREAD` times the fewest that
    hold them, to the nearest power of two. On the H100 at T = 60, inference and training
    (notes v39): LSTM N=1 H=96 1 block 0.127 / 0.349 ms against 132 blocks 0.170 / 0.380; H=256
    16 blocks 0.162 / 0.668 against 0.220 / 0.686; GRU N=8 H=256 16 blocks 0.259 / 0.802 against
    0.381 / 0.925; H=1024 every cap below the SM count left the weights off chip (not persistent).
    ``config``: anything with ``cell.num_gates``, ``hidden_size``, ``batch_size`` and
    ``bidirectional``; ``directions``: those one launch runs (default: the configuration's; 1
    where a layer's directions run apart, ``stack_directions=False``)."""
    sms = model.multiprocessors
    if not sms or config.batch_size > FEW_ROWS_BATCH:
        return None
    gates = getattr(config.cell, "num_gates", None) or 1
    weights = 4 * gates * config.hidden_size * config.hidden_size  # one direction's, float32
    fewest = -(-weights // int(WEIGHT_SHARE * model.shared_bytes_per_block))
    per_direction = 1 if fewest == 1 else 1 << round(math.log2(SMALL_STEP_SPREAD * fewest))
    directions = directions or (2 if config.bidirectional else 1)
    if config.batch_size > SMALL_STEP_BATCH:
        per_direction = max(per_direction, 1 << round(math.log2(max(1, config.hidden_size / FEW_ROWS_UNITS))))
        # (measured up to half the SMs; past that, one per SM as before)
        return per_direction * directions if per_direction * directions <= sms // 2 else None
    blocks = per_direction * directions
    return blocks if blocks < sms else None


def persistent_blocks(target: tvm.target.Target, options: BuildOptions, config=None,
                      directions: int | None = None) -> int | None:
    """The most thread blocks a persistent kernel may have on this target: one per SM (each
    block of a persistent kernel takes the SM's shared memory for its slice of the weights, and
    the grid barrier needs every block resident; the kernel is launched cooperatively, so the
    GPU guarantees that or refuses the launch), fewer for a ``config`` of few rows
    (:func:`small_step_blocks`, whose ``directions`` are those a launch runs).

    ``options.persistent_blocks`` caps it lower, or higher than :func:`small_step_blocks` (up to
    the SM count).

    None: persistence off (``options.persistent == "off"``), a CPU, or the GPU's SM count unknown."""
    if not options.persistent_passes:
        return None
    sms = multiprocessors(target)
    if not sms:
        return None
    if options.persistent_blocks:
        return min(sms, options.persistent_blocks)
    small = small_step_blocks(device_model(target), config, directions) if config is not None else None
    return small or sms


def persistent_block_caps(target: tvm.target.Target, options: BuildOptions, config=None,
                          directions: int | None = None) -> tuple[int, ...] | None:
    """The block counts a persistent time loop tries, in order, until its step's schedule
    qualifies (its weights on chip, its grid within the count): :func:`persistent_blocks` first;
    where that is :func:`small_step_blocks`'s choice, then twice it, four times... and one per SM.
    The rule counts the weights alone, and a block also stages the step's hidden state and the
    partial sums of its split reduction, which grow with the rows: at GRU N=8 H=128 on the H100
    one block cannot keep the weights on chip, 2 can. ``options.persistent_blocks``: that count
    alone. None where :func:`persistent_blocks` is."""
    first = persistent_blocks(target, options, config, directions)
    if first is None:
        return None
    sms = multiprocessors(target)
    if options.persistent_blocks or first >= sms:
        return (first,)
    caps = [first]
    while 2 * caps[-1] < sms:
        caps.append(2 * caps[-1])
    return (*caps, sms)


def dependent_launch(target, options: BuildOptions) -> bool | str:
    """How GPU passes launch their kernels: programmatic dependent launch (PDL, sm_90+) lets the
    GPU start a kernel's blocks before the kernel before it has retired; each waits at its start
    (``griddepcontrol.wait``) until that kernel has finished and its writes are visible, which
    hides launch latency between a time loop's back-to-back kernels (``sequence.Program.dependent_launch``).
    ``options.dependent_launch``: ``off``, ``wait`` (the next kernel may start once every block of
    this one has exited), ``early`` (once every block of this one is running: its blocks then sit
    on SMs while they wait). False on CPUs and GPUs before sm_90."""
    if target is None or target.kind.name != "cuda":
        return False
    digits = "".join(ch for ch in str(target.attrs.get("arch", "")) if ch.isdigit())
    if options.dependent_launch == "off" or not digits or int(digits) < 90:
        return False
    return options.dependent_launch


def shared_kernels(target, options: BuildOptions) -> bool:
    """Whether a build compiles each kernel once for all of its call sites (``options.shared_kernels``).

    - GPUs pass views to their kernels as pointers, so that the kernels of all call sites that
      run the same code compile to one (``sequence.merge_identical_kernels``, with each view's
      offset in the pointer the host passes, ``sequence._make_view``). A 5-layer bidirectional
      GRU's 530 kernels (38 MB of CUDA source, which the H100 machine compiled for about four
      minutes at each build and each load of a package) become a few dozen: 98 s for the whole
      5-layer GRU build there.
    - CPUs call each kernel as a function of the module (v31: those whose work is all in parallel
      loops; v33: every kernel, each tensor one pointer, views as offsets on it)
      (``sequence.Subroutines``) instead of embedding it at each call site, which LLVM compiled
      once per site: on the GPU machine's Xeon (DS2 sizes) the LSTM's build 8.7-11.7 -> 3.6-4.2 s,
      a 2-layer bidirectional LSTM's 25.7 -> 10.7 s, with the same bits and speed within that
      machine's noise (notes/performance.md v31). In a time loop that is one parallel region
      (``options.time_loop_regions``) a kernel's parallel loop must sit in that region, so the
      loop stays at the call site and calls a function of one tile (v73: until then those
      kernels were embedded, and such builds took 3-4x as long).
    """
    return options.shared_kernels


def gpu_index(target) -> int:
    """The GPU a ``target`` argument names: N for ``"cuda:N"``, else 0."""
    if isinstance(target, str) and target.startswith("cuda:"):
        index = target.partition(":")[2]
        if not index.isdigit():
            raise ValueError(f"target: expected 'cuda' or 'cuda:N' with N a GPU's index, got {target!r}")
        return int(index)
    return 0


def resolve(target) -> tvm.target.Target:
    """None (this CPU), ``"cuda"`` or ``"cuda:N"`` (this machine's GPU, or its GPU N), a TVM
    Target, a dict or a tag such as ``"nvidia/nvidia-h100"``."""
    if target is None:
        return host_target()
    if target == "cuda" or (isinstance(target, str) and target.startswith("cuda:")):
        return cuda_target(gpu_index(target))
    try:
        t = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    except Exception as err:  # TVM raises its own error types for unknown kinds and tags
        raise ValueError(f"target: cannot make a TVM target of {target!r}: {err}") from None
    if t.kind.name not in ("llvm", "cuda"):
        raise ValueError(f"target: tvmrnn builds for 'llvm' (CPU) and 'cuda' targets, got {t.kind.name!r}")
    mcpu = str(t.attrs["mcpu"]) if t.kind.name == "llvm" and "mcpu" in t.attrs else ""
    if mcpu:  # (LLVM takes an unknown CPU for generic code, with a screenful of errors)
        from tvm.target import codegen
        if mcpu not in codegen.llvm_get_cpu_archlist(t):
            raise ValueError(f"target: LLVM knows no CPU named mcpu={mcpu!r} (e.g. 'sapphirerapids', "
                             f"'znver4', 'skylake-avx512')")
    if t.kind.name == "cuda" and t.host is None:
        t = tvm.target.Target(t, host=host_target())
    return _with_llvm_opt_level(t) if t.kind.name == "llvm" else t


def device_of(target: tvm.target.Target) -> tuple[str, int]:
    """The (DLPack-style) device kind this target's kernels run on: ("cpu", 0) or ("cuda", 0)."""
    return ("cuda", 0) if target.kind.name == "cuda" else ("cpu", 0)
