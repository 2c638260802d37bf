"""A small ONNX interpreter on PyTorch tensors, so that PyTorch autograd can differentiate an ONNX
graph exactly as written (weights are the ONNX initializers, folded BatchNorm stays folded, MatMul
weights stay transposed as the exporter stored them). Used to produce reference gradients
(make_grad_refs.py) and the PyTorch side of the QAT and training benchmarks. Covers the ops of
mpq's test and Fashion-MNIST models; anything else raises NotImplementedError naming the op.

    graph = OnnxTorch(onnx.load(path))
    params = graph.parameters(trainable_names)   # dict name -> torch.nn.Parameter
    outputs = graph.run({"input": x}, training=False)
"""
import numpy as np
import onnx
import onnx.numpy_helper as nh
import torch
import torch.nn.functional as F


def _attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


class OnnxTorch:
    def __init__(self, model, device="cpu", half=False):
        """device: where the initializers (and every tensor the graph makes) live, e.g. "cuda".
        half: FP16 initializers (floating ones), for PyTorch's FP16 inference latency."""
        self.model = model
        self.device = torch.device(device)
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        self.init = {i.name: self._place(torch.from_numpy(nh.to_array(i).copy()), half) for i in model.graph.initializer}
        self.params = {}
        # name -> function of the parameter giving the value the graph uses (e.g. exp of a log-scale)
        self.param_transform = {}
        # Hooks: called with (node, inputs, outputs) after each node (e.g. fake quantization).
        self.after_node = None
        self.input_hook = None  # (node, index, tensor) -> tensor, applied to each node input

    def _place(self, t, half=False):
        t = t.to(self.device)
        return t.half() if half and t.is_floating_point() else t

    def parameters(self, names):
        for n in names:
            t = self.init[n]
            self.params[n] = torch.nn.Parameter(t.clone().float() if t.is_floating_point() else t.clone())
        return self.params

    def run(self, feeds, training=False, bn_momentum_updates=False):
        env = dict(self.init)
        env.update({k: self.param_transform[k](p) if k in self.param_transform else p for k, p in self.params.items()})
        env.update({k: (v if isinstance(v, torch.Tensor) else torch.from_numpy(v)).to(self.device) for k, v in feeds.items()})
        for node in self.model.graph.node:
            ins = [env[i] if i else None for i in node.input]
            if self.input_hook:
                ins = [self.input_hook(node, k, t) if t is not None else None for k, t in enumerate(ins)]
            outs = self._op(node, ins, training)
            if not isinstance(outs, (list, tuple)):
                outs = [outs]
            if self.after_node:
                outs = self.after_node(node, ins, list(outs))
            for name, t in zip(node.output, outs):
                if name:
                    env[name] = t
        return [env[o.name] for o in self.model.graph.output]

    def _op(self, node, x, training):
        a = _attrs(node)
        op = node.op_type
        if op == "Constant":
            return torch.from_numpy(nh.to_array(a["value"]).copy()).to(self.device)
        if op == "Identity":
            return x[0]
        if op in ("Conv", "ConvTranspose"):
            k = x[1].dim() - 2
            pads = a.get("pads", [0] * 2 * k)
            strides = a.get("strides", [1] * k)
            dil = a.get("dilations", [1] * k)
            group = a.get("group", 1)
            if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
                raise NotImplementedError("auto_pad")
            if op == "Conv":
                inp = x[0]
                if pads[:k] != pads[k:]:
                    pad = []
                    for d in reversed(range(k)):
                        pad += [pads[d], pads[k + d]]
                    inp, pads = F.pad(inp, pad), [0] * 2 * k
                fn = F.conv1d if k == 1 else F.conv2d
                return fn(inp, x[1], x[2] if len(x) > 2 else None, strides, pads[:k], dil, group)
            fn = F.conv_transpose1d if k == 1 else F.conv_transpose2d
            return fn(x[0], x[1], x[2] if len(x) > 2 else None, strides, pads[:k], a.get("output_padding", [0] * k), group, dil)
        if op == "BatchNormalization":
            mom = 1.0 - a.get("momentum", 0.9)
            return F.batch_norm(x[0], x[3], x[4], x[1], x[2], training=training, momentum=mom, eps=a.get("epsilon", 1e-5))
        if op == "LayerNormalization":
            axis = a.get("axis", -1)
            shape = x[0].shape[axis:]
            return F.layer_norm(x[0], shape, x[1], x[2] if len(x) > 2 else None, a.get("epsilon", 1e-5))
        if op == "Relu":
            return F.relu(x[0])
        if op == "LeakyRelu":
            return F.leaky_relu(x[0], a.get("alpha", 0.01))
        if op == "Sigmoid":
            return torch.sigmoid(x[0])
        if op == "Tanh":
            return torch.tanh(x[0])
        if op == "HardSigmoid":
            return torch.clamp(a.get("alpha", 0.2) * x[0] + a.get("beta", 0.5), 0, 1)
        if op == "HardSwish":
            return F.hardswish(x[0])
        if op == "Clip":
            lo = x[1] if len(x) > 1 and x[1] is not None else None
            hi = x[2] if len(x) > 2 and x[2] is not None else None
            return torch.clamp(x[0], lo, hi)
        if op == "Erf":
            return torch.erf(x[0])
        if op == "Sqrt":
            return torch.sqrt(x[0])
        if op == "Add":
            return x[0] + x[1]
        if op == "Sub":
            return x[0] - x[1]
        if op == "Mul":
            return x[0] * x[1]
        if op == "Div":
            if not x[0].is_floating_point():
                return torch.div(x[0], x[1], rounding_mode="trunc")
            return x[0] / x[1]
        if op == "Pow":
            return torch.pow(x[0], x[1])
        if op == "GlobalAveragePool":
            return x[0].mean(dim=tuple(range(2, x[0].dim())), keepdim=True)
        if op in ("MaxPool", "AveragePool"):
            k = a["kernel_shape"]
            pads = a.get("pads", [0] * 2 * len(k))
            if op == "MaxPool":
                return F.max_pool2d(x[0], k, a.get("strides", k), pads[: len(k)], ceil_mode=bool(a.get("ceil_mode", 0)))
            return F.avg_pool2d(x[0], k, a.get("strides", k), pads[: len(k)], ceil_mode=bool(a.get("ceil_mode", 0)),
                                count_include_pad=bool(a.get("count_include_pad", 0)))
        if op == "Flatten":
            ax = a.get("axis", 1)
            return x[0].reshape(int(np.prod(x[0].shape[:ax])), -1)
        if op == "Gemm":
            A = x[0].t() if a.get("transA", 0) else x[0]
            B = x[1].t() if a.get("transB", 0) else x[1]
            y = a.get("alpha", 1.0) * (A @ B)
            if len(x) > 2 and x[2] is not None:
                y = y + a.get("beta", 1.0) * x[2]
            return y
        if op == "MatMul":
            return torch.matmul(x[0], x[1])
        if op == "Shape":
            return torch.tensor(list(x[0].shape), dtype=torch.int64, device=self.device)
        if op == "Slice":
            starts, ends = x[1].tolist(), x[2].tolist()
            axes = x[3].tolist() if len(x) > 3 and x[3] is not None else list(range(len(starts)))
            steps = x[4].tolist() if len(x) > 4 and x[4] is not None else [1] * len(starts)
            idx = [slice(None)] * x[0].dim()
            for s, e, ax, st in zip(starts, ends, axes, steps):
                if st != 1:
                    raise NotImplementedError("Slice step")
                n = x[0].shape[ax]
                s = max(0, min(n, s + n if s < 0 else s))
                e = max(0, min(n, e + n if e < 0 else e))
                idx[ax] = slice(s, e)
            return x[0][tuple(idx)]
        if op == "Concat":
            return torch.cat(x, dim=a["axis"])
        if op == "Reshape":
            shape = x[1].tolist()
            shape = [x[0].shape[i] if s == 0 and not a.get("allowzero", 0) else s for i, s in enumerate(shape)]
            return x[0].reshape(shape)
        if op == "Transpose":
            return x[0].permute(a.get("perm", list(reversed(range(x[0].dim())))))
        if op in ("ReduceMean", "ReduceSum"):
            axes = a.get("axes") if "axes" in a else (x[1].tolist() if len(x) > 1 and x[1] is not None else None)
            keep = bool(a.get("keepdims", 1))
            dims = tuple(axes) if axes is not None else tuple(range(x[0].dim()))
            return x[0].mean(dim=dims, keepdim=keep) if op == "ReduceMean" else x[0].sum(dim=dims, keepdim=keep)
        if op == "Gather":
            ax = a.get("axis", 0)
            idx = x[1].long()
            idx = torch.where(idx < 0, idx + x[0].shape[ax], idx)
            out = torch.index_select(x[0], ax, idx.reshape(-1))
            return out.reshape(tuple(x[0].shape[:ax]) + tuple(idx.shape) + tuple(x[0].shape[ax + 1:]))
        if op == "Unsqueeze":
            axes = a["axes"] if "axes" in a else x[1].tolist()
            y = x[0]
            rank = y.dim() + len(axes)
            for ax in sorted(v + rank if v < 0 else v for v in axes):
                y = y.unsqueeze(ax)
            return y
        if op == "Squeeze":
            axes = a["axes"] if "axes" in a else x[1].tolist()
            y = x[0]
            for ax in sorted((v + y.dim() if v < 0 else v for v in axes), reverse=True):
                y = y.squeeze(ax)
            return y
        if op == "Resize":  # 2-D linear (half_pixel) or nearest (asymmetric, floor) with constant scales
            mode = a.get("mode", b"nearest")
            mode = mode.decode() if isinstance(mode, bytes) else mode
            ctm = a.get("coordinate_transformation_mode", b"half_pixel")
            ctm = ctm.decode() if isinstance(ctm, bytes) else ctm
            scales = x[2].tolist() if len(x) > 2 and x[2] is not None and x[2].numel() else None
            size = x[3].tolist()[2:] if len(x) > 3 and x[3] is not None else None
            if not size and not scales:
                raise NotImplementedError("onnx_torch: Resize without scales or sizes")
            sf = None if size else [float(v) for v in scales[2:]]
            if mode == "linear" and ctm == "half_pixel":
                return F.interpolate(x[0], size=size, scale_factor=sf, mode="bilinear", align_corners=False)
            if mode == "nearest" and ctm == "asymmetric" and a.get("nearest_mode", b"round_prefer_floor") in (b"floor", "floor"):
                return F.interpolate(x[0], size=size, scale_factor=sf, mode="nearest")
            raise NotImplementedError(f"onnx_torch: Resize mode {mode} / {ctm}")
        if op == "Softmax":
            return torch.softmax(x[0], dim=a.get("axis", -1))
        if node.domain == "mpq" and op == "FakeQuant":
            return self.fake_quant(node, a, x)
        if node.domain == "mpq" and op == "FakeQuantBias":
            scale = x[1] * x[2]
            q = torch.round(x[0] / scale)
            return x[0] + (q * scale - x[0]).detach()  # int32 rounding, identity gradient
        raise NotImplementedError(f"onnx_torch: op {op} ({node.name})")

    def fake_quant(self, node, a, x):
        """mpq::FakeQuant with PyTorch's own fake-quantize ops: torch.fake_quantize_per_*_affine
        (straight-through estimator with the clipping mask) for fixed scales, and the learnable
        (LSQ) variants, with LSQ's gradient factor 1/sqrt(N * Qp), when the scale is a Parameter."""
        qmin, qmax = a.get("qmin", -128), a.get("qmax", 127)
        # PyTorch's fake-quantize ops take float32 (under autocast the tensor may arrive in FP16).
        x = [x[0].float()] + list(x[1:])
        scale = x[1]
        zp = x[2] if len(x) > 2 and x[2] is not None else torch.zeros_like(scale, dtype=torch.int32)
        learn = scale.requires_grad
        if scale.numel() == 1:
            if learn:
                n = x[0].numel()
                factor = 1.0 / float(np.sqrt(n * max(1, qmax - int(zp.reshape(-1)[0]))))
                return torch._fake_quantize_learnable_per_tensor_affine(
                    x[0], scale.reshape(1), zp.reshape(1).float(), qmin, qmax, factor)
            return torch.fake_quantize_per_tensor_affine(x[0], float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0]), qmin, qmax)
        axis = a.get("axis", 1)
        if axis < 0:
            axis += x[0].dim()
        if learn:
            n = x[0].numel() // scale.numel()
            factor = 1.0 / float(np.sqrt(n * qmax))
            return torch._fake_quantize_learnable_per_channel_affine(
                x[0], scale, zp.reshape(-1).float(), axis, qmin, qmax, factor)
        return torch.fake_quantize_per_channel_affine(x[0], scale.detach(), zp.reshape(-1).int(), axis, qmin, qmax)


def fake_quant_student(fq_model, device="cpu"):
    """The graph mpq trains (`mpq quantize --format fakequant`) as a PyTorch student, set up as mpq
    trains it: the trainable parameters are the float weights and biases (non-scalar, behind their
    fake quantizers or not) and every FakeQuant step size (LSQ), the step sizes moving in log space
    as mpq's optimizer moves them (optimizer.h, ParamGroup::log_space); zero points, bias-scale
    products and eps-like constants stay fixed. Returns (graph, params: name -> Parameter, the step
    size names)."""
    student = OnnxTorch(fq_model, device=device)
    scales = {n.input[1] for n in fq_model.graph.node if n.domain == "mpq" and n.op_type == "FakeQuant"}
    names = [i.name for i in fq_model.graph.initializer
             if i.data_type == onnx.TensorProto.FLOAT and (i.name in scales or np.prod(i.dims) > 1)]
    params = student.parameters(names)
    for k in scales:
        if k in params:
            params[k].data = params[k].data.log()
            student.param_transform[k] = torch.exp
    return student, params, scales
