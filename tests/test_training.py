"""End to end: a Deep Speech 2-style acoustic model trained on the CPU with tvmrnn's drop-ins and,
side by side, the same model on torch.nn in float64. A convolutional front end, a bidirectional
GRU and a bidirectional LSTM fed by pack_padded_sequence, then CTC; batch sizes and lengths change
from step to step. Losses and gradients match at every step, nothing builds after the first
batch, and a fresh process gets the builds from the cache in under 2 s."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import tvmrnn.torch as tt
from conftest import rel_error

FEATURES, HIDDEN, CLASSES = 6, 10, 5


class Acoustic(torch.nn.Module):
    def __init__(self, gru, lstm):
        super().__init__()
        self.conv = torch.nn.Conv1d(FEATURES, 8, kernel_size=3, padding=1)
        self.gru = gru(8, HIDDEN, bidirectional=True)
        self.lstm = lstm(2 * HIDDEN, HIDDEN, bidirectional=True)
        self.head = torch.nn.Linear(2 * HIDDEN, CLASSES)

    def forward(self, x, lengths):  # x: (T, N, FEATURES)
        x = torch.relu(self.conv(x.permute(1, 2, 0))).permute(2, 0, 1)
        out, _ = self.gru(pack_padded_sequence(x, lengths, enforce_sorted=False))
        out, _ = self.lstm(out)
        y, _ = pad_packed_sequence(out)
        return self.head(y).log_softmax(-1)


def _batches(steps=5):
    g = torch.Generator().manual_seed(0)
    for n in (6, 4, 6, 1, 3)[:steps]:
        T = int(torch.randint(8, 14, (1,), generator=g))
        lengths = torch.randint(4, T + 1, (n,), generator=g)
        lengths[int(torch.randint(0, n, (1,), generator=g))] = T
        x = torch.randn(T, n, FEATURES, generator=g)
        target_lengths = torch.randint(1, 4, (n,), generator=g)
        targets = torch.randint(1, CLASSES, (int(target_lengths.sum()),), generator=g)
        yield x, lengths, targets, target_lengths


def test_ds2_style_model_trains_like_torch_with_packed_sequences(tmp_path, monkeypatch):
    monkeypatch.setenv("TVMRNN_CACHE", "on")
    monkeypatch.setenv("TVMRNN_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    ours = Acoustic(tt.GRU, tt.LSTM)
    ref = Acoustic(torch.nn.GRU, torch.nn.LSTM).double()
    ref.load_state_dict({k: v.double() for k, v in ours.state_dict().items()})
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (ours, ref)]
    ctc = torch.nn.CTCLoss(zero_infinity=True)
    builds = []
    for step, (x, lengths, targets, target_lengths) in enumerate(_batches()):
        losses = []
        for model, opt, dtype in ((ours, opts[0], torch.float32), (ref, opts[1], torch.float64)):
            opt.zero_grad()
            loss = ctc(model(x.to(dtype), lengths), targets, lengths, target_lengths)
            loss.backward()
            losses.append(loss)
        assert rel_error(losses[0], losses[1]) < 1e-4, step
        for (name, p), (_, pr) in zip(ours.named_parameters(), ref.named_parameters()):
            assert rel_error(p.grad, pr.grad) < 1e-4, (step, name)
        for opt in opts:
            opt.step()
        builds.append(len(ours.gru._built) + len(ours.lstm._built))
    assert builds == [2] * len(builds)  # one build each, at the first batch; smaller ones ran on it

    script = textwrap.dedent(f"""
        import json, os, sys, time, warnings
        warnings.simplefilter("ignore")
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import torch
        from test_training import Acoustic, _batches
        import tvmrnn.torch as tt
        os.environ["TVMRNN_CACHE"] = "on"  # importing the tests' conftest turned it off
        model = Acoustic(tt.GRU, tt.LSTM)
        x, lengths, _, _ = next(_batches(1))
        t = time.perf_counter()
        model(x, lengths)
        print(json.dumps({{"seconds": time.perf_counter() - t,
                           "hits": [r.from_cache for m in (model.gru, model.lstm) for r in m._built.values()]}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["hits"] == [True, True] and result["seconds"] < 2.0, result
