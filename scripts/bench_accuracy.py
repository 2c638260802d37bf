#!/usr/bin/env python3
"""Benchmark (not a test): INT8 post-training quantization accuracy on Fashion-MNIST.

    bench_accuracy.py [--mpq build/apps/mpq/mpq] [--models resnet,mobilenet,vit] [--test-count 10000]
                      [--calib-count 512] [--skip-torch] [--skip-ort] [--json FILE]

For each classifier trained by scripts/train_fashion.py (tests/models/fashion/*.onnx and .pt):
  - FP32 top-1 on the test images (mpq's executor);
  - mpq quantize with every calibration method (minmax, percentile, entropy, mse) calibrated on the
    same `calib-count` training images, evaluated by mpq's executor (which runs the QDQ graph as
    written), plus the best method's model evaluated by ONNX Runtime;
  - peers on the same model and calibration images: PyTorch's post-training quantization (FX graph
    mode, default x86 qconfig) and ONNX Runtime's quantize_static (QDQ, per-channel, each of its
    calibration methods; evaluated with ORT; with and without reduce_range because ORT's x86 kernels
    saturate 8-bit weights on CPUs without VNNI);
  - time and peak memory of `mpq quantize` against ORT's quantize_static.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from fashion_data import load  # noqa: E402

METHODS = ["minmax", "percentile", "entropy", "mse"]


def child(cmd, env=None):
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, err = p.communicate()
    secs = time.perf_counter() - t0
    # Peak RSS of this child (RUSAGE_CHILDREN keeps the maximum over all children so far, so the
    # maximum is read per child through os.wait4 in bench_calibrate; here /usr/bin/time is used).
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])}... failed: {err.strip()[-800:]}")
    return secs, out, err


def timed_child(cmd):
    """(seconds, peak RSS MiB) of a child process via GNU time."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        secs, out, err = child(["/usr/bin/time", "-f", "%M", "-o", tf.name] + cmd)
        rss_kib = float(open(tf.name).read().strip().splitlines()[-1])
    return secs, rss_kib / 1024.0, out


def write_batches(root, images, batch=100):
    os.makedirs(root, exist_ok=True)
    for i in range(0, len(images), batch):
        np.save(os.path.join(root, f"batch_{i // batch:04d}.npy"), images[i:i + batch])


def mpq_accuracy(mpq, model, test_dir, labels, outdir):
    subprocess.run([mpq, "run", model, "--data", test_dir, "--outputs", outdir], check=True, capture_output=True)
    preds = []
    for f in sorted(os.listdir(test_dir)):
        if f.startswith("batch_"):
            preds.append(np.load(os.path.join(outdir, f[:-4], "logits.npy")).argmax(-1))
    return float((np.concatenate(preds) == labels).mean() * 100.0)


def ort_accuracy(model, images, labels, optimized=True):
    import onnxruntime as ort
    so = ort.SessionOptions()
    if not optimized:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    preds = [s.run(None, {name: images[i:i + 200]})[0].argmax(-1) for i in range(0, len(images), 200)]
    return float((np.concatenate(preds) == labels).mean() * 100.0)


ORT_QUANT_CHILD = r"""
import sys, numpy as np, time
from onnxruntime.quantization import quantize_static, CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType
model, calib, out, method, reduce_range = sys.argv[1:6]
x = np.load(calib)
class R(CalibrationDataReader):
    def __init__(self): self.i = 0
    def get_next(self):
        if self.i >= len(x): return None
        b = x[self.i:self.i + 1]; self.i += 1
        return {"input": b}
quantize_static(model, out, R(), quant_format=QuantFormat.QDQ, per_channel=True,
                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                calibrate_method=getattr(CalibrationMethod, method), reduce_range=reduce_range == "1")
"""


def torch_fx_ptq(name, calib, test_x, test_y):
    import torch
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx
    from train_fashion import build_model
    torch.backends.quantized.engine = "x86"
    model = build_model(name)
    model.load_state_dict(torch.load(os.path.join(ROOT, "tests/models/fashion", f"fashion_{name}.pt"), map_location="cpu"))
    model.eval()
    t0 = time.perf_counter()
    prepared = prepare_fx(model, get_default_qconfig_mapping("x86"), example_inputs=(torch.from_numpy(calib[:1]),))
    with torch.no_grad():
        for i in range(0, len(calib), 32):
            prepared(torch.from_numpy(calib[i:i + 32]))
    quantized = convert_fx(prepared)
    secs = time.perf_counter() - t0
    with torch.no_grad():
        preds = [quantized(torch.from_numpy(test_x[i:i + 500])).argmax(-1).numpy() for i in range(0, len(test_x), 500)]
        fp32 = [model(torch.from_numpy(test_x[i:i + 500])).argmax(-1).numpy() for i in range(0, len(test_x), 500)]
    return (float((np.concatenate(preds) == test_y).mean() * 100), float((np.concatenate(fp32) == test_y).mean() * 100),
            secs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mpq", default=os.path.join(ROOT, "build/apps/mpq/mpq"))
    ap.add_argument("--models", default="resnet,mobilenet,vit")
    ap.add_argument("--test-count", type=int, default=10000)
    ap.add_argument("--calib-count", type=int, default=512)
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-ort", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    test_x, test_y = load("test", count=args.test_count)
    train_x, _ = load("train", count=60000)
    calib = train_x[np.random.default_rng(0).permutation(len(train_x))[: args.calib_count]]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        test_dir, calib_dir = os.path.join(tmp, "test"), os.path.join(tmp, "calib")
        write_batches(test_dir, test_x)
        os.makedirs(calib_dir)
        for i, img in enumerate(calib):  # one feed per image, as users' calibration folders hold
            np.save(os.path.join(calib_dir, f"img_{i:04d}.npy"), img[None])
        calib_npy = os.path.join(tmp, "calib.npy")
        np.save(calib_npy, calib)
        for name in args.models.split(","):
            model = os.path.join(ROOT, "tests/models/fashion", f"fashion_{name}.onnx")
            r = {"fp32": mpq_accuracy(args.mpq, model, test_dir, test_y, os.path.join(tmp, f"o_{name}"))}
            print(f"== {name}: FP32 top-1 {r['fp32']:.2f}% on {len(test_y)} test images")
            for method in METHODS:
                q = os.path.join(tmp, f"{name}.{method}.onnx")
                secs, rss, _ = timed_child([args.mpq, "quantize", model, "--mode", "static", "--no-smooth-quant", "--data", calib_dir, "--method", method,
                                              "--activation-type", "int8", "-o", q])
                acc = mpq_accuracy(args.mpq, q, test_dir, test_y, os.path.join(tmp, f"o_{name}_{method}"))
                r[f"mpq_{method}"] = acc
                r[f"mpq_{method}_s"] = secs
                r[f"mpq_{method}_rss_mib"] = rss
                print(f"   mpq {method:<10} {acc:6.2f}% ({acc - r['fp32']:+.2f})  quantize {secs:5.1f} s, peak {rss:6.1f} MiB")
            best = max(METHODS, key=lambda m: r[f"mpq_{m}"])
            r["mpq_best"] = best
            if not args.skip_ort:
                q = os.path.join(tmp, f"{name}.{best}.onnx")
                r["mpq_best_in_ort_as_written"] = ort_accuracy(q, test_x, test_y, optimized=False)
                print(f"   mpq {best} model in ONNX Runtime (graph as written): {r['mpq_best_in_ort_as_written']:.2f}%")
                rr = os.path.join(tmp, f"{name}.{best}.rr.onnx")
                subprocess.run([args.mpq, "quantize", model, "--mode", "static", "--no-smooth-quant", "--data", calib_dir, "--method", best, "--activation-type",
                                "uint8", "--reduce-range", "-o", rr], check=True, capture_output=True)
                r["mpq_best_uint8_rr_in_ort"] = ort_accuracy(rr, test_x, test_y, optimized=True)
                print(f"   mpq {best} uint8 --reduce-range in ONNX Runtime (fused int8 kernels): "
                      f"{r['mpq_best_uint8_rr_in_ort']:.2f}%")
                for method in ["MinMax", "Entropy", "Percentile", "Distribution"]:
                    for reduce_range in ("0", "1"):
                        out = os.path.join(tmp, f"{name}.ort.{method}.{reduce_range}.onnx")
                        try:
                            secs, rss, _ = timed_child([sys.executable, "-c", ORT_QUANT_CHILD, model, calib_npy, out,
                                                        method, reduce_range])
                        except RuntimeError as e:
                            print(f"   ORT quantize_static {method}: failed: {e}")
                            continue
                        acc = ort_accuracy(out, test_x, test_y)
                        key = f"ort_{method.lower()}" + ("_reduce_range" if reduce_range == "1" else "")
                        r[key] = acc
                        r[key + "_s"] = secs
                        r[key + "_rss_mib"] = rss
                        print(f"   ORT {method:<12}{' reduce_range' if reduce_range == '1' else '             '} "
                              f"{acc:6.2f}% ({acc - r['fp32']:+.2f})  quantize_static {secs:5.1f} s, peak {rss:6.1f} MiB")
            if not args.skip_torch:
                try:
                    acc, torch_fp32, secs = torch_fx_ptq(name, calib, test_x, test_y)
                    r["torch_fx"] = acc
                    r["torch_fx_s"] = secs
                    print(f"   PyTorch FX PTQ (x86)   {acc:6.2f}% (PyTorch FP32 {torch_fp32:.2f}%)  {secs:5.1f} s")
                except Exception as e:  # torch missing or the model does not trace
                    print(f"   PyTorch FX PTQ: failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            peers = [v for k, v in r.items() if (k.startswith("ort_") or k == "torch_fx") and not k.endswith(("_s", "_rss_mib"))]
            if peers:
                r["best_peer"] = max(peers)
                print(f"   best mpq ({best}) {r['mpq_' + best]:.2f}% vs best peer {r['best_peer']:.2f}%: "
                      f"{r['mpq_' + best] - r['best_peer']:+.2f} points; vs FP32 {r['mpq_' + best] - r['fp32']:+.2f}")
            results[name] = r
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
