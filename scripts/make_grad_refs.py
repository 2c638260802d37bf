#!/usr/bin/env python3
"""Reference gradients of the shipped Fashion-MNIST models from PyTorch autograd, for mpq's
whole-model gradient test (tests/train/model_grad_test.cpp). Run once; CI needs no torch.

    /path/to/python-with-torch scripts/make_grad_refs.py

For each model the ONNX graph itself is evaluated in PyTorch (scripts/onnx_torch.py), in float64,
on the first 16 images of calib_data/eval with their labels; the loss is the mean cross-entropy.
Every float initializer that mpq trains by default gets a gradient (non-scalar float initializers
reaching a differentiable input, plus the weights and biases of Conv/Gemm/MatMul and normalisation
scales/shifts; BatchNorm running statistics never). Writes
tests/models/fashion/grad_refs/<model>_<mode>.ckpt in mpq's checkpoint format (train/checkpoint.h):
one float32 tensor "grad/<initializer>" per parameter, the input batch, the labels, and the loss in
the metadata. Modes: "eval" (BatchNorm frozen) for every model, "train" (batch statistics) for the
ResNet, the only one with BatchNormalization nodes.
"""
import json
import os
import struct
import sys

import numpy as np
import onnx
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from onnx_torch import OnnxTorch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "models", "fashion", "grad_refs")
BATCH = 16


def fnv1a(h, data):
    for b in data:
        h ^= b
        h = (h * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def write_checkpoint(path, tensors, meta):
    """mpq's checkpoint layout: magic, u64 header length, JSON header, 64-byte aligned tensor bytes."""
    names = sorted(tensors)
    entries, blobs, offset, checksum = [], [], 0, 14695981039346656037
    dtype_names = {np.dtype(np.float32): "float32", np.dtype(np.int64): "int64"}
    for n in names:
        a = np.ascontiguousarray(tensors[n])
        raw = a.tobytes()
        entries.append({"name": n, "dtype": dtype_names[a.dtype], "shape": list(a.shape), "offset": offset, "bytes": len(raw)})
        checksum = fnv1a(checksum, raw)
        pad = (-len(raw)) % 64
        blobs.append(raw + b"\0" * pad)
        offset += len(raw) + pad
    header = json.dumps({"meta": meta, "tensors": entries, "checksum": str(checksum)}).encode()
    with open(path + ".tmp", "wb") as f:
        f.write(b"MPQCKPT1" + struct.pack("<Q", len(header)) + header + b"".join(blobs))
    os.replace(path + ".tmp", path)


def trainable(model):
    """mpq's default selection (train/autograd.cpp default_trainable) for these graphs."""
    weight_slots = {"Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (1, 2), "MatMul": (0, 1),
                    "BatchNormalization": (1, 2), "LayerNormalization": (1, 2)}
    non_diff = {"BatchNormalization": (3, 4), "Pow": (1,), "Reshape": (1,), "Slice": (1, 2, 3, 4),
                "Unsqueeze": (1,), "Gather": (1,), "Clip": (1, 2)}
    floats = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer
              if i.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)}
    names = []
    for name, value in floats.items():
        use = 0
        for n in model.graph.node:
            for k, inp in enumerate(n.input):
                if inp != name or k in non_diff.get(n.op_type, ()):
                    continue
                use = max(use, 2 if k in weight_slots.get(n.op_type, ()) else 1)
                if n.op_type == "Identity":  # look through (the resnet's deduplicated BN biases)
                    for m in model.graph.node:
                        for kk, i2 in enumerate(m.input):
                            if i2 == n.output[0] and kk in weight_slots.get(m.op_type, ()):
                                use = 2
        if use == 2 or (use == 1 and value.size > 1):
            names.append(name)
    return names


def main():
    torch.set_grad_enabled(True)
    os.makedirs(OUT, exist_ok=True)
    images = np.load(os.path.join(ROOT, "calib_data", "eval", "images.npy"))[:BATCH]
    labels = np.load(os.path.join(ROOT, "calib_data", "eval", "labels.npy"))[:BATCH].astype(np.int64)
    for name, modes in (("fashion_resnet", ("eval", "train")), ("fashion_mobilenet", ("eval",)), ("fashion_vit", ("eval",))):
        model = onnx.load(os.path.join(ROOT, "tests", "models", "fashion", name + ".onnx"))
        names = trainable(model)
        for mode in modes:
            g = OnnxTorch(model)
            g.init = {k: (v.double() if v.is_floating_point() else v) for k, v in g.init.items()}
            params = g.parameters(names)
            for p in params.values():
                p.data = p.data.double()
            if mode == "train":  # running statistics are updated in place; keep the originals intact
                g.init = {k: v.clone() for k, v in g.init.items()}
            logits = g.run({"input": torch.from_numpy(images).double()}, training=(mode == "train"))[0]
            loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(labels))
            loss.backward()
            tensors = {"input": images.astype(np.float32), "labels": labels}
            for n, p in params.items():
                if p.grad is None:
                    raise SystemExit(f"{name}: parameter {n} got no gradient")
                tensors["grad/" + n] = p.grad.numpy().astype(np.float32)
            meta = {"model": name, "mode": mode, "loss": float(loss.item()), "batch": BATCH,
                    "parameters": names, "torch": torch.__version__}
            path = os.path.join(OUT, f"{name}_{mode}.ckpt")
            write_checkpoint(path, tensors, meta)
            print(f"{path}: loss {loss.item():.6f}, {len(names)} parameters, "
                  f"{sum(t.nbytes for t in tensors.values()) / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
