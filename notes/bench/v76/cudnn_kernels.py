"""Which kernels cuDNN runs for small LSTM steps (v76): torch.profiler over 5 inference calls of
T=100, I=H, TF32 off (output: h100_cudnn_kernels.txt)."""
import torch
from torch.profiler import profile, ProfilerActivity

torch.backends.cudnn.allow_tf32 = False
for cell, N, H in (("lstm", 13, 90), ("lstm", 16, 128), ("lstm", 24, 256)):
    m = {"lstm": torch.nn.LSTM}[cell](H, H).cuda()
    x = torch.randn(100, N, H, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            m(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                m(x)
            torch.cuda.synchronize()
    print(cell, N, H)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=90))
