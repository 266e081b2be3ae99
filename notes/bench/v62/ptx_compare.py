"""Kernel by kernel, two CUDA sources of one build (v62: TVM-unrolled against NVCC-unrolled tiled GEMMs): PTX
instruction counts (nvcc -ptx) and registers, stack and spills (ptxas -v) where they differ.

    python notes/bench/v62/ptx_compare.py explicit.cu pragma.cu
"""
import re, subprocess, sys, collections
def stats(cu):
    ptx = cu.replace('.cu', '.ptx')
    subprocess.run(["nvcc", "-arch=sm_90a", "-ptx", "-o", ptx, cu], check=True, capture_output=True)
    v = subprocess.run(["ptxas", "-arch=sm_90a", "-v", "-o", "/dev/null", ptx], capture_output=True, text=True).stderr
    regs = {}
    cur = None
    for line in v.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m: cur = m.group(1)
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores", line)
        if m and cur: regs.setdefault(cur, {})["stack"] = int(m.group(1)); regs[cur]["spill"] = int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m and cur: regs.setdefault(cur, {})["regs"] = int(m.group(1))
    text = open(ptx).read()
    funcs = {}
    for m in re.finditer(r"\.entry (\w+)\((.*?)\n\}", text, re.S):
        body = m.group(2)
        c = collections.Counter()
        for key in ["fma.rn.f32", "ld.shared", "st.shared", "ld.global", "st.global", "ld.local", "st.local", "bra", "cp.async", "bar.sync", "shfl", "mma", "ex2", "tanh"]:
            c[key] = body.count(key)
        funcs[m.group(1)] = (c, regs.get(m.group(1), {}))
    return funcs
a, b = stats(sys.argv[1]), stats(sys.argv[2])
print(sys.argv[1], "vs", sys.argv[2], len(a), len(b))
for name in a:
    ca, ra = a[name]; cb, rb = b.get(name, ({}, {}))
    diffs = {k: (ca[k], cb.get(k)) for k in ca if ca[k] != cb.get(k)}
    if diffs or ra != rb:
        print(" ", name, ra, rb, diffs)
