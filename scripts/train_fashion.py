#!/usr/bin/env python3
"""Train three small Fashion-MNIST classifiers on the CPU and export them to ONNX.

Writes to tests/models/fashion/ (opset 13, input `input` float32 [N,1,28,28], output `logits`
[N,10], N dynamic):

  fashion_resnet.onnx     ResNet-style CNN with BatchNorm (kept as BatchNormalization nodes)
  fashion_mobilenet.onnx  MobileNet-style: depthwise convs, HardSwish, squeeze-excite (BN folded)
  fashion_vit.onnx        small ViT: 7x7 patches, dim 64, LayerNorm, exact GELU, softmax attention
  <name>.pt               the PyTorch state_dict, when under 1 MB (for PyTorch peer benchmarks;
                          rebuild the module with build_model(name) from this file)
  accuracy.json           test accuracy of each model, measured in ONNX Runtime on all 10,000
                          test images, plus training details

and the shipped demo data under calib_data/ (see calib_data/README.md):

  calib_data/calib/images.npy  float32 [128,1,28,28]  first 128 training images after a seeded shuffle
  calib_data/eval/images.npy   float32 [1000,1,28,28] first 1000 test images
  calib_data/eval/labels.npy   int64 [1000]
  calib_data/demo.onnx         copy of fashion_resnet.onnx

Preprocessing: x / 255, then (x - 0.2860) / 0.3530 (scripts/fashion_data.py).

Usage: python scripts/train_fashion.py [--only resnet,mobilenet,vit] [--skip-data]
Each model trains in a few minutes on 2 CPU threads; the whole script takes about 15 minutes.
"""

import argparse
import io
import json
import math
import os
import shutil
import sys
import time
import warnings

# Passive OpenMP waiting: spinning threads make training many times slower when the cores are shared
# with other work (e.g. a parallel C++ build); it costs little on an idle machine.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fashion_data  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPSET = 13
CALIB_SHUFFLE_SEED = 0
CALIB_COUNT = 128
EVAL_COUNT = 1000
MAX_STATE_DICT_BYTES = 1024 * 1024


# --------------------------------------------------------------------------------------------------
# Models (importable: `from train_fashion import build_model`)
# --------------------------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class FashionResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layer1 = BasicBlock(16, 16, 1)    # 28x28
        self.layer2 = BasicBlock(16, 32, 2)    # 14x14
        self.layer3 = BasicBlock(32, 64, 2)    # 7x7
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


class SqueezeExcite(nn.Module):
    def __init__(self, c, squeeze):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(c, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, c, 1)

    def forward(self, x):
        return x * F.hardsigmoid(self.fc2(F.relu(self.fc1(self.pool(x)))))


class InvertedResidual(nn.Module):
    def __init__(self, cin, cexp, cout, k, stride, se, act):
        super().__init__()
        layers = []
        if cexp != cin:
            layers += [nn.Conv2d(cin, cexp, 1, bias=False), nn.BatchNorm2d(cexp), act()]
        layers += [nn.Conv2d(cexp, cexp, k, stride, k // 2, groups=cexp, bias=False), nn.BatchNorm2d(cexp), act()]
        if se:
            layers.append(SqueezeExcite(cexp, max(8, cexp // 4)))
        layers += [nn.Conv2d(cexp, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.block(x)
        return x + y if self.residual else y


class FashionMobileNet(nn.Module):
    def __init__(self):
        super().__init__()
        HS, RE = nn.Hardswish, nn.ReLU
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), HS())  # 28x28
        self.blocks = nn.Sequential(
            InvertedResidual(16, 16, 16, 3, 2, True, RE),    # 14x14, depthwise separable
            InvertedResidual(16, 64, 24, 3, 1, False, RE),
            InvertedResidual(24, 72, 24, 3, 1, False, RE),   # residual
            InvertedResidual(24, 96, 40, 5, 2, True, HS),    # 7x7
            InvertedResidual(40, 120, 40, 5, 1, True, HS),   # residual
        )
        self.head = nn.Sequential(nn.Conv2d(40, 128, 1, bias=False), nn.BatchNorm2d(128), HS())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.head(self.blocks(self.stem(x)))), 1))


class Attention(nn.Module):
    """Multi-head self-attention with explicit MatMul/Softmax (exports as plain ONNX ops)."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * self.scale, dim=-1)
        return self.proj(torch.matmul(att, v).transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, dim, heads, mlp_dim):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(approximate="none"), nn.Linear(mlp_dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class FashionViT(nn.Module):
    def __init__(self, patch=7, dim=64, depth=4, heads=4, mlp_dim=128):
        super().__init__()
        tokens = (28 // patch) ** 2
        self.embed = nn.Conv2d(1, dim, patch, patch)          # patchify + linear projection
        self.pos = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(dim, heads, mlp_dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2) + self.pos   # [N, tokens, dim]
        x = self.norm(self.blocks(x))
        return self.head(x.mean(dim=1))


# name -> constructor, seed, training settings and ONNX export training mode.
#   PRESERVE on an eval-mode model keeps BatchNormalization nodes; EVAL folds BN into the convs.
CONFIGS = {
    "resnet": dict(cls=FashionResNet, seed=100, epochs=4, lr=4e-3, wd=5e-4, batch=256, flip=False,
                   export_mode=torch.onnx.TrainingMode.PRESERVE),
    "mobilenet": dict(cls=FashionMobileNet, seed=101, epochs=4, lr=4e-3, wd=5e-4, batch=256, flip=False,
                      export_mode=torch.onnx.TrainingMode.EVAL),
    "vit": dict(cls=FashionViT, seed=102, epochs=15, lr=2e-3, wd=0.05, batch=256, flip=True,
                export_mode=torch.onnx.TrainingMode.EVAL),
}


def build_model(name):
    """A fresh (untrained) module for 'resnet', 'mobilenet' or 'vit' (also 'fashion_resnet', ...)."""
    return CONFIGS[name.removeprefix("fashion_")]["cls"]()


# --------------------------------------------------------------------------------------------------
# Training and evaluation
# --------------------------------------------------------------------------------------------------


def train(model, cfg, x_train, y_train, seed):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    n = x_train.shape[0]
    steps_per_epoch = n // cfg["batch"]
    total = steps_per_epoch * cfg["epochs"]
    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.ndim > 1 else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["wd"]},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg["lr"])
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg["lr"], total_steps=total, pct_start=0.15)
    model.train()
    t0 = time.time()
    for epoch in range(cfg["epochs"]):
        perm = torch.randperm(n, generator=gen)
        loss_sum, correct = 0.0, 0
        for s in range(steps_per_epoch):
            idx = perm[s * cfg["batch"]:(s + 1) * cfg["batch"]]
            xb, yb = x_train[idx], y_train[idx]
            if cfg["flip"]:                                               # random horizontal flip
                flip = torch.rand(xb.shape[0], generator=gen) < 0.5
                xb = torch.where(flip[:, None, None, None], xb.flip(-1), xb)
            out = model(xb)
            loss = F.cross_entropy(out, yb, label_smoothing=0.05)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += loss.item()
            correct += (out.argmax(1) == yb).sum().item()
        seen = steps_per_epoch * cfg["batch"]
        print(f"    epoch {epoch + 1}/{cfg['epochs']}: loss {loss_sum / steps_per_epoch:.4f}, "
              f"train acc {correct / seen:.4f}, {time.time() - t0:.0f} s", flush=True)
    model.eval()
    return time.time() - t0


def export(model, path, mode):
    model.eval()
    torch.onnx.export(
        model, (torch.zeros(2, 1, 28, 28),), path,
        dynamo=False, opset_version=OPSET,
        input_names=["input"], output_names=["logits"],
        dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}},
        do_constant_folding=True, training=mode,
    )
    onnx.checker.check_model(path, full_check=True)


def ort_accuracy(path, x, y, batch=1000):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    logits = np.concatenate([sess.run(["logits"], {"input": x[i:i + batch]})[0] for i in range(0, len(x), batch)])
    return float((logits.argmax(1) == y).mean()), logits


def torch_logits(model, x, batch=1000):
    with torch.no_grad():
        return np.concatenate([model(torch.from_numpy(x[i:i + batch])).numpy() for i in range(0, len(x), batch)])


def op_counts(path):
    counts = {}
    for n in onnx.load(path).graph.node:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return dict(sorted(counts.items()))


# --------------------------------------------------------------------------------------------------


def write_demo_data(calib_dir, out_models):
    os.makedirs(os.path.join(calib_dir, "calib"), exist_ok=True)
    os.makedirs(os.path.join(calib_dir, "eval"), exist_ok=True)
    xc, _ = fashion_data.load("train", count=CALIB_COUNT, shuffle_seed=CALIB_SHUFFLE_SEED)
    np.save(os.path.join(calib_dir, "calib", "images.npy"), xc)
    xe, ye = fashion_data.load("test", count=EVAL_COUNT)
    np.save(os.path.join(calib_dir, "eval", "images.npy"), xe)
    np.save(os.path.join(calib_dir, "eval", "labels.npy"), ye)
    src = os.path.join(out_models, "fashion_resnet.onnx")
    if os.path.exists(src):
        shutil.copyfile(src, os.path.join(calib_dir, "demo.onnx"))
    print(f"  demo data: calib {list(xc.shape)}, eval {list(xe.shape)} + labels {list(ye.shape)}"
          + (", demo.onnx" if os.path.exists(src) else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "models", "fashion"))
    ap.add_argument("--calib-dir", default=os.path.join(REPO, "calib_data"))
    ap.add_argument("--only", default="resnet,mobilenet,vit", help="comma-separated subset of models")
    ap.add_argument("--epochs", type=int, default=None, help="override every model's epoch count")
    ap.add_argument("--skip-data", action="store_true", help="do not write calib_data/")
    args = ap.parse_args()
    torch.set_num_threads(2)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*constant folding.*")
    os.makedirs(args.out, exist_ok=True)

    x_train, y_train = fashion_data.load("train")
    x_test, y_test = fashion_data.load("test")
    xt, yt = torch.from_numpy(x_train), torch.from_numpy(y_train)

    acc_path = os.path.join(args.out, "accuracy.json")
    results = {}
    if os.path.exists(acc_path):
        with open(acc_path) as f:
            results = json.load(f)

    for name in (n.strip() for n in args.only.split(",") if n.strip()):
        cfg = dict(CONFIGS[name])
        seed = cfg["seed"]
        if args.epochs:
            cfg["epochs"] = args.epochs
        stem = f"fashion_{name}"
        torch.manual_seed(seed)
        model = cfg["cls"]()
        params = sum(p.numel() for p in model.parameters())
        print(f"{stem}: {params} parameters, {cfg['epochs']} epochs", flush=True)
        seconds = train(model, cfg, xt, yt, seed=seed)

        path = os.path.join(args.out, stem + ".onnx")
        export(model, path, cfg["export_mode"])
        acc, logits = ort_accuracy(path, x_test, y_test)
        ref = torch_logits(model, x_test)
        rel = float(np.linalg.norm(logits - ref) / np.linalg.norm(ref))
        torch_acc = float((ref.argmax(1) == y_test).mean())

        buf = io.BytesIO()
        torch.save(model.state_dict(), buf)
        pt_path = os.path.join(args.out, stem + ".pt")
        if buf.tell() < MAX_STATE_DICT_BYTES:
            with open(pt_path, "wb") as f:
                f.write(buf.getvalue())
        elif os.path.exists(pt_path):
            os.remove(pt_path)
        results[stem] = {
            "onnx": stem + ".onnx",
            "test_accuracy": round(acc, 4),
            "test_images": int(len(y_test)),
            "evaluated_with": f"onnxruntime {ort.__version__} CPUExecutionProvider",
            "torch_test_accuracy": round(torch_acc, 4),
            "ort_vs_torch_rel_l2": float(f"{rel:.3g}"),
            "parameters": params,
            "epochs": cfg["epochs"],
            "seed": seed,
            "train_seconds": round(seconds, 1),
            "state_dict": (stem + ".pt") if buf.tell() < MAX_STATE_DICT_BYTES else None,
            "ops": op_counts(path),
        }
        print(f"  {stem}.onnx: {os.path.getsize(path) / 1024:.1f} KiB, ORT test accuracy {acc:.4f} "
              f"(torch {torch_acc:.4f}, rel-L2 {rel:.2e}), state_dict {buf.tell() / 1024:.1f} KiB", flush=True)
        with open(acc_path, "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")

    if not args.skip_data:
        write_demo_data(args.calib_dir, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
