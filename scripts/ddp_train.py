"""Data-parallel training with the drop-ins: PyTorch DDP, one process per GPU (NCCL), or per CPU
worker (gloo), tvmrnn's model and torch.nn's side by side.

Each rank trains two copies of one model (a linear front end, a stack of bidirectional LSTM or GRU
layers, a head with cross-entropy, Adam), one with ``tvmrnn.torch``'s RNN and one with
``torch.nn``'s, from the same initial weights on the same batches (each rank its own), steps
alternating. It reports per step the two losses (rank 0's; DDP averages the gradients, so every
rank's weights must stay the same: checked each step), the median step time of each and the first
step's time (the build: from the build cache when an earlier run made it; every rank builds the
same entry, one of them at a time). The last batch of each epoch is short (``--last-batch``): the
drop-in runs it on the build it has.

    torchrun --nproc-per-node 2 scripts/ddp_train.py --json ddp.json              # 2 GPUs, DS2 sizes
    torchrun --nproc-per-node 2 scripts/ddp_train.py --device cpu -T 12 -N 3 --size 16 --steps 4
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cell", choices=["lstm", "gru"], default="lstm")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("-T", type=int, default=300)
    p.add_argument("-N", type=int, default=20, help="rows per rank")
    p.add_argument("--size", type=int, default=800, help="input and hidden size")
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--last-batch", type=int, default=0, help="rows of a final short batch (0: none)")
    p.add_argument("--classes", type=int, default=29)
    p.add_argument("--json")
    return p.parse_args(argv)


def model(a, rnn_cls):
    import torch

    class Acoustic(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.front = torch.nn.Linear(a.size, a.size)
            self.rnn = rnn_cls(a.size, a.size, num_layers=a.num_layers, bidirectional=True)
            self.head = torch.nn.Linear(2 * a.size, a.classes)

        def forward(self, x):
            y, _ = self.rnn(torch.relu(self.front(x)))
            return self.head(y)

    return Acoustic()


def main(argv=None) -> dict:
    a = parse(argv)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import tvmrnn.torch as tt

    cuda = a.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)

    torch.manual_seed(0)  # the same initial weights on every rank and for both models
    ours = model(a, getattr(tt, a.cell.upper()))
    theirs = model(a, getattr(torch.nn, a.cell.upper()))
    theirs.load_state_dict(ours.state_dict())
    sides = {}
    for name, m in (("tvmrnn", ours), ("torch.nn", theirs)):
        m = m.to(device)
        ddp = DDP(m, device_ids=[local] if cuda else None)
        sides[name] = (ddp, torch.optim.Adam(ddp.parameters(), lr=1e-3))

    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own batches
    batches = [(torch.randn(a.T, a.N, a.size, generator=data), torch.randint(a.classes, (a.T, a.N), generator=data))
               for _ in range(a.steps)]
    if a.last_batch:
        batches.append((torch.randn(a.T, a.last_batch, a.size, generator=data),
                        torch.randint(a.classes, (a.T, a.last_batch), generator=data)))
    losses = {name: [] for name in sides}
    times = {name: [] for name in sides}
    spread = {name: 0.0 for name in sides}
    for x, target in batches:
        x, target = x.to(device), target.to(device)
        for name, (ddp, opt) in sides.items():
            sync()
            start = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(ddp(x).reshape(-1, a.classes), target.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sync()
            times[name].append(time.perf_counter() - start)
            losses[name].append(loss.item())
            # DDP keeps every rank's weights equal: the largest difference of one weight across ranks
            w = ddp.module.rnn.weight_hh_l0.detach().reshape(-1)[:4096].clone()
            gathered = [torch.empty_like(w) for _ in range(world)]
            dist.all_gather(gathered, w)
            spread[name] = max(spread[name], max(float((g - w).abs().max()) for g in gathered))

    out = dict(config=vars(a), world=world, device=torch.cuda.get_device_name(device) if cuda else "cpu",
               losses=losses, first_step_s={n: t[0] for n, t in times.items()},
               median_step_ms={n: 1e3 * statistics.median(t[1:a.steps] or t) for n, t in times.items()},
               last_batch_s={n: t[-1] for n, t in times.items()} if a.last_batch else None,
               rank_weight_spread=spread,
               max_loss_rel_diff=max(abs(p - q) / abs(q) for p, q in zip(losses["tvmrnn"], losses["torch.nn"])),
               builds=len(ours.rnn._built))
    if rank == 0:
        ratio = out["median_step_ms"]["torch.nn"] / out["median_step_ms"]["tvmrnn"]
        print(f"{world} ranks on {out['device']}: step tvmrnn {out['median_step_ms']['tvmrnn']:.1f} ms, "
              f"torch.nn {out['median_step_ms']['torch.nn']:.1f} ms ({ratio:.2f}x); first step "
              f"{out['first_step_s']['tvmrnn']:.1f} s; losses within {out['max_loss_rel_diff']:.1e}; "
              f"weights across ranks within {max(spread.values()):.1e}; builds {out['builds']}", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
    # Tear down in order, with every collective retired first. torch 2.13's gloo can deadlock
    # otherwise: freeing the DDP wrapper's Reducer drops the last reference to the process group,
    # whose destructor (holding the GIL) joins gloo's worker thread while that thread frees the
    # last all_gather's work, which needs the GIL to release its tensors (seen in CI: rank 0 stuck
    # at exit after writing its results).
    dist.barrier()
    sides.clear()
    del ddp, opt
    time.sleep(0.2)  # gloo's thread frees the barrier's work (no Python tensors) without the GIL held
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    main()
