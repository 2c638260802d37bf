#!/usr/bin/env python3
"""Benchmark (not a test): time and peak memory of `mpq quantize` against ONNX Runtime's quantize_static.

    bench_quantize.py [--mpq build/apps/mpq/mpq] [--models resnet,mobilenet,vit] [--calib-count 512]
                      [--repeat 3]

Same inputs as scripts/bench_accuracy.py: the Fashion-MNIST classifiers of tests/models/fashion and
`calib-count` training images (seeded shuffle), one single-image feed each. Every quantization runs
in its own process under GNU time (wall time, peak RSS); the tools alternate and the best of
`--repeat` runs is kept. ORT: QDQ, per-channel, QUInt8 activations, reduce_range; its figures
include starting Python and importing onnxruntime. Needs numpy, onnx, onnxruntime and /usr/bin/time.
"""
import argparse
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from bench_accuracy import ORT_QUANT_CHILD, timed_child  # noqa: E402
from fashion_data import load  # noqa: E402

MPQ_METHODS = ["minmax", "entropy", "percentile"]
ORT_METHODS = ["MinMax", "Entropy", "Percentile"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mpq", default=os.path.join(ROOT, "build/apps/mpq/mpq"))
    ap.add_argument("--models", default="resnet,mobilenet,vit")
    ap.add_argument("--calib-count", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    train_x, _ = load("train", count=60000)
    calib = train_x[np.random.default_rng(0).permutation(len(train_x))[: args.calib_count]]
    with tempfile.TemporaryDirectory() as tmp:
        calib_dir = os.path.join(tmp, "calib")
        os.makedirs(calib_dir)
        for i, img in enumerate(calib):
            np.save(os.path.join(calib_dir, f"img_{i:04d}.npy"), img[None])
        calib_npy = os.path.join(tmp, "calib.npy")
        np.save(calib_npy, calib)
        out = os.path.join(tmp, "q.onnx")
        print(f"{args.calib_count} calibration feeds, best of {args.repeat}; load average {os.getloadavg()[0]:.2f}")
        print("| model | " + " | ".join([f"mpq {m}" for m in MPQ_METHODS] + [f"ORT {m}" for m in ORT_METHODS]) + " |")
        print("| --- " * (1 + len(MPQ_METHODS) + len(ORT_METHODS)) + "|")
        for name in args.models.split(","):
            model = os.path.join(ROOT, "tests/models/fashion", f"fashion_{name}.onnx")
            best = {}
            for _ in range(args.repeat):
                runs = [(f"mpq {m}", [args.mpq, "quantize", model, "--mode", "static", "--no-smooth-quant", "--data", calib_dir,
                                        "--method", m, "--activation-type", "int8", "-o", out])
                        for m in MPQ_METHODS]
                runs += [(f"ORT {m}", [sys.executable, "-c", ORT_QUANT_CHILD, model, calib_npy, out, m, "1"])
                         for m in ORT_METHODS]
                for key, cmd in runs:
                    s, rss, _ = timed_child(cmd)
                    if key not in best or s < best[key][0]:
                        best[key] = (s, rss)
            cells = [f"{best[k][0]:.2f} s, {best[k][1]:.1f} MiB" for k in
                     [f"mpq {m}" for m in MPQ_METHODS] + [f"ORT {m}" for m in ORT_METHODS]]
            print(f"| {name} | " + " | ".join(cells) + " |")
            for m, o in zip(MPQ_METHODS, ORT_METHODS):
                (ms, mr), (os_, orss) = best[f"mpq {m}"], best[f"ORT {o}"]
                print(f"    {m}: mpq/ORT time {ms / os_:.2f}x, memory {100 * mr / orss:.0f}%")
        print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
