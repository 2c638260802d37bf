#!/usr/bin/env python3
"""Generate the small random-weight test models under tests/models/.

Every model is built with a fixed seed, so reruns give the same weights. The PyTorch models are
exported with the TorchScript exporter (dynamo=False) so the graphs hold plain ONNX ops, each at
opset 13 and opset 17, with a dynamic batch dimension named "N". Two more models are written by hand
with the onnx helper API:

  conv_bn_unfused.onnx  Conv -> BatchNormalization -> Relu -> Conv -> BatchNormalization, [1,3,16,16]
  fp16_overflow.onnx    MatMul -> hand-written LayerNorm -> MatMul whose variance path overflows
                        float16 (x - mean squared exceeds 65504); opset 13

For each model <stem>.onnx a small input set is written beside it in <stem>_data/feed_<k>/<input>.npy
(the data-directory layout of docs/DESIGN: one subfolder per feed).

After export each model goes through onnx.checker (full check) and ONNX Runtime, and ORT's output is
compared with PyTorch's.

Usage: python scripts/make_models.py [--out tests/models]
Needs: scripts/requirements.txt and scripts/requirements-torch.txt.
"""

import argparse
import os
import shutil
import sys
import warnings
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_MODEL_BYTES = 2 * 1024 * 1024


# --------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------


def randomize_norms(model, gen):
    """Give every BatchNorm / LayerNorm non-trivial statistics and affine parameters, so that a
    mishandled scale, bias, mean or variance shows in the output."""
    for m in model.modules():
        if isinstance(m, nn.LayerNorm):
            with torch.no_grad():
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            with torch.no_grad():
                m.weight.copy_(torch.rand(c, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(c, generator=gen) * 0.1)
                m.running_mean.copy_(torch.randn(c, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(c, generator=gen) + 0.5)


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
        s = x if self.down is None else self.down(x)
        return F.relu(y + s)


class ResNetBN(nn.Module):
    """Conv+BN+ReLU stem, residual blocks (one strided downsample each stage), GAP, linear head."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layer1 = BasicBlock(16, 16, 1)
        self.layer2 = BasicBlock(16, 32, 2)
        self.layer3 = BasicBlock(32, 64, 2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        x = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


class SqueezeExcite(nn.Module):
    """AdaptiveAvgPool -> 1x1 conv -> ReLU -> 1x1 conv -> hardsigmoid -> Mul."""

    def __init__(self, c, squeeze):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(c, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, c, 1)

    def forward(self, x):
        s = self.fc2(F.relu(self.fc1(self.pool(x))))
        return x * F.hardsigmoid(s)


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


class MobileNetV3Small(nn.Module):
    """A cut-down MobileNetV3: depthwise separable convs, HardSwish, SE with hardsigmoid."""

    def __init__(self, num_classes=10):
        super().__init__()
        HS, RE = nn.Hardswish, nn.ReLU
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), HS())
        self.blocks = nn.Sequential(
            InvertedResidual(16, 16, 16, 3, 1, True, RE),   # depthwise separable, residual
            InvertedResidual(16, 48, 24, 3, 2, False, RE),
            InvertedResidual(24, 72, 24, 3, 1, False, RE),  # residual
            InvertedResidual(24, 72, 40, 5, 2, True, HS),
            InvertedResidual(40, 120, 40, 5, 1, True, HS),  # residual
        )
        self.head = nn.Sequential(nn.Conv2d(40, 96, 1, bias=False), nn.BatchNorm2d(96), HS())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(96, 128), HS(), nn.Linear(128, num_classes))

    def forward(self, x):
        x = self.pool(self.head(self.blocks(self.stem(x))))
        return self.classifier(torch.flatten(x, 1))


class SelfAttention(nn.Module):
    """Multi-head self-attention written with MatMul/Softmax so it exports as plain ONNX ops."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]                      # [b, heads, t, head_dim]
        att = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * self.scale, dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, t, c)
        return self.proj(y)


class EncoderLayer(nn.Module):
    def __init__(self, dim, heads, mlp_dim):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(approximate="none"), nn.Linear(mlp_dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyTransformer(nn.Module):
    """Pre-LN transformer encoder over [N, 16, 64] token embeddings, mean-pool, linear head."""

    def __init__(self, tokens=16, dim=64, heads=4, layers=2, mlp_dim=128, num_classes=10):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
        self.layers = nn.Sequential(*[EncoderLayer(dim, heads, mlp_dim) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.norm(self.layers(x + self.pos))
        return self.head(x.mean(dim=1))


def conv_relu(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, 1, 1), nn.ReLU(), nn.Conv2d(cout, cout, 3, 1, 1), nn.ReLU())


class TinyUNet(nn.Module):
    """Two-level U-Net: ConvTranspose on the lower up-step, bilinear Upsample (Resize) on the upper."""

    def __init__(self, out_ch=2):
        super().__init__()
        self.enc1 = conv_relu(3, 16)                         # 32x32
        self.enc2 = conv_relu(16, 32)                        # 16x16
        self.bottleneck = conv_relu(32, 64)                  # 8x8
        self.up2 = nn.ConvTranspose2d(64, 32, 2, stride=2)   # 8 -> 16
        self.dec2 = conv_relu(64, 32)
        self.up1 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)  # 16 -> 32
        self.up1_conv = nn.Conv2d(32, 16, 1)
        self.dec1 = conv_relu(32, 16)
        self.out = nn.Conv2d(16, out_ch, 1)

    def forward(self, x):
        s1 = self.enc1(x)
        s2 = self.enc2(F.max_pool2d(s1, 2))
        b = self.bottleneck(F.max_pool2d(s2, 2))
        d2 = self.dec2(torch.cat([self.up2(b), s2], dim=1))
        d1 = self.dec1(torch.cat([self.up1_conv(self.up1(d2)), s1], dim=1))
        return self.out(d1)


# --------------------------------------------------------------------------------------------------
# Export and checks
# --------------------------------------------------------------------------------------------------


def op_types(model):
    counts = Counter(n.op_type for n in model.graph.node)
    return ", ".join(f"{k}x{v}" if v > 1 else k for k, v in sorted(counts.items()))


def write_feeds(data_dir, input_name, shapes, seed):
    """feed_<k>/<input_name>.npy for each shape, seeded standard-normal float32."""
    if os.path.isdir(data_dir):
        shutil.rmtree(data_dir)
    rng = np.random.default_rng(seed)
    feeds = []
    for k, shape in enumerate(shapes):
        d = os.path.join(data_dir, f"feed_{k}")
        os.makedirs(d)
        x = rng.standard_normal(shape).astype(np.float32)
        np.save(os.path.join(d, f"{input_name}.npy"), x)
        feeds.append(x)
    return feeds


def ort_session(path):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 2
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def check_model(path, feeds, input_name, torch_fn=None, rtol_l2=1e-4):
    """Full onnx.checker, ORT load + run on the feeds, and (if given) agreement with PyTorch."""
    size = os.path.getsize(path)
    if size >= MAX_MODEL_BYTES:
        raise SystemExit(f"{path}: {size} bytes, over the {MAX_MODEL_BYTES} limit")
    onnx.checker.check_model(path, full_check=True)
    model = onnx.load(path)
    sess = ort_session(path)
    worst = 0.0
    for x in feeds:
        (y,) = sess.run(None, {input_name: x})
        if not np.all(np.isfinite(y)):
            raise SystemExit(f"{path}: non-finite ORT output")
        if torch_fn is not None:
            ref = torch_fn(x)
            rel = np.linalg.norm(y - ref) / max(np.linalg.norm(ref), 1e-12)
            worst = max(worst, rel)
            if rel > rtol_l2:
                raise SystemExit(f"{path}: ORT vs PyTorch rel-L2 {rel:.3g} > {rtol_l2}")
    out_shape = [d.dim_param or d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    print(f"  {os.path.basename(path)}: {size / 1024:.1f} KiB, opset "
          f"{model.opset_import[0].version}, output {model.graph.output[0].name} {out_shape}, "
          f"ORT vs reference rel-L2 {worst:.2e}")
    print(f"    ops: {op_types(model)}")
    return model


def export_torch(model, name, example, out_dir, training_mode, feed_shapes, seed):
    """Export at opsets 13 and 17 with a dynamic batch dim N, write feeds, run checks."""
    model.eval()
    for opset in (13, 17):
        stem = f"{name}_op{opset}"
        path = os.path.join(out_dir, stem + ".onnx")
        torch.onnx.export(
            model, (example,), path,
            dynamo=False,
            opset_version=opset,
            input_names=["input"],
            output_names=["output"],
            dynamic_axes={"input": {0: "N"}, "output": {0: "N"}},
            do_constant_folding=True,
            training=training_mode,
        )
        feeds = write_feeds(os.path.join(out_dir, stem + "_data"), "input", feed_shapes, seed)

        def torch_fn(x):
            with torch.no_grad():
                return model(torch.from_numpy(x)).numpy()

        check_model(path, feeds, "input", torch_fn)


# --------------------------------------------------------------------------------------------------
# Hand-built models
# --------------------------------------------------------------------------------------------------


def make_conv_bn_unfused(out_dir, seed=7):
    """Conv -> BatchNormalization -> Relu -> Conv -> BatchNormalization, input [1,3,16,16], opset 13."""
    rng = np.random.default_rng(seed)
    f32 = np.float32

    def bn_params(prefix, c):
        return [
            numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(f32), prefix + ".scale"),
            numpy_helper.from_array((rng.standard_normal(c) * 0.1).astype(f32), prefix + ".bias"),
            numpy_helper.from_array((rng.standard_normal(c) * 0.1).astype(f32), prefix + ".mean"),
            numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(f32), prefix + ".var"),
        ]

    inits = [
        numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.2).astype(f32), "conv1.weight"),
        numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(f32), "conv1.bias"),
        *bn_params("bn1", 8),
        numpy_helper.from_array((rng.standard_normal((4, 8, 3, 3)) * 0.12).astype(f32), "conv2.weight"),
        *bn_params("bn2", 4),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "conv1.weight", "conv1.bias"], ["c1"], name="conv1",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn1.scale", "bn1.bias", "bn1.mean", "bn1.var"],
                         ["b1"], name="bn1", epsilon=1e-5),
        helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
        # second conv without bias: folding BN must create one
        helper.make_node("Conv", ["r1", "conv2.weight"], ["c2"], name="conv2",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c2", "bn2.scale", "bn2.bias", "bn2.mean", "bn2.var"],
                         ["output"], name="bn2", epsilon=1e-3),
    ]
    graph = helper.make_graph(
        nodes, "conv_bn_unfused",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4, 8, 8])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="mpq/scripts/make_models.py")
    model.ir_version = 8
    path = os.path.join(out_dir, "conv_bn_unfused.onnx")
    onnx.save(model, path)
    feeds = write_feeds(os.path.join(out_dir, "conv_bn_unfused_data"), "input", [(1, 3, 16, 16)] * 3, seed)

    def numpy_ref(x):
        w = {t.name: numpy_helper.to_array(t) for t in inits}

        def conv(x, wt, b, stride):
            n, c, h, ww = x.shape
            o, _, kh, kw = wt.shape
            xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
            ho, wo = (h + 2 - kh) // stride + 1, (ww + 2 - kw) // stride + 1
            y = np.zeros((n, o, ho, wo), np.float64)
            for i in range(kh):
                for j in range(kw):
                    patch = xp[:, :, i:i + stride * ho:stride, j:j + stride * wo:stride]
                    y += np.einsum("nchw,oc->nohw", patch, wt[:, :, i, j])
            return y if b is None else y + b[None, :, None, None]

        def bn(x, p, eps):
            s = w[p + ".scale"] / np.sqrt(w[p + ".var"] + eps)
            return (x - w[p + ".mean"][None, :, None, None]) * s[None, :, None, None] + w[p + ".bias"][None, :, None, None]

        y = np.maximum(bn(conv(x, w["conv1.weight"], w["conv1.bias"], 1), "bn1", 1e-5), 0)
        return bn(conv(y, w["conv2.weight"], None, 2), "bn2", 1e-3).astype(np.float32)

    check_model(path, feeds, "input", numpy_ref)


def layernorm_fp16_check(y, gamma, beta):
    """Simulate the hand-written LayerNorm in float16 and float32; return a description."""
    h = y.astype(np.float16)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        mean16 = h.mean(axis=-1, keepdims=True, dtype=np.float16)
        d16 = h - mean16
        sq16 = d16 * d16                       # Pow(d, 2) in float16
        var16 = sq16.mean(axis=-1, keepdims=True, dtype=np.float16)
        ln16 = d16 / np.sqrt(var16 + np.float16(1e-5)) * gamma.astype(np.float16) + beta.astype(np.float16)
    d32 = y - y.mean(axis=-1, keepdims=True)
    return {
        "max |y|": float(np.abs(y).max()),
        "max (y-mean)^2 (fp32)": float((d32 * d32).max()),
        "var (fp32)": float((d32 * d32).mean()),
        "inf in (y-mean)^2 (fp16)": int(np.isinf(sq16).sum()),
        "var fp16": float(var16.ravel()[0]),
        "LN outputs != beta (fp16)": int(np.count_nonzero(np.isfinite(ln16) & (ln16 != beta.astype(np.float16)))),
    }


def make_fp16_overflow(out_dir, seed=11):
    """MatMul (activations ~ +-300) -> LayerNorm written out by hand -> MatMul to 10 outputs.

    Inputs are ~N(0, 200^2). The first MatMul's weights are N(0, 0.25^2), so its outputs have a
    standard deviation of ~400 (mean |y| ~ 320): many (y - mean)^2 terms are above 65504 and the
    float16 Pow gives +inf; the variance itself (~1.6e5) is above 65504 too, so it overflows even
    where the reduction accumulates in float32. The float16 variance is inf, the normalised values
    collapse to 0 and every LayerNorm output equals beta. See the check printed by this script.

    Note: ONNX Runtime's CPU execution provider has no float16 kernels for most of these ops and
    inserts Casts to float32 around them (even with ORT_DISABLE_ALL), so a float16 copy of this
    model run on ORT CPU does NOT overflow; the overflow shows on a true float16 executor.
    """
    rng = np.random.default_rng(seed)
    f32 = np.float32
    d, classes = 64, 10
    # x ~ N(0, 200^2): y_j = sum_i x_i w_ij has std 200 * sqrt(64) * w_std = 1600 * w_std.
    # w_std = 0.25 gives std(y) ~ 400, mean |y| ~ 320.
    w1 = (rng.standard_normal((d, d)) * 0.25).astype(f32)
    b1 = (rng.standard_normal(d) * 10.0).astype(f32)
    gamma = rng.uniform(0.5, 1.5, d).astype(f32)
    beta = (rng.standard_normal(d) * 0.1).astype(f32)
    w2 = (rng.standard_normal((d, classes)) * (1.0 / np.sqrt(d))).astype(f32)
    b2 = (rng.standard_normal(classes) * 0.1).astype(f32)
    inits = [
        numpy_helper.from_array(w1, "fc1.weight"), numpy_helper.from_array(b1, "fc1.bias"),
        numpy_helper.from_array(np.array(2.0, f32), "ln.pow_exponent"),
        numpy_helper.from_array(np.array(1e-5, f32), "ln.eps"),
        numpy_helper.from_array(gamma, "ln.gamma"), numpy_helper.from_array(beta, "ln.beta"),
        numpy_helper.from_array(w2, "fc2.weight"), numpy_helper.from_array(b2, "fc2.bias"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "fc1.weight"], ["fc1.mm"], name="fc1/MatMul"),
        helper.make_node("Add", ["fc1.mm", "fc1.bias"], ["h"], name="fc1/Add"),
        helper.make_node("ReduceMean", ["h"], ["ln.mean"], name="ln/ReduceMean", axes=[-1], keepdims=1),
        helper.make_node("Sub", ["h", "ln.mean"], ["ln.centered"], name="ln/Sub"),
        helper.make_node("Pow", ["ln.centered", "ln.pow_exponent"], ["ln.sq"], name="ln/Pow"),
        helper.make_node("ReduceMean", ["ln.sq"], ["ln.var"], name="ln/ReduceMean_1", axes=[-1], keepdims=1),
        helper.make_node("Add", ["ln.var", "ln.eps"], ["ln.var_eps"], name="ln/Add"),
        helper.make_node("Sqrt", ["ln.var_eps"], ["ln.std"], name="ln/Sqrt"),
        helper.make_node("Div", ["ln.centered", "ln.std"], ["ln.norm"], name="ln/Div"),
        helper.make_node("Mul", ["ln.norm", "ln.gamma"], ["ln.scaled"], name="ln/Mul"),
        helper.make_node("Add", ["ln.scaled", "ln.beta"], ["ln.out"], name="ln/Add_1"),
        helper.make_node("MatMul", ["ln.out", "fc2.weight"], ["fc2.mm"], name="fc2/MatMul"),
        helper.make_node("Add", ["fc2.mm", "fc2.bias"], ["logits"], name="fc2/Add"),
    ]
    graph = helper.make_graph(
        nodes, "fp16_overflow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, d])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="mpq/scripts/make_models.py")
    model.ir_version = 8
    path = os.path.join(out_dir, "fp16_overflow.onnx")
    onnx.save(model, path)

    data_dir = os.path.join(out_dir, "fp16_overflow_data")
    if os.path.isdir(data_dir):
        shutil.rmtree(data_dir)
    feeds = []
    for k in range(4):
        x = (rng.standard_normal((1, d)) * 200.0).astype(f32)
        os.makedirs(os.path.join(data_dir, f"feed_{k}"))
        np.save(os.path.join(data_dir, f"feed_{k}", "x.npy"), x)
        feeds.append(x)

    def numpy_ref(x):
        h = x.astype(np.float64) @ w1 + b1
        c = h - h.mean(-1, keepdims=True)
        ln = c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-5) * gamma + beta
        return (ln @ w2 + b2).astype(f32)

    check_model(path, feeds, "x", numpy_ref)

    # The float16 overflow this model exists to show: every feed must overflow the variance path.
    for k, x in enumerate(feeds):
        y = x @ w1 + b1
        info = layernorm_fp16_check(y, gamma, beta)
        print(f"    feed_{k}: " + ", ".join(f"{key} = {val:.6g}" if isinstance(val, float) else f"{key} = {val}"
                                          for key, val in info.items()))
        if not (info["max (y-mean)^2 (fp32)"] > 65504 and info["var (fp32)"] > 65504
                and info["inf in (y-mean)^2 (fp16)"] > 0 and not np.isfinite(info["var fp16"])):
            raise SystemExit(f"fp16_overflow feed_{k}: the float16 variance path does not overflow")


# --------------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "models"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(2)
    # The TorchScript exporter is deprecated (and warns about constant folding under PRESERVE,
    # which only matters for models in training mode; ours are in eval mode).
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*constant folding.*")

    img_feeds = [(1, 3, 32, 32), (1, 3, 32, 32), (3, 3, 32, 32)]
    tok_feeds = [(1, 16, 64), (1, 16, 64), (3, 16, 64)]
    example_img = torch.zeros(2, 3, 32, 32)

    # ResNet: training=PRESERVE on a model in eval mode exports inference-mode BatchNormalization
    # nodes. TrainingMode.EVAL with do_constant_folding=True always folds BN into the preceding Conv
    # (the exporter's eval peephole pass); PRESERVE skips that pass but still constant-folds.
    print("resnet_bn")
    torch.manual_seed(1)
    m = ResNetBN()
    randomize_norms(m, torch.Generator().manual_seed(101))
    export_torch(m, "resnet_bn", example_img, args.out, torch.onnx.TrainingMode.PRESERVE, img_feeds, 1)

    # MobileNetV3: exported with TrainingMode.EVAL, so its BatchNorms are folded into the convs.
    print("mobilenetv3")
    torch.manual_seed(2)
    m = MobileNetV3Small()
    randomize_norms(m, torch.Generator().manual_seed(102))
    export_torch(m, "mobilenetv3", example_img, args.out, torch.onnx.TrainingMode.EVAL, img_feeds, 2)

    print("transformer")
    torch.manual_seed(3)
    m = TinyTransformer()
    randomize_norms(m, torch.Generator().manual_seed(103))
    export_torch(m, "transformer", torch.zeros(2, 16, 64), args.out, torch.onnx.TrainingMode.EVAL, tok_feeds, 3)

    print("unet")
    torch.manual_seed(4)
    m = TinyUNet()
    export_torch(m, "unet", example_img, args.out, torch.onnx.TrainingMode.EVAL, img_feeds, 4)

    print("conv_bn_unfused (hand-built)")
    make_conv_bn_unfused(args.out)

    print("fp16_overflow (hand-built)")
    make_fp16_overflow(args.out)
    print("done")


if __name__ == "__main__":
    sys.exit(main())
