#!/usr/bin/env python3
"""Benchmark (not a test): backward of single convolution and pooling layers, mpq against PyTorch eager.

    bench_grad_ops.py [--bench build/tests/bench_conv_grad] [--threads 2] [--repeat 30] [--cases NAME,...]

Layer shapes of the small Fashion-MNIST CNNs (batch 64 and 128). mpq's side is the training engine's
backward() on a one-node model, timed by the C++ driver tests/train/bench_conv_grad.cpp (forward
untimed); PyTorch's side is torch.autograd.grad of the same layer with torch.set_num_threads(threads),
in this process. Both report, over `--repeat` runs after two warm-ups (float32), the median wall time
and the least process CPU time (all threads, spinning included), which other jobs sharing the cores
disturb far less than wall time. A first layer
("no dX") computes dW and dB only, as in training. Needs torch.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name, op, x shape, w shape (or None), bias, const x, attrs (ONNX), torch call
CASES = [
    ("conv 1->32 3x3 28x28 N=64 (no dX)", "Conv", [64, 1, 28, 28], [32, 1, 3, 3], True, True, {"pads": [1, 1, 1, 1]}),
    ("conv 32->64 3x3 14x14 N=64", "Conv", [64, 32, 14, 14], [64, 32, 3, 3], True, False, {"pads": [1, 1, 1, 1]}),
    ("conv 32->64 3x3 14x14 N=128", "Conv", [128, 32, 14, 14], [64, 32, 3, 3], True, False, {"pads": [1, 1, 1, 1]}),
    ("conv 32->32 3x3 28x28 N=64", "Conv", [64, 32, 28, 28], [32, 32, 3, 3], True, False, {"pads": [1, 1, 1, 1]}),
    ("conv 64->64 3x3 s2 14x14 N=64", "Conv", [64, 64, 14, 14], [64, 64, 3, 3], True, False,
     {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("depthwise 32 3x3 28x28 N=64", "Conv", [64, 32, 28, 28], [32, 1, 3, 3], True, False,
     {"pads": [1, 1, 1, 1], "group": 32}),
    ("depthwise 64 3x3 s2 14x14 N=128", "Conv", [128, 64, 14, 14], [64, 1, 3, 3], True, False,
     {"pads": [1, 1, 1, 1], "group": 64, "strides": [2, 2]}),
    ("pointwise 32->64 14x14 N=64", "Conv", [64, 32, 14, 14], [64, 32, 1, 1], True, False, {}),
    ("pointwise 64->128 7x7 N=128", "Conv", [128, 64, 7, 7], [128, 64, 1, 1], True, False, {}),
    ("convT 32->16 2x2 s2 14x14 N=64", "ConvTranspose", [64, 32, 14, 14], [32, 16, 2, 2], True, False,
     {"strides": [2, 2]}),
    ("maxpool 2x2 32x28x28 N=64", "MaxPool", [64, 32, 28, 28], None, False, False,
     {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ("avgpool 3x3 s2 pad1 64x14x14 N=64", "AveragePool", [64, 64, 14, 14], None, False, False,
     {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ("global avgpool 64x7x7 N=128", "GlobalAveragePool", [128, 64, 7, 7], None, False, False, {}),
    ("resize bilinear 2x 32x14x14 N=64", "Resize", [64, 32, 14, 14], None, False, False, {"mode": "linear"}),
    ("resize nearest 2x 32x14x14 N=64", "Resize", [64, 32, 14, 14], None, False, False,
     {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}),
]


def attr_args(attrs):
    out = []
    for k, v in attrs.items():
        out += ["--attr", f"{k}=" + (",".join(str(x) for x in v) if isinstance(v, list) else str(v))]
    return out


def time_mpq(bench, case, threads, repeat):
    name, op, xs, ws, bias, const_x, attrs = case
    cmd = [bench, op, "--x", ",".join(map(str, xs)), "--threads", str(threads), "--repeat", str(repeat)]
    if ws:
        cmd += ["--w", ",".join(map(str, ws))]
    if bias:
        cmd.append("--bias")
    if const_x:
        cmd.append("--const-x")
    if op == "Resize":
        cmd += ["--scales", "1,1,2,2"]
    cmd += attr_args(attrs)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return r["median_ms"], r["cpu_min_ms"]


def time_torch(torch, case, repeat):
    import torch.nn.functional as F

    name, op, xs, ws, bias, const_x, attrs = case
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(xs, generator=g) * 2 - 1).requires_grad_(not const_x)
    params = []
    if ws:
        w = (torch.rand(ws, generator=g) * 2 - 1).requires_grad_(True)
        params.append(w)
        nb = ws[1] * attrs.get("group", 1) if op == "ConvTranspose" else ws[0]
        b = (torch.rand([nb], generator=g) * 2 - 1).requires_grad_(True) if bias else None
        if b is not None:
            params.append(b)
    pads = attrs.get("pads", [0, 0, 0, 0])
    pad = (pads[0], pads[1])
    stride = tuple(attrs.get("strides", [1, 1]))

    def forward():
        if op == "Conv":
            return F.conv2d(x, w, b, stride=stride, padding=pad, groups=attrs.get("group", 1))
        if op == "ConvTranspose":
            return F.conv_transpose2d(x, w, b, stride=stride, padding=pad, groups=attrs.get("group", 1))
        if op == "MaxPool":
            return F.max_pool2d(x, attrs["kernel_shape"], stride=stride, padding=pad)
        if op == "AveragePool":
            return F.avg_pool2d(x, attrs["kernel_shape"], stride=stride, padding=pad,
                                count_include_pad=bool(attrs.get("count_include_pad", 0)))
        if op == "GlobalAveragePool":
            return F.adaptive_avg_pool2d(x, 1)
        if op == "Resize" and attrs["mode"] == "linear":
            return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        if op == "Resize":
            return F.interpolate(x, scale_factor=2, mode="nearest")
        raise ValueError(op)

    wrt = ([] if const_x else [x]) + params
    times, cpu = [], []
    for r in range(repeat + 2):
        y = forward()
        gy = torch.rand(y.shape, generator=g) * 2 - 1
        c0, t0 = time.process_time(), time.perf_counter()
        torch.autograd.grad(y, wrt, gy)
        t1, c1 = time.perf_counter(), time.process_time()
        if r >= 2:
            times.append((t1 - t0) * 1e3)
            cpu.append((c1 - c0) * 1e3)
    times.sort()
    return times[len(times) // 2], min(cpu)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default=os.path.join(ROOT, "build/tests/bench_conv_grad"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--cases", default="", help="comma-separated substrings of case names (default: all)")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("bench_grad_ops.py needs torch (scripts/requirements-torch.txt)", file=sys.stderr)
        return 77
    torch.set_num_threads(args.threads)
    wanted = [c for c in args.cases.split(",") if c]
    print(f"threads {args.threads}, {args.repeat} backward passes, float32; torch {torch.__version__}")
    print("wall: median elapsed time; cpu: least process CPU time (all threads, spinning included)")
    print(f"{'layer':40s} {'mpq wall':>9s} {'torch wall':>10s} {'ratio':>6s} {'mpq cpu':>8s} {'torch cpu':>9s} {'ratio':>6s}")
    for case in CASES:
        if wanted and not any(w in case[0] for w in wanted):
            continue
        m, mc = time_mpq(args.bench, case, args.threads, args.repeat)
        t, tc = time_torch(torch, case, args.repeat)
        print(f"{case[0]:40s} {m:9.2f} {t:10.2f} {m / t:6.2f} {mc:8.2f} {tc:9.2f} {mc / tc:6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
