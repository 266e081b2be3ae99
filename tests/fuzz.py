"""The fuzzed contract (issue 40): random calls of build / pack_weights / forward / forward_train /
backward / export + load, drawn by Hypothesis from a fixed seed, each ending in one of two ways:

- a result that matches torch.nn in float64 within the documented tolerance (:data:`TOLERANCE`, or
  10x torch.nn's own float32 error), or
- a ``ValueError`` / ``TypeError`` whose message starts with the name of the argument that was
  made wrong (the case says which);

never another exception, a crash, a hang (pytest-timeout) or a silently wrong answer. A failing
case prints as Hypothesis's "Falsifying example" (a :class:`Case`, readable and shrunk).

``tests/test_fuzz.py`` runs it on the CPU (CI), ``tests/test_cuda.py`` on a GPU.
``TVMRNN_FUZZ_EXAMPLES`` sets the number of cases (default 200), ``TVMRNN_FUZZ_SEED`` Hypothesis's
seed (default 40: CI's cases; another seed draws other ones).
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import os
import tempfile

import numpy as np
import hypothesis
import torch
from hypothesis import HealthCheck, Phase, event, given, settings, strategies as st
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import tvmrnn
from tvmrnn.program import passes
from conftest import built, torch_module

EXAMPLES = int(os.environ.get("TVMRNN_FUZZ_EXAMPLES", "200"))
CI_SEED = 40  # what CI draws with
SEED = int(os.environ.get("TVMRNN_FUZZ_SEED", str(CI_SEED)))
SEEN: collections.Counter = collections.Counter()  # what the cases ran into, for the tests' coverage checks

# The documented tolerance against torch.nn in float64 (README, Reliability): ||a - e|| <= TOLERANCE
# * ||e|| per output and gradient, with ||e|| taken as at least 1e-3 * sqrt(size) (an all-but-zero
# gradient, as an input's gradient through many steps of a saturated cell, is compared absolutely),
# or ||a - e|| <= 10 ||t - e|| with t torch.nn's own float32 result (sums that cancel: _rel_ok).
TOLERANCE = 1e-4


@dataclasses.dataclass(frozen=True)
class Build:
    cell: str
    input_size: int
    hidden_size: int
    batch_size: int
    num_layers: int = 1
    bidirectional: bool = False
    batch_first: bool = False
    variable_lengths: bool = False
    proj_size: int = 0  # an LSTM's projections
    wavefront: bool = False  # every pass as a layer wavefront (BuildOptions.layer_wavefront)

    def rnn(self, target):
        options = tvmrnn.BuildOptions(variable_lengths=self.variable_lengths,
                                      layer_wavefront=True if self.wavefront else None)
        return built(self.cell, self.num_layers, self.bidirectional, self.batch_first, self.input_size,
                     self.hidden_size, self.batch_size, target=target, options=options, proj_size=self.proj_size)


# A fixed pool, so that the builds (about a second each) stay few: every cell, 1 everywhere, odd
# sizes, stacks, both directions, batch-first, variable lengths, a layer wavefront.
BUILDS = (
    Build("lstm", 1, 1, 1),
    Build("gru", 1, 1, 1, 1, True),
    Build("rnn_tanh", 1, 1, 1, 2, True, True),
    Build("rnn_relu", 2, 3, 2),
    Build("lstm", 5, 3, 4, 2, True),
    Build("gru", 3, 7, 2, 2, False, True),
    Build("lstm", 2, 9, 3, 1, True, True, True),
    Build("rnn_tanh", 6, 5, 5),
    Build("rnn_relu", 4, 2, 3, 2, True, False, True),
    Build("gru", 7, 4, 1, 1, False, False, True),
    Build("lstm", 3, 6, 3, 3, False, True),
    Build("gru", 2, 5, 4, 1, True, False, True),
    Build("gru", 4, 6, 3, 3, False, True, True, wavefront=True),  # (waves from T = 128: 64-step chunks)
    Build("lstm", 3, 7, 3, 2, True, False, True, proj_size=2),  # (last: explicit_examples indexes the others)
)

# What a case may make wrong, and the argument the error must name.
FAULTS = {
    None: None,
    "x_dtype": "x", "x_strided": "x", "x_features": "x", "x_rows": "x", "x_2d": "x", "x_T0": "x", "x_list": "x",
    "x_device": "x",
    "h0_shape": "h0", "h0_dtype": "h0", "h0_framework": "h0", "c0_extra": "c0", "c0_shape": "c0",
    "lengths_range": "lengths", "lengths_count": "lengths", "lengths_float": "lengths",
    "dy_shape": "dy", "dy_dtype": "dy", "dhy_shape": "dhy",
    "params_missing": "params", "params_shape": "params", "params_text": "params",
    "w_other": "w", "ws_other": "ws",
}


@dataclasses.dataclass(frozen=True)
class Call:
    T: int
    rows: int
    torch: bool  # torch tensors (on the build's device) or NumPy arrays
    train: bool  # forward_train + backward, or forward
    h0: bool
    c0: bool
    dhy: bool
    lengths: tuple | None
    fault: str | None
    seed: int


@dataclasses.dataclass(frozen=True)
class Case:
    build: Build
    packaged: bool  # through export + load
    params_torch: bool
    calls: tuple


@st.composite
def calls(draw, build: Build):
    T = draw(st.one_of(st.integers(1, 9), st.integers(10, 300)))
    rows = draw(st.integers(1, build.batch_size))
    lengths = None
    if build.variable_lengths and draw(st.booleans()):
        lengths = tuple(draw(st.lists(st.integers(1, T), min_size=rows, max_size=rows)))
    fault = draw(st.sampled_from(sorted(FAULTS, key=str))) if draw(st.booleans()) else None
    return Call(T, rows, draw(st.booleans()), draw(st.booleans()), draw(st.booleans()), draw(st.booleans()),
                draw(st.booleans()), lengths, fault, draw(st.integers(0, 2**31 - 1)))


@st.composite
def cases(draw):
    build = draw(st.sampled_from(BUILDS))
    return Case(build, draw(st.integers(0, 5)) == 0, draw(st.booleans()),
                tuple(draw(st.lists(calls(build), min_size=1, max_size=3))))


_PACKAGES: dict = {}


def _packaged(rnn, build: Build, target):
    key = (build, str(target))
    if key not in _PACKAGES:
        path = os.path.join(tempfile.mkdtemp(prefix="tvmrnn-fuzz-"), "rnn.so")
        _PACKAGES[key] = tvmrnn.load(rnn.export(path))
    return _PACKAGES[key]


def _torch_params(b: Build, seed: int):
    torch.manual_seed(seed)
    return torch_module(b.cell, b.input_size, b.hidden_size, b.num_layers, b.bidirectional, b.batch_first,
                        b.proj_size).double()


class Fault(Exception):
    """The error a faulty call raised, checked against the argument it must name."""


def _rel_ok(got, want, want32, what: str) -> None:
    """``got`` is within :data:`TOLERANCE` of ``want`` (float64) relative to its norm, or no more
    than 10x as far from it as torch.nn's own float32 result: a gradient summed over hundreds of
    steps that cancel to a small value (a 1-unit RNN's recurrent weight, say) is only as exact as
    float32 sums are."""
    a = np.asarray(got.detach().cpu() if hasattr(got, "detach") else got, np.float64)
    e = want.detach().numpy()
    assert a.shape == e.shape, f"{what}: shape {a.shape}, torch.nn {e.shape}"
    assert np.isfinite(a).all(), f"{what}: non-finite values"
    scale = max(np.linalg.norm(e), 1e-3 * np.sqrt(e.size))
    fp32 = np.linalg.norm(want32.detach().double().numpy() - e)
    err = np.linalg.norm(a - e)
    assert err <= max(TOLERANCE * scale, 10 * fp32), \
        f"{what}: relative error {err / scale:.2e} > {TOLERANCE:.0e} (torch.nn float32: {fp32 / scale:.2e})"


def _torch_run(module, dtype, x, h0, c0, lengths, b: Build, T: int, rows: int):
    """torch.nn's (y, hy, cy) for the call in ``dtype``, and a function of (dy, dhy, dcy) giving
    its gradients under tvmrnn's names."""
    L, D, H, has_c = b.num_layers, 2 if b.bidirectional else 1, b.hidden_size, b.cell == "lstm"

    def leaf(a, features):
        return (torch.tensor(a, dtype=dtype) if a is not None else torch.zeros(L * D, rows, features, dtype=dtype)
                ).requires_grad_()
    xt, h0t = torch.tensor(x, dtype=dtype, requires_grad=True), leaf(h0, b.proj_size or H)
    c0t = leaf(c0, H) if has_c else None
    inp = pack_padded_sequence(xt, torch.tensor(lengths), batch_first=b.batch_first, enforce_sorted=False) \
        if lengths is not None else xt
    out, states = module(inp, (h0t, c0t) if has_c else h0t)
    y = pad_packed_sequence(out, batch_first=b.batch_first, total_length=T)[0] if lengths is not None else out
    hy, cy = states if has_c else (states, None)

    def backward(dy, dhy, dcy):
        loss = (y * torch.from_numpy(dy).to(dtype)).sum()
        for value, grad in ((hy, dhy), (cy, dcy)):
            if grad is not None:
                loss = loss + (value * torch.from_numpy(grad).to(dtype)).sum()
        module.zero_grad()
        loss.backward()
        return {"x": xt.grad, "h0": h0t.grad, **({"c0": c0t.grad} if has_c else {}),
                **{n: p.grad.clone() for n, p in module.named_parameters()}}
    return y, hy, cy, backward


def run_case(case: Case, target=None, device="cpu") -> None:
    if device != "cpu":  # a GPU build takes torch tensors on its device (NumPy x is refused, naming x)
        case = dataclasses.replace(case, calls=tuple(dataclasses.replace(c, torch=True) for c in case.calls))
    b = case.build
    rnn = b.rnn(target)
    if case.packaged:
        rnn = _packaged(rnn, b, target)
        event("loaded package")
        SEEN["loaded package"] += 1
    SEEN["cases"] += 1
    ref = _torch_params(b, 0)
    params = {k: (v if case.params_torch else v.numpy()) for k, v in
              ((k, torch.from_numpy(v)) for k, v in tvmrnn.params_from_torch(ref).items())}
    w = rnn.pack_weights(params)
    for call in case.calls:
        try:
            _run_call(case, call, rnn, ref, params, w, device)
        except Fault:
            pass


def _expect(name: str | None, fn, *args, **kwargs):
    """``fn(...)``; where a fault was made, require a ValueError/TypeError naming ``name``."""
    if name is None:
        return fn(*args, **kwargs)
    event(f"refused: {name}")
    SEEN[f"refused: {name}"] += 1
    try:
        fn(*args, **kwargs)
    except (ValueError, TypeError) as err:
        assert str(err).startswith(name), f"{type(err).__name__} does not start with {name!r}: {err}"
        raise Fault from err
    raise AssertionError(f"no error for a wrong {name!r}")


def _run_call(case: Case, call: Call, rnn, ref, params, w, device) -> None:
    b, c = case.build, call
    rng = np.random.default_rng(c.seed)
    D, H, L = 2 if b.bidirectional else 1, b.hidden_size, b.num_layers
    S = b.proj_size or H  # the h state's features
    has_c = b.cell == "lstm"
    arr = (lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)) if c.torch else (lambda a: a)
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    seq = lambda T, n, f: (n, T, f) if b.batch_first else (T, n, f)  # noqa: E731
    fault, name = c.fault, FAULTS[c.fault]

    if fault in ("params_missing", "params_shape", "params_text"):
        bad = dict(params)
        victim = sorted(bad)[c.seed % len(bad)]
        if fault == "params_missing":
            del bad[victim]
        elif fault == "params_shape":
            bad[victim] = bad[victim][..., :-1] if bad[victim].shape[-1] > 1 else bad[victim][:0]
        else:
            bad[victim] = "not an array"
        _expect(name, rnn.pack_weights, bad)

    x = f32(*seq(c.T, c.rows, b.input_size))
    h0 = 0.5 * f32(L * D, c.rows, S) if c.h0 else None
    c0 = 0.5 * f32(L * D, c.rows, H) if c.c0 and has_c else None
    lengths = list(c.lengths) if c.lengths is not None else None
    if fault == "x_dtype":
        x = x.astype(rng.choice([np.float64, np.float16, np.int32]))
    elif fault == "x_features":
        x = f32(*seq(c.T, c.rows, b.input_size + 1))
    elif fault == "x_rows":
        x = f32(*seq(c.T, b.batch_size + 1, b.input_size))
    elif fault == "x_2d":
        x = x[0]
    elif fault == "x_T0":
        x = f32(*seq(0, c.rows, b.input_size))
    elif fault == "h0_shape":
        h0 = f32(L * D + 1, c.rows, S)
    elif fault == "h0_dtype":
        h0 = f32(L * D, c.rows, S).astype(np.float64)
    elif fault == "c0_extra" and not has_c:
        c0 = f32(L * D, c.rows, H)
    elif fault == "c0_shape" and has_c:
        c0 = f32(L * D, c.rows, H + 1)
    elif fault == "lengths_range":
        lengths = [c.T + 1] + [1] * (c.rows - 1)
    elif fault == "lengths_count":
        lengths = [1] * (c.rows + 1)
    elif fault == "lengths_float":
        lengths = np.full(c.rows, 1.5, np.float32)  # (whole numbers in floats are accepted, as torch does)
    elif fault in ("c0_extra", "c0_shape"):
        fault, name = None, None  # nothing to make wrong for this cell
    xs = arr(x)
    if fault == "x_strided":  # every other column of a wider array: a view, not C-contiguous
        wide = torch.cat([xs, xs], -1) if c.torch else np.concatenate([x, x], -1)
        xs = wide[..., ::2]
        if (xs.is_contiguous() if c.torch else xs.flags["C_CONTIGUOUS"]):  # all sizes 1: it is contiguous
            fault, name = None, None
    elif fault == "x_list":
        xs = x.tolist()
    elif fault == "x_device":
        xs = torch.zeros(x.shape, device="meta")
    states = dict(h0=None if h0 is None else arr(h0), c0=None if c0 is None else arr(c0))
    if fault == "h0_framework":
        states["h0"] = torch.from_numpy(f32(L * D, c.rows, S)) if not c.torch else f32(L * D, c.rows, S)
        if c.torch and device != "cpu":
            states["h0"] = torch.from_numpy(states["h0"])  # a CPU tensor beside CUDA ones
    if lengths is not None and not b.variable_lengths and fault is None:
        lengths = None
    if fault and fault.startswith("lengths") and not b.variable_lengths:
        lengths = [1] * c.rows  # any lengths on a build without them: refused, naming lengths
    kwargs = dict(states, lengths=lengths)
    if fault == "w_other":
        other = BUILDS[(BUILDS.index(b) + 1) % len(BUILDS)]
        w_bad = other.rnn(None if device == "cpu" else "cuda").pack_weights(
            tvmrnn.params_from_torch(_torch_params(other, 1)))
        _expect(name, rnn.forward, w_bad, xs, **kwargs)
    forward_faults = name in ("x", "h0", "c0", "lengths")
    if not c.train:
        y, hy, cy = _expect(name if forward_faults else None, rnn.forward, w, xs, **kwargs)
    else:
        y, hy, cy, ws = _expect(name if forward_faults else None, rnn.forward_train, w, xs, **kwargs)

    # torch.nn in float64 on the same input (the reference), and in float32 (what fp32 can reach)
    runs = {dtype: _torch_run(module, dtype, x, h0, c0, lengths, b, c.T, c.rows)
            for dtype, module in ((torch.float64, ref), (torch.float32, copy.deepcopy(ref).float()))}
    (yr, hyr, cyr, backward64), (y32, hy32, cy32, backward32) = runs[torch.float64], runs[torch.float32]
    event("train" if c.train else "forward")
    SEEN["forward matched"] += 1
    if lengths is not None:
        event("lengths")
        SEEN["lengths"] += 1
    _rel_ok(y, yr, y32, "y")
    _rel_ok(hy, hyr, hy32, "hy")
    if b.wavefront and c.T >= 2 * passes.WAVE_STEPS:  # (waves ran: T // 64 >= 2)
        SEEN["wavefront matched"] += 1
    if has_c:
        _rel_ok(cy, cyr, cy32, "cy")
    else:
        assert cy is None
    if not c.train:
        return

    dy, dhy = f32(*tuple(y.shape)), (f32(*tuple(hy.shape)) if c.dhy else None)
    dcy = f32(*tuple(cy.shape)) if c.dhy and has_c else None
    if fault == "dy_shape":
        dy = f32(*tuple(y.shape)[:-1], y.shape[-1] + 1)
    elif fault == "dy_dtype":
        dy = dy.astype(np.float64)
    elif fault == "dhy_shape":
        dhy = f32(L * D + 1, c.rows, S)
    if fault == "ws_other":
        other = BUILDS[(BUILDS.index(b) + 3) % len(BUILDS)].rnn(None if device == "cpu" else "cuda")
        _expect(name, rnn.backward, w, other.forward_train(
            other.pack_weights(tvmrnn.params_from_torch(_torch_params(BUILDS[(BUILDS.index(b) + 3) % len(BUILDS)], 1))),
            arr(f32(*((other.config.batch_size, 2, other.config.input_size) if other.config.batch_first else
                      (2, other.config.batch_size, other.config.input_size)))))[3], arr(dy))
    grads = _expect(name if name in ("dy", "dhy") else None, rnn.backward, w, ws, arr(dy),
                    None if dhy is None else arr(dhy), None if dcy is None else arr(dcy))
    want, want32 = backward64(dy, dhy, dcy), backward32(dy, dhy, dcy)
    assert set(grads) == set(want), (sorted(grads), sorted(want))
    for n, g in want.items():
        _rel_ok(grads[n], g, want32[n], f"d{n}")
    SEEN["gradients matched"] += 1


def fuzz_test(target=None, device="cpu", examples=EXAMPLES, shrink=True, explicit=True, seed=None):
    """A test function running :func:`run_case` on ``examples`` seeded cases (``seed``; None:
    :data:`SEED`) and, with ``explicit``, one case per fault."""
    phases = tuple(Phase) if shrink else tuple(p for p in Phase if p != Phase.shrink)
    @hypothesis.seed(SEED if seed is None else seed)  # (derandomize=True drew differently in another checkout's folder)
    @settings(max_examples=examples, deadline=None, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck), phases=phases)
    @given(cases())
    def test(case):
        run_case(case, target, device)
    for example in explicit_examples() if explicit else ():
        test = hypothesis.example(example)(test)
    return test


def explicit_examples() -> list:
    """One case per fault besides the drawn ones, so that every argument's refusal is tried in every
    run (a training call, on a build with variable lengths where the fault is about lengths), and
    one that runs the layer wavefront's waves."""
    out = []
    for k, fault in enumerate(f for f in sorted(FAULTS, key=str) if f):
        build = (BUILDS[6] if fault.startswith("lengths") else BUILDS[4] if fault == "c0_shape"
                 else BUILDS[1] if fault == "c0_extra" else BUILDS[k % len(BUILDS)])  # where it is a fault
        out.append(Case(build, False, k % 2 == 0, (Call(5, 1, k % 2 == 1, True, True, True, True, None, fault, k),)))
    # and the layer wavefront's waves (T // 64 >= 2), trained, through a package, rows of other lengths
    wave = next(b for b in BUILDS if b.wavefront)
    out.append(Case(wave, True, True, (Call(200, wave.batch_size, True, True, True, False, True,
                                            (200, 131, 64)[:wave.batch_size], None, 7),)))
    return out
