#!/usr/bin/env python3
"""Quantization-aware training on the shipped Fashion-MNIST models: mpq against PyTorch, in one run.

    python scripts/bench_qat.py --mpq build/apps/mpq/mpq [--torch-python PY] [--threads 2]
                                [--models resnet,mobilenet,vit] [--settings w8a8-pt,w4a8-pc]
                                [--epochs 1] [--lr 1e-4] [--batch 64] [--json OUT]

For each model and setting (w8a8-pt: int8 weights per tensor, int8 activations; w4a8-pc: 4-bit
weights per channel, int8 activations):
  - FP32 and PTQ (`mpq quantize --calib`, entropy ranges from 512 training images) accuracy on the
    10,000 test images;
  - mpq QAT (`mpq qat-finetune`, starting from the same table) after EPOCHS passes over the 60,000
    training images, label-free (--loss distill) and with labels (--loss ce), and its time per epoch;
  - PyTorch QAT with the same placement, initial scales, bit widths, optimizer (AdamW, cosine decay
    with the same warm-up), batch size, loss and budget: the fake-quant graph mpq would train
    (`mpq quantize --format fakequant`) evaluated in PyTorch (scripts/onnx_torch.py) with PyTorch's
    own fake-quantize ops (torch._fake_quantize_learnable_per_*_affine: LSQ, the STE with the
    clipping mask), trained by PyTorch autograd; its accuracy (evaluated in PyTorch) and time per
    epoch.
Accuracy of mpq's outputs is measured by ONNX Runtime running the exported QDQ model as written.
Goals (issue 14): QAT recovers >= 80% of the PTQ drop wherever PTQ loses >= 0.5 points; never more
than 0.2 points below PyTorch's QAT; distill within 0.3 points of ce; epoch time <= 2x PyTorch's.
Data is prepared once under out/bench_qat/ from Debian's dataset-fashion-mnist.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "out", "bench_qat")
SETTINGS = {"w8a8-pt": ["--per-tensor"], "w4a8-pc": ["--weight-bits", "4"]}

TORCH_SIDE = r"""
import json, math, os, sys, time
import numpy as np, onnx, torch
sys.path.insert(0, os.path.join(sys.argv[1], "scripts"))
from onnx_torch import OnnxTorch, fake_quant_student
fq_path, fp32_path, data, test, loss_kind = sys.argv[2:7]
epochs, batch, lr, threads = int(sys.argv[7]), int(sys.argv[8]), float(sys.argv[9]), int(sys.argv[10])
torch.set_num_threads(threads)
torch.manual_seed(0)
student, params, scales = fake_quant_student(onnx.load(fq_path))
teacher = OnnxTorch(onnx.load(fp32_path))
x_all = torch.from_numpy(np.load(os.path.join(data, "images.npy")))
y_all = torch.from_numpy(np.load(os.path.join(data, "labels.npy")))
n = x_all.shape[0]
steps_per_epoch = (n + batch - 1) // batch
total = epochs * steps_per_epoch
warmup = min(100, total // 20)
groups = [{"params": [p for k, p in params.items() if k in scales], "weight_decay": 0.0},
          {"params": [p for k, p in params.items() if k not in scales], "weight_decay": 0.0}]
opt = torch.optim.AdamW(groups, lr=lr)
def lr_at(step):
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(total - warmup, 1))
    return lr * 0.5 * (1 + math.cos(math.pi * progress))
rng = np.random.default_rng(0)
t0 = time.perf_counter()
step = 0
for epoch in range(epochs):
    perm = torch.from_numpy(rng.permutation(n))
    for s in range(steps_per_epoch):
        idx = perm[s * batch:(s + 1) * batch]
        xb, yb = x_all[idx], y_all[idx]
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        out = student.run({"input": xb})[0]
        loss = 0.0
        if loss_kind in ("distill", "distill+ce"):
            with torch.no_grad():
                t = teacher.run({"input": xb})[0]
            loss = loss + torch.nn.functional.kl_div(torch.log_softmax(out, 1), torch.softmax(t, 1), reduction="batchmean")
        if loss_kind in ("ce", "distill+ce"):
            loss = loss + torch.nn.functional.cross_entropy(out, yb)
        loss.backward()
        opt.step()
        step += 1
seconds = time.perf_counter() - t0
xt = torch.from_numpy(np.load(os.path.join(test, "images.npy")))
yt = np.load(os.path.join(test, "labels.npy"))
correct = 0
with torch.no_grad():
    for i in range(0, xt.shape[0], 500):
        correct += int((student.run({"input": xt[i:i + 500]})[0].argmax(1).numpy() == yt[i:i + 500]).sum())
print(json.dumps({"accuracy": correct / len(yt), "seconds_per_epoch": seconds / epochs, "torch": torch.__version__}))
"""


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return r.stdout


def prepare_data(python):
    os.makedirs(OUT, exist_ok=True)
    script = os.path.join(ROOT, "scripts", "fashion_data.py")
    jobs = {"train": ["--split", "train", "--labels"],
            "test": ["--split", "test", "--labels"],
            "calib": ["--split", "train", "--count", "512", "--shuffle-seed", "0"]}
    for name, flags in jobs.items():
        d = os.path.join(OUT, name)
        if not os.path.exists(os.path.join(d, "images.npy")):
            run([python, script, "--out", d] + flags)
    return {k: os.path.join(OUT, k) for k in jobs}


def accuracy_ort(model, test):
    x = np.load(os.path.join(test, "images.npy"))
    y = np.load(os.path.join(test, "labels.npy"))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    correct = 0
    for i in range(0, len(x), 500):
        correct += int((s.run(None, {"input": x[i:i + 500]})[0].argmax(1) == y[i:i + 500]).sum())
    return correct / len(y)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mpq", required=True)
    ap.add_argument("--torch-python", default=None, help="a Python with torch (default: skip PyTorch QAT)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="resnet,mobilenet,vit")
    ap.add_argument("--settings", default="w8a8-pt,w4a8-pc")
    ap.add_argument("--losses", default="distill,ce")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--json")
    args = ap.parse_args()
    # PyTorch's OpenMP threads sleep when idle; mpq picks its own short spin (apps/mpq/main.cpp).
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OMP_WAIT_POLICY="PASSIVE")
    mpq_env = {k: v for k, v in env.items() if k != "OMP_WAIT_POLICY"}
    data = prepare_data(sys.executable)
    rows = []
    for short in args.models.split(","):
        name = "fashion_" + short
        model = os.path.join(ROOT, "tests", "models", "fashion", name + ".onnx")
        work = os.path.join(OUT, name)
        os.makedirs(work, exist_ok=True)
        table = os.path.join(work, "calib.json")
        run([args.mpq, "calibrate", model, "--data", data["calib"], "-o", table, "--threads", str(args.threads)])
        fp32 = accuracy_ort(model, data["test"])
        print(f"{name}: FP32 {100 * fp32:.2f}%", flush=True)
        for setting in args.settings.split(","):
            flags = SETTINGS[setting]
            ptq_path = os.path.join(work, f"{setting}.ptq.onnx")
            run([args.mpq, "quantize", model, "--calib", table, "-o", ptq_path, "--threads", str(args.threads)] + flags)
            ptq = accuracy_ort(ptq_path, data["test"])
            row = {"model": name, "setting": setting, "fp32": fp32, "ptq": ptq}
            for loss in args.losses.split(","):
                out = os.path.join(work, f"{setting}.qat-{loss}.onnx")
                res = json.loads(run([args.mpq, "qat-finetune", model, "--data", data["train"], "--calib", table,
                                      "--epochs", str(args.epochs), "--batch-size", str(args.batch), "--lr", str(args.lr),
                                      "--loss", loss, "--threads", str(args.threads), "--json", "-o", out] + flags, mpq_env))
                row[f"qat_{loss}"] = accuracy_ort(out, data["test"])
                row[f"qat_{loss}_epoch_s"] = res["seconds_per_epoch"]
                if args.torch_python:
                    fq = os.path.join(work, f"{setting}.fakequant.onnx")
                    run([args.mpq, "quantize", model, "--calib", table, "--format", "fakequant", "-o", fq] + flags)
                    t = json.loads(run([args.torch_python, "-c", TORCH_SIDE, ROOT, fq, model, data["train"], data["test"],
                                        loss, str(args.epochs), str(args.batch), str(args.lr), str(args.threads)],
                                       env).strip().splitlines()[-1])
                    row[f"torch_{loss}"] = t["accuracy"]
                    row[f"torch_{loss}_epoch_s"] = t["seconds_per_epoch"]
                print(f"  {setting} {loss}: " + ", ".join(f"{k} {v:.4f}" for k, v in row.items() if isinstance(v, float)),
                      flush=True)
            rows.append(row)
    # The goals, evaluated.
    print("\nmodel              setting   FP32    PTQ     QAT-distill QAT-ce  torch-distill torch-ce  epoch s (mpq/torch)")
    for r in rows:
        def p(k):
            return f"{100 * r[k]:6.2f}" if k in r else "   -  "
        ep = "/".join(f"{r.get(f'qat_{l}_epoch_s', 0):.0f}" + (f":{r[f'torch_{l}_epoch_s']:.0f}" if f"torch_{l}_epoch_s" in r else "")
                      for l in args.losses.split(","))
        print(f"{r['model']:18s} {r['setting']:8s} {p('fp32')}  {p('ptq')}  {p('qat_distill')}      {p('qat_ce')}  "
              f"{p('torch_distill')}        {p('torch_ce')}    {ep}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "epochs": args.epochs, "lr": args.lr, "batch": args.batch, "threads": args.threads}, f, indent=2)


if __name__ == "__main__":
    main()
