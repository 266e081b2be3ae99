"""v87: summarise a TVMRNN_TEST_BUILD_LOG folder (tests/conftest.py): build and plan seconds per test file, and the
builds repeated with the same configuration and target (a repeat may differ by a patched module constant)."""
import json, glob, collections, re, sys
rows = [json.loads(l) for f in glob.glob((sys.argv[1] if len(sys.argv) > 1 else "/tmp/blog") + "/*.jsonl") for l in open(f)]
tot = collections.Counter(); cnt = collections.Counter()
for r in rows:
    fil = r["test"].split("::")[0]
    tot[(fil, r["kind"])] += r["seconds"]; cnt[(fil, r["kind"])] += 1
print("builds", sum(1 for r in rows if r["kind"]=="build"), "s", round(sum(r["seconds"] for r in rows if r["kind"]=="build")),
      "plans", sum(1 for r in rows if r["kind"]=="plan"), "s", round(sum(r["seconds"] for r in rows if r["kind"]=="plan")))
for k, v in tot.most_common(25): print(f"{v:7.1f} {cnt[k]:4d} {k}")
# duplicates: same config+target
key = lambda r: (re.sub(r" at 0x[0-9a-f]+", "", r["config"]), r["target"])
groups = collections.defaultdict(list)
for r in rows:
    if r["kind"] == "build": groups[key(r)].append(r)
dup = [(sum(x["seconds"] for x in g[1:]), g) for g in groups.values() if len(g) > 1]
dup.sort(key=lambda t: -t[0])
print("repeat builds", sum(len(g)-1 for _, g in dup), "seconds", round(sum(s for s, _ in dup)))
for s, g in dup[:25]:
    tests = collections.Counter(x["test"].split("[")[0] for x in g)
    m = re.search(r'input_size=\d+, hidden_size=\d+, num_layers=\d+, bidirectional=\w+, batch_size=\d+', g[0]['config']).group(0)
    cellname = re.search(r"name='(\w+)'", g[0]['config']).group(1)
    print(f"{s:6.1f} x{len(g)} {g[0]['target'][:40]} {cellname} {m}")
    for t, n in tests.most_common(4): print("        ", n, t)
