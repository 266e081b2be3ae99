"""Exported packages: one .so, loaded in a fresh process, refused clearly where it cannot run."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import tvm

import tvmrnn
from tvmrnn.runtime import package
from conftest import H, I, N, built, cli, torch_module

# whole builds at LLVM's own optimisation level, as users get them (tests/conftest.py)
pytestmark = pytest.mark.llvm_optimized

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    path = tmp_path_factory.mktemp("pkg") / "lstm.so"
    built("lstm", 2, True).export(path)
    return str(path)


def test_loads_in_a_fresh_process_and_matches(exported, tmp_path):
    """A new interpreter loads the .so (compiling nothing) and gives the built RNN's results."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, N, I)).astype(np.float32)
    dy = rng.standard_normal((8, N, 2 * H)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "dy.npy", dy)
    script = f"""
import sys, numpy as np, torch, tvmrnn, tvm
torch.manual_seed(0)
compiles = []
tvm.compile = lambda *a, **k: compiles.append(a)  # loading must not compile
m = torch.nn.LSTM({I}, {H}, 2, bidirectional=True)
rnn = tvmrnn.load({exported!r})
w = rnn.pack_weights(tvmrnn.params_from_torch(m))
x, dy = np.load(r"{tmp_path}/x.npy"), np.load(r"{tmp_path}/dy.npy")
y, hy, cy, ws = rnn.forward_train(w, x)
g = rnn.backward(w, ws, dy)
np.savez(r"{tmp_path}/out.npz", y=y, dx=g["x"], dw=g["weight_hh_l1_reverse"])
assert not compiles
"""
    subprocess.run([sys.executable, "-c", script], check=True, cwd=REPO)
    out = np.load(tmp_path / "out.npz")
    torch.manual_seed(0)
    rnn = built("lstm", 2, True)
    w = rnn.pack_weights(tvmrnn.params_from_torch(torch.nn.LSTM(I, H, 2, bidirectional=True)))
    y, _, _, ws = rnn.forward_train(w, x)
    g = rnn.backward(w, ws, dy)
    assert np.array_equal(out["y"], y) and np.array_equal(out["dx"], g["x"])
    assert np.array_equal(out["dw"], g["weight_hh_l1_reverse"])


def test_an_older_package_gets_its_weight_gradients_zeroed(tmp_path, monkeypatch):
    """Packages of format 1 and 2 expect the caller to zero the weight gradients, which the
    backward pass now does itself (format 3): loaded, they still get them zeroed by the caller."""
    rnn = built("lstm", 1, False)
    assert rnn.backward_zeroes_dw
    monkeypatch.setattr(package, "FORMAT_VERSION", 2)
    rnn.export(tmp_path / "old.so")
    monkeypatch.undo()
    old = tvmrnn.load(tmp_path / "old.so")
    assert package.read_metadata(tmp_path / "old.so")["format_version"] == 2 and not old.backward_zeroes_dw
    rnn.export(tmp_path / "new.so")
    assert tvmrnn.load(tmp_path / "new.so").backward_zeroes_dw
    rng = np.random.default_rng(5)
    params = tvmrnn.params_from_torch(torch_module("lstm", I, H, 1, False, False))
    x = rng.standard_normal((9, N, I)).astype(np.float32)
    dy = rng.standard_normal((9, N, H)).astype(np.float32)
    grads = []
    for r in (rnn, old):
        w = r.pack_weights(params)
        grads.append(r.backward(w, r.forward_train(w, x)[3], dy))
    for name in grads[0]:
        assert np.array_equal(grads[0][name], grads[1][name]), name


def test_metadata_describes_the_package(exported):
    meta = package.read_metadata(exported)
    assert json.loads(tvm.runtime.load_module(exported)["tvmrnn_metadata"]()) == meta  # the FFI twin
    assert (meta["cell"], meta["input_size"], meta["hidden_size"], meta["num_layers"]) == ("lstm", I, H, 2)
    assert meta["bidirectional"] and not meta["batch_first"] and meta["dtype"] == "float32"
    assert meta["tvm_version"] == tvm.__version__ and meta["target_kind"] == "llvm"
    assert set(meta["signatures"]) == {"forward", "forward_train", "backward", "pack_weights", "pack_forward"}
    assert meta["weights_size"] == sum(int(np.prod(s)) for _, s, _ in meta["parameters"])
    assert "weight_layout" in meta and "features" in meta["cpu"]
    # 37 hidden units: no tile divides them; panels of 8 units on AVX-512, of 4 on AVX2, the last
    # padded (40 packed units: cpu.CPU_PADDED_PANELS, v75; on AVX2 since v81)
    from tvmrnn.device import host_target
    from tvmrnn.schedules import cpu
    panel = cpu.weight_panel(host_target(), 4, H)
    assert panel == (8 if cpu.vector_lanes(host_target()) == 16 else 4)
    assert meta["weight_panel"] == panel and meta["packed_units"] == (40 if panel else 0)
    assert meta["packed_weights_size"] - 2 * meta["weights_size"] == (2 * 4 * 3 * ((13 + 37 + 2) + (74 + 37 + 2)) if panel else 0)
    assert meta["backward_weight_panels"] == {"13": 0, "37": 0, "74": 0}  # nor 13 inputs, nor 2 x 37


def test_not_a_package(tmp_path):
    text = tmp_path / "notes.so"
    text.write_text("not a library")
    with pytest.raises(tvmrnn.PackageError, match="not a 64-bit little-endian shared library"):
        tvmrnn.load(text)
    with pytest.raises(FileNotFoundError):
        tvmrnn.load(tmp_path / "missing.so")
    other = tmp_path / "plain.so"  # a real TVM library, but not ours
    tvm.compile(tvm.IRModule({"main": tvmrnn.kernels.copy(2, 2).func}), target="llvm").export_library(str(other))
    with pytest.raises(tvmrnn.PackageError, match="not a tvmrnn package"):
        tvmrnn.load(other)
    # a truncated library: mapping it would be a SIGBUS at the first touch past its end
    for size in (100, len(other.read_bytes()) // 2, len(other.read_bytes()) - 1):
        cut = tmp_path / f"cut{size}.so"
        cut.write_bytes(other.read_bytes()[:size])
        with pytest.raises(tvmrnn.PackageError, match="truncated"):
            tvmrnn.load(cut)
    # a name TVM would not load by (read through a private copy): the error names the user's file
    named = tmp_path / "model.tvmrnn"
    named.write_bytes(other.read_bytes()[:100])
    with pytest.raises(tvmrnn.PackageError, match=re.escape(repr(str(named)))):
        tvmrnn.load(named)


def test_any_name_round_trips_and_a_package_exported_again_loads_as_new(tmp_path):
    """``export`` writes a shared library whatever the name (TVM's ``export_library`` picks the
    format by the suffix: ``.tar`` made an archive), and ``load`` reads it whatever the name (TVM's
    loader too: ``model.tvmrnn`` and ``model`` failed); a package exported again over a path this
    process loaded loads as the new one (the dynamic loader handed back the old library)."""
    gru = tvmrnn.build("gru", input_size=5, hidden_size=6, batch_size=2, cache=False)
    lstm = tvmrnn.build("lstm", input_size=5, hidden_size=6, batch_size=2, cache=False)
    for name in ("model.tvmrnn", "model", "model.tar"):
        gru.export(tmp_path / name)
        assert tvmrnn.load(tmp_path / name).config == gru.config, name
    path = tmp_path / "again.so"
    gru.export(path)
    assert tvmrnn.load(path).config.cell.name == "gru"
    loaded = tvmrnn.load(path)
    lstm.export(path)
    assert tvmrnn.load(path).config.cell.name == "lstm"
    # the GRU loaded before runs on, but its file is the LSTM's now: its export refuses to copy that
    with pytest.raises(ValueError, match="has been replaced since"):
        loaded.export(tmp_path / "copy.so")
    with pytest.raises(ValueError, match="device: expected None, 'cpu', 'cuda' or 'cuda:N', got 'cuda:x'"):
        tvmrnn.load(path, device="cuda:x")


def _resealed(data: bytes) -> bytes:
    """``data`` (a package's bytes) with its closing checksum made to match what precedes it, as a
    deliberate edit would leave it."""
    import hashlib
    body = data[:-package._TRAILER_SIZE]
    return body + package._TRAILER + hashlib.sha256(body).hexdigest().encode() + b"\n"


def test_a_tampered_package_is_refused(exported, tmp_path):
    """A package whose metadata does not match its library raises PackageError before any kernel
    runs: an edited size (the file's checksum catches it; with that made to match, the metadata's
    checksum), the same edit with both checksums made to match (the layout check catches it), and
    a library without a pass its metadata names."""
    import hashlib
    data = open(exported, "rb").read()
    text = json.dumps(package.read_metadata(exported), sort_keys=True).encode()  # as export wrote it
    assert data.count(text) == 1
    digest = hashlib.sha256(text).hexdigest().encode()
    assert data.count(digest) == 1 and b'"hidden_size": 37' in text

    def tampered(name, edits, reseal=True):
        out = data
        for old, new in edits:
            assert len(old) == len(new) and out.count(old) >= 1
            out = out.replace(old, new)
        (tmp_path / name).write_bytes(_resealed(out) if reseal else out)
        return tmp_path / name

    edited = text.replace(b'"hidden_size": 37', b'"hidden_size": 36')
    with pytest.raises(tvmrnn.PackageError, match="its contents do not match the checksum"):
        tvmrnn.load(tampered("size_as_is.so", [(text, edited)], reseal=False))
    with pytest.raises(tvmrnn.PackageError, match="metadata does not match the checksum"):
        tvmrnn.load(tampered("size.so", [(text, edited)]))
    rehashed = hashlib.sha256(edited).hexdigest().encode()
    with pytest.raises(tvmrnn.PackageError, match="does not describe a configuration.*packed_weights_size"):
        tvmrnn.load(tampered("size_and_hash.so", [(text, edited), (digest, rehashed)]))
    renamed = text.replace(b'"forward_train"', b'"forward_tra1n"')
    with pytest.raises(tvmrnn.PackageError, match=r"lacks the passes its metadata names: \['forward_tra1n'\]"):
        tvmrnn.load(tampered("pass.so", [(text, renamed), (digest, hashlib.sha256(renamed).hexdigest().encode())]))
    assert tvmrnn.load(exported).config.hidden_size == 37  # the original still loads


def _text_section(data: bytes) -> tuple[int, int]:
    """The file offset and size of a 64-bit ELF's ``.text`` section."""
    import struct
    shoff, = struct.unpack_from("<Q", data, 40)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 58)

    def section(i):
        return struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
    names = section(shstrndx)[4]
    for i in range(shnum):
        name, _, _, _, offset, size = section(i)
        if data[names + name:data.index(b"\0", names + name)] == b".text":
            return offset, size
    raise AssertionError("no .text section")


def test_a_package_with_damaged_code_is_refused(exported, tmp_path):
    """A package whose code is damaged (bytes of its ``.text`` section overwritten: it loaded, and
    its first call crashed the process) raises PackageError at ``load``, before the dynamic loader
    runs any of it; one without the checksum that ends it (cut off, or stripped) is refused too.
    The original still loads and runs."""
    data = open(exported, "rb").read()
    assert data.endswith(b"\n") and package._TRAILER in data[-package._TRAILER_SIZE:]
    offset, size = _text_section(data)
    middle = offset + size // 2
    damaged = tmp_path / "damaged.so"
    damaged.write_bytes(data[:middle] + b"\xcc" * 64 + data[middle + 64:])  # int3 over some kernel's code
    with pytest.raises(tvmrnn.PackageError, match="its contents do not match the checksum"):
        tvmrnn.load(damaged)
    cut = tmp_path / "no_checksum.so"
    cut.write_bytes(data[:-package._TRAILER_SIZE])
    with pytest.raises(tvmrnn.PackageError, match="checksum of its contents is missing"):
        tvmrnn.load(cut)
    rnn = tvmrnn.load(exported)
    x = np.random.default_rng(0).standard_normal((4, rnn.config.batch_size, rnn.config.input_size)).astype(np.float32)
    params = tvmrnn.params_from_torch(torch_module(rnn.config.cell.name, rnn.config.input_size, rnn.config.hidden_size,
                                                   rnn.config.num_layers, rnn.config.bidirectional, False))
    assert np.isfinite(rnn.forward(rnn.pack_weights(params), x)[0]).all()


def test_avx512_package_refused_on_a_cpu_without_it(tmp_path, monkeypatch):
    path = tmp_path / "spr.so"
    tvmrnn.build("gru", input_size=8, hidden_size=8, batch_size=2,
                 target={"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 16}).export(path)
    monkeypatch.setattr(package, "_cpu_flags", lambda: {"sse2", "avx", "avx2", "fma"})
    with pytest.raises(tvmrnn.PackageError, match=r"needs \['avx512f'.*sapphirerapids"):
        tvmrnn.load(path)
    # AVX-512 there but no AMX: what the target lets the fp32 code use is checked too (it loaded,
    # then its first call raised RuntimeError)
    from tvmrnn import device
    flags = {"sse2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl",
             "avx512_bf16", "avx512vnni", "avx512_vnni", "avx512ifma", "avx512vbmi", "avx512_vbmi2", "avx512_bitalg",
             "avx512_vpopcntdq", "avx512_fp16", "bmi1", "bmi2", "popcnt", "movbe", "adx", "sha_ni", "gfni", "vaes",
             "vpclmulqdq", "avx_vnni", "serialize", "tsxldtrk", "waitpkg", "cldemote", "movdiri", "movdir64b",
             "clwb", "clflushopt", "xsave", "xsavec", "xsaveopt", "xsaves", "rdrand", "rdseed", "lzcnt", "pku",
             "aes", "pclmulqdq", "sse4_1", "sse4_2", "ssse3", "sse3", "prefetchw", "rdpid", "enqcmd", "pconfig",
             "uintr", "sgx", "ptwrite", "hreset", "wbnoinvd", "fsgsbase", "amx_int8"}
    monkeypatch.setattr(package, "_cpu_flags", lambda: flags)
    monkeypatch.setattr(device, "_cpu_flags", lambda: flags)
    with pytest.raises(tvmrnn.PackageError, match=r"needs \[.*amx_tile.*sapphirerapids"):
        tvmrnn.load(path)


def test_other_tvm_version_refused(exported, monkeypatch):
    monkeypatch.setattr(tvm, "__version__", "0.99.0")
    with pytest.raises(tvmrnn.PackageError, match="built with TVM 0.27.0.post1, this is TVM 0.99.0"):
        tvmrnn.load(exported)


@pytest.mark.skipif(tvm.cuda(0).exist, reason="checks the refusal on a machine without a GPU")
def test_cuda_package_refused_without_a_gpu(tmp_path):
    path = tmp_path / "h100.so"
    rnn = tvmrnn.build("lstm", input_size=8, hidden_size=8, batch_size=2, target="nvidia/nvidia-h100")
    rnn.export(path)
    if tvm.cuda(0).exist:
        pytest.skip("this machine has a GPU")
    # the build (made for export) says why it cannot run, not TVM's "Device API cuda is not enabled"
    with pytest.raises(ValueError, match="built for CUDA .device 0. and this machine has no such GPU"):
        rnn.pack_weights(tvmrnn.params_from_torch(torch_module("lstm", 8, 8, 1, False, False)))
    with pytest.raises(tvmrnn.PackageError, match="for a CUDA GPU .sm_90a. and this machine has no CUDA device"):
        tvmrnn.load(path)
    with pytest.raises(tvmrnn.PackageError, match="is for cuda, not device 'cpu'"):
        tvmrnn.load(path, device="cpu")


def test_export_command(tmp_path):
    out = tmp_path / "rnn.so"
    subprocess.run([*cli("tvmrnn-export"), "rnn_relu", "--input-size", "5",
                    "--hidden-size", "6", "--batch-size", "2", "--num-layers", "2", "--batch-first", "-o", str(out)],
                   check=True, cwd=REPO)
    rnn = tvmrnn.load(out)
    assert rnn.config.cell.name == "rnn_relu" and rnn.config.batch_first and rnn.config.num_layers == 2


def test_bench_uses_a_package_for_its_configuration(exported, tmp_path):
    """``tvmrnn-bench --packages``: the configuration the package was built for runs the package (no build),
    and agrees with PyTorch; a package for another configuration is not used."""
    out = tmp_path / "bench.json"
    common = [*cli("tvmrnn-bench"), "lstm", "-T", "5", "-N", str(N),
              "--input-size", str(I), "--hidden-size", str(H), "--reps", "2", "--threads", "1",
              "--packages", exported, "--json", str(out)]
    subprocess.run(common + ["--num-layers", "2", "--bidirectional"], check=True, cwd=REPO, capture_output=True)
    rows = json.load(open(out))["results"]
    assert {r["pass_"] for r in rows} == {"inference", "training"}
    # the package records what its build used (tuning logs off in the tests: no kernel tuned)
    assert all(r["package"] == exported and re.fullmatch(r"0/\d+", r["tuned_kernels"]) for r in rows)
    assert all(r["rel_error"] < 1e-4 for r in rows)
    from tvmrnn.cli.bench import find_package
    config = dict(cell="lstm", num_layers=2, bidirectional=True, batch_size=N, input_size=I, hidden_size=H,
                  target_kind="llvm")
    assert find_package([exported], **config) == exported
    assert find_package([exported], **dict(config, num_layers=1)) is None
    assert find_package([exported], **dict(config, target_kind="cuda")) is None


def test_cpp_example_matches_python(exported, tmp_path):
    binary = tmp_path / "run_forward"
    subprocess.run(["g++", "-std=c++17", "-O2", os.path.join(REPO, "examples", "cpp", "run_forward.cc"),
                    *package.cxx_flags(), "-o", str(binary)], check=True)
    torch.manual_seed(0)
    params = tvmrnn.params_from_torch(torch.nn.LSTM(I, H, 2, bidirectional=True))
    rnn = tvmrnn.load(exported)
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    np.concatenate([params[n].ravel() for n in rnn.config.layout.names]).tofile(tmp_path / "in" / "params.f32")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((11, N, I)).astype(np.float32)
    c0 = rng.standard_normal((4, N, H)).astype(np.float32)
    x.tofile(tmp_path / "in" / "x.f32")
    c0.tofile(tmp_path / "in" / "c0.f32")
    run = subprocess.run([str(binary), exported, "11", str(tmp_path / "in"), str(tmp_path / "out")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    y, hy, cy = rnn.forward(rnn.pack_weights(params), x, None, c0)
    assert np.array_equal(np.fromfile(tmp_path / "out" / "y.f32", np.float32).reshape(y.shape), y)
    assert np.array_equal(np.fromfile(tmp_path / "out" / "cy.f32", np.float32).reshape(cy.shape), cy)
    bad = subprocess.run([str(binary), exported, "12", str(tmp_path / "in"), str(tmp_path / "out")],
                         capture_output=True, text=True)  # x.f32 holds 11 steps, not 12
    assert bad.returncode == 1 and "x.f32: expected" in bad.stderr
    # a package whose kernels have more rows than its batch_size (a CPU batch of 7 LSTM rows on
    # 16-unit tiles: 8, schedules.cpu.padded_batch): the files hold 7 rows, batch first
    padded = tvmrnn.build("lstm", I, 64, batch_size=7, batch_first=True, cache=False)
    assert (padded.config.batch_size, padded.config.rows) == (7, 8)
    padded.export(str(tmp_path / "padded.so"))
    params = tvmrnn.params_from_torch(torch.nn.LSTM(I, 64))
    np.concatenate([params[n].ravel() for n in padded.config.layout.names]).tofile(tmp_path / "in" / "params.f32")
    x = rng.standard_normal((7, 5, I)).astype(np.float32)
    h0 = rng.standard_normal((1, 7, 64)).astype(np.float32)
    x.tofile(tmp_path / "in" / "x.f32")
    h0.tofile(tmp_path / "in" / "h0.f32")
    (tmp_path / "in" / "c0.f32").unlink()
    run = subprocess.run([str(binary), str(tmp_path / "padded.so"), "5", str(tmp_path / "in"), str(tmp_path / "out")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    y, hy, cy = padded.forward(padded.pack_weights(params), x, h0)
    for name, want in (("y", y), ("hy", hy), ("cy", cy)):
        got = np.fromfile(tmp_path / "out" / f"{name}.f32", np.float32)
        assert got.size == want.size and np.array_equal(got.reshape(want.shape), want), name


def test_weights_follow_the_layout_not_every_option(rng):
    """Packed weights serve another build of the same configuration whose options leave the layout
    alone (threads), and are refused by one whose weights are laid out otherwise (no panels)."""
    a = built("gru", 1, False)
    w = a.pack_weights(tvmrnn.params_from_torch(torch_module("gru", I, H, 1, False, False)))
    with warnings.catch_warnings():  # runs on the process's pool, whatever count it asks (threads.py warns)
        warnings.simplefilter("ignore", RuntimeWarning)
        same = tvmrnn.build("gru", input_size=I, hidden_size=H, batch_size=N, options=tvmrnn.BuildOptions(threads=1))
    x = rng.standard_normal((4, N, I)).astype(np.float32)
    np.testing.assert_array_equal(same.forward(w, x)[0], a.forward(w, x)[0])
    other = tvmrnn.build("gru", input_size=I, hidden_size=H, batch_size=N,
                         options=tvmrnn.BuildOptions(weight_panels=False))
    with pytest.raises(ValueError, match="w: these weights were packed for a different configuration"):
        other.forward(w, x)
