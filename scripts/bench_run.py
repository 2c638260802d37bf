#!/usr/bin/env python3
"""Benchmark (not a test): mpq's median latency against ONNX Runtime's on the same model, inputs
and thread count, per model and batch size.

    bench_run.py [--mpq build/apps/mpq/mpq] [--threads 2] [--repeat 30] [--batches 1,8] [--int8 DIR] [MODEL ...]

For each model, random inputs (seeded) of each batch size are written to a temporary data folder;
mpq is timed with `mpq run --repeat R --json` (R timed runs after one warm-up, load excluded) and
ONNX Runtime with the same number of runs after a warm-up, both single process, same threads.
Prints a table with both medians and the ratio mpq/ORT (< 1 means mpq is faster).

--int8 DIR adds INT8 QDQ versions of the CNNs that ship calibration data (resnet_bn, mobilenetv3,
unet): `mpq quantize --mode static` writes them into DIR (kept, so runs compare the same files),
and both engines run the same QDQ file.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INT8_SOURCES = ["resnet_bn_op17", "mobilenetv3_op17", "unet_op17"]

DEFAULT_MODELS = [
    "tests/models/resnet_bn_op17.onnx",
    "tests/models/mobilenetv3_op17.onnx",
    "tests/models/unet_op17.onnx",
    "tests/models/transformer_op17.onnx",
    "tests/models/fashion/fashion_resnet.onnx",
    "tests/models/fashion/fashion_mobilenet.onnx",
    "tests/models/fashion/fashion_vit.onnx",
]

NP_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
            "tensor(int32)": np.int32, "tensor(uint8)": np.uint8, "tensor(int8)": np.int8}


def make_inputs(sess, batch, seed):
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in sess.get_inputs():
        shape = [batch if (not isinstance(d, int) or d <= 0) and k == 0 else (d if isinstance(d, int) and d > 0 else 1)
                 for k, d in enumerate(i.shape)]
        dtype = NP_TYPES.get(i.type, np.float32)
        if np.issubdtype(dtype, np.floating):
            feeds[i.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[i.name] = rng.integers(0, 4, size=shape).astype(dtype)
    return feeds


def fixed_batch(sess):
    d = sess.get_inputs()[0].shape[0]
    return d if isinstance(d, int) and d > 0 else None


def time_ort(sess, feeds, repeat, stat="median"):
    """Latency in ms of `repeat` runs of the session: their median, or with stat "min" the fastest."""
    sess.run(None, feeds)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1000.0)
    return min(times) if stat == "min" else statistics.median(times)


def time_mpq(mpq, model, feeds, repeat, threads, idle_modes=None, stat="median"):
    """Median latency in ms of `mpq run --repeat` (with stat "min", its fastest run); appends how
    mpq's idle threads waited to idle_modes if given: "spin", "sleep" (the machine looked busy when
    mpq started), "user" (OMP_WAIT_POLICY or GOMP_SPINCOUNT set by the caller) or "unknown" (an
    older mpq)."""
    with tempfile.TemporaryDirectory() as d:
        feed_dir = os.path.join(d, "feed_0")
        os.makedirs(feed_dir)
        for name, arr in feeds.items():
            np.save(os.path.join(feed_dir, name + ".npy"), arr)
        out = subprocess.run([mpq, "run", model, "--data", d, "--repeat", str(repeat), "--threads", str(threads), "--json"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(out.stderr.strip())
        j = json.loads(out.stdout)
        if idle_modes is not None:
            idle_modes.append(j.get("idle_threads", "unknown"))
        return j["latency_ms"]["min" if stat == "min" else "median"]


def blas_note(mpq):
    """Which OpenBLAS kernels mpq runs (`mpq devices --json`): an OPENBLAS_CORETYPE in the environment
    can hold them below the CPU (AVX2 kernels on an AVX-512 CPU), which ONNX Runtime ignores."""
    out = subprocess.run([mpq, "devices", "--json"], capture_output=True, text=True)
    try:
        k = json.loads(out.stdout)["blas_kernels"]
    except (ValueError, KeyError):
        return "mpq's OpenBLAS kernels: unknown"
    note = f"mpq's OpenBLAS kernels: {k.get('active') or 'unknown'} ({k.get('reason', '')})"
    if k.get("below_cpu"):
        note += f"; no AVX-512 on an AVX-512 CPU (OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')})"
    return note


def int8_models(mpq, folder):
    os.makedirs(folder, exist_ok=True)
    out = []
    for name in INT8_SOURCES:
        q = os.path.join(folder, name + "_int8.onnx")
        if not os.path.exists(q):
            src = os.path.join(ROOT, "tests/models", name + ".onnx")
            data = os.path.join(ROOT, "tests/models", name + "_data")
            r = subprocess.run([mpq, "quantize", src, "-o", q, "--data", data, "--mode", "static"],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"mpq quantize {name}: {r.stderr.strip()}")
        out.append(q)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*")
    ap.add_argument("--mpq", default=os.path.join(ROOT, "build/apps/mpq/mpq"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    ap.add_argument("--int8", metavar="DIR", help="also time INT8 QDQ models (made by mpq quantize into DIR)")
    args = ap.parse_args()
    models = args.models or [os.path.join(ROOT, m) for m in DEFAULT_MODELS]
    if args.int8:
        models += int8_models(args.mpq, args.int8)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    rows = []
    print(f"threads={args.threads} repeat={args.repeat} onnxruntime={ort.__version__}")
    print(blas_note(args.mpq))
    print(f"{'model':<28} {'batch':>5} {'mpq ms':>9} {'ORT ms':>9} {'mpq/ORT':>8}")
    for model in models:
        if not os.path.exists(model):
            print(f"{os.path.basename(model):<28} missing, skipped")
            continue
        sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        for batch in [int(b) for b in args.batches.split(",")]:
            fb = fixed_batch(sess)
            if fb is not None and fb != batch:
                continue
            feeds = make_inputs(sess, batch, seed=batch)
            try:
                m = time_mpq(args.mpq, model, feeds, args.repeat, args.threads)
            except RuntimeError as e:
                print(f"{os.path.basename(model):<28} {batch:>5} mpq failed: {e}")
                continue
            o = time_ort(sess, feeds, args.repeat)
            rows.append({"model": os.path.basename(model), "batch": batch, "mpq_ms": m, "ort_ms": o, "ratio": m / o})
            print(f"{os.path.basename(model):<28} {batch:>5} {m:>9.3f} {o:>9.3f} {m / o:>8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
