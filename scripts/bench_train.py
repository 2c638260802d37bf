#!/usr/bin/env python3
"""One training step (forward, mean cross-entropy, backward, AdamW) of the shipped Fashion-MNIST
models, mpq against PyTorch eager on the CPU, in one run on the same machine.

    python scripts/bench_train.py --bench build/tests/bench_train [--torch-python PY] [--threads 2]
                                  [--batches 64,128] [--steps 20] [--repeat 3] [--amp off] [--json OUT]

mpq runs tests/train/bench_train.cpp (the training engine on the ONNX model as shipped); PyTorch
runs the same architecture as an nn.Module (scripts/train_fashion.py build_model, weights from the
.pt files) in train mode, with torch.set_num_threads(THREADS). Both take the same images
(calib_data/eval) and labels. The two run alternately in separate processes, REPEAT times; the
table shows the best median step time of each and their ratio (mpq / PyTorch), and peak resident
memory during the timed steps (VmHWM, reset after the warm-up steps; "delta" is that peak minus the
resident memory before the timed steps). torch comes from --torch-python (a Python with torch
installed; default: this interpreter). Ratios matter here; absolute times on a shared machine do not.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["fashion_resnet", "fashion_mobilenet", "fashion_vit"]

TORCH_SIDE = r"""
import json, os, sys, time
import numpy as np
import torch
sys.path.insert(0, os.path.join(sys.argv[1], "scripts"))
import train_fashion
name, batch, steps, warmup, threads, amp = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
torch.set_num_threads(threads)
torch.manual_seed(0)
model = train_fashion.build_model(name)
model.load_state_dict(torch.load(os.path.join(sys.argv[1], "tests/models/fashion", name + ".pt")))
model.train()
x_all = torch.from_numpy(np.load(os.path.join(sys.argv[1], "calib_data/eval/images.npy")))
y_all = torch.from_numpy(np.load(os.path.join(sys.argv[1], "calib_data/eval/labels.npy")))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1])
ms, rss_before = [], 0
n = x_all.shape[0]
for s in range(warmup + steps):
    if s == warmup:
        rss_before = status("VmRSS:")
        open("/proc/self/clear_refs", "w").write("5")
    idx = torch.arange(s * batch, (s + 1) * batch) % n
    xb, yb = x_all[idx], y_all[idx]
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    if amp == "bf16":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
    else:
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward()
    opt.step()
    t = (time.perf_counter() - t0) * 1000
    if s >= warmup:
        ms.append(t)
ms_sorted = sorted(ms)
print(json.dumps({"median_step_ms": ms_sorted[len(ms) // 2], "min_step_ms": ms_sorted[0], "peak_rss_kib": status("VmHWM:"),
                  "rss_before_kib": rss_before, "torch": torch.__version__}))
"""


def run_json(cmd, env):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "tests", "bench_train"))
    ap.add_argument("--torch-python", default=sys.executable)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="64,128")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--amp", default="off", choices=["off", "bf16"],
                    help="bf16: mpq --amp bf16 against torch.autocast('cpu', bfloat16)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--json")
    args = ap.parse_args()
    # PyTorch's OpenMP threads sleep when idle (as in earlier runs); bench_train gets the spin count
    # that `mpq` sets for itself (apps/mpq/main.cpp), since it links the runtime without that main.
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OMP_WAIT_POLICY="PASSIVE")
    mpq_env = {k: v for k, v in env.items() if k != "OMP_WAIT_POLICY"}
    mpq_env.setdefault("GOMP_SPINCOUNT", "20000")
    images = os.path.join(ROOT, "calib_data", "eval", "images.npy")
    labels = os.path.join(ROOT, "calib_data", "eval", "labels.npy")
    rows = []
    for name in args.models.split(","):
        model = os.path.join(ROOT, "tests", "models", "fashion", name + ".onnx")
        for batch in [int(b) for b in args.batches.split(",")]:
            best_m = best_t = None
            for _ in range(args.repeat):
                m = run_json([args.bench, model, images, labels, "--batch", str(batch), "--steps", str(args.steps),
                              "--warmup", str(args.warmup), "--threads", str(args.threads), "--amp", args.amp], mpq_env)
                t = run_json([args.torch_python, "-c", TORCH_SIDE, ROOT, name, str(batch), str(args.steps),
                              str(args.warmup), str(args.threads), args.amp], env)
                if best_m is None or m["median_step_ms"] < best_m["median_step_ms"]:
                    best_m = m
                if best_t is None or t["median_step_ms"] < best_t["median_step_ms"]:
                    best_t = t
            row = {"model": name, "batch": batch, "threads": args.threads, "amp": args.amp,
                   "mpq_ms": best_m["median_step_ms"], "torch_ms": best_t["median_step_ms"],
                   "ratio": best_m["median_step_ms"] / best_t["median_step_ms"],
                   "mpq_peak_mib": best_m["peak_rss_kib"] / 1024, "torch_peak_mib": best_t["peak_rss_kib"] / 1024,
                   "mpq_delta_mib": (best_m["peak_rss_kib"] - best_m["rss_before_kib"]) / 1024,
                   "torch_delta_mib": (best_t["peak_rss_kib"] - best_t["rss_before_kib"]) / 1024,
                   "mpq_engine_peak_mib": best_m["engine_peak_step_bytes"] / 2**20, "torch": best_t["torch"]}
            rows.append(row)
            print(f"{name:18s} batch {batch:4d}: mpq {row['mpq_ms']:8.2f} ms  torch {row['torch_ms']:8.2f} ms  "
                  f"ratio {row['ratio']:.2f}  peak RSS mpq {row['mpq_peak_mib']:.0f} MiB (delta {row['mpq_delta_mib']:.0f}) "
                  f"torch {row['torch_peak_mib']:.0f} MiB (delta {row['torch_delta_mib']:.0f})", flush=True)
    prod = 1.0
    for r in rows:
        prod *= r["ratio"]
    geo = prod ** (1.0 / len(rows))
    print(f"geometric mean mpq/torch step time: {geo:.2f} ({args.threads} threads, amp {args.amp})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "geomean_ratio": geo}, f, indent=2)


if __name__ == "__main__":
    main()
