#!/usr/bin/env python3
"""mpq and ONNX Runtime agree on the generated test models (a ctest, `models_agree_with_ort`).

    check_models_vs_ort.py --mpq BUILD/apps/mpq/mpq [--int8]

FP32 (default): every tests/models/*.onnx with a *_data feed folder (random inputs, opsets 13 and
17) and every tests/models/fashion/*.onnx on real Fashion-MNIST test images: mpq's outputs must be
within relative L2 1e-5 of ONNX Runtime's and have identical argmax.

--int8: each of those models is quantized by `mpq quantize` (entropy calibration on its own feeds,
or on calib_data/calib for the Fashion models); the INT8 model must pass the ONNX checker, load in
ONNX Runtime, and agree with it (ORT evaluating the QDQ graph as written: rel L2 <= 1e-3, identical
argmax). ORT's fused int8 kernels are compared too and reported (not gated): on x86 CPUs without
VNNI its int8 x int8 kernels saturate, so only the uint8-activation model is compared that way.
Exit 0 on agreement, 1 otherwise, 77 (skipped) without onnxruntime.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
except ImportError as e:
    print(f"SKIP: {e} (run scripts/setup.sh --python)")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORT_CHECK = os.path.join(ROOT, "scripts", "ort_check.py")


def fashion_feeds(tmp, count=64):
    """Real images: the first `count` Fashion-MNIST test images as one feed folder per image."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from fashion_data import load
    images, _ = load("test", count=count)
    d = os.path.join(tmp, "fashion_feeds")
    if not os.path.exists(d):
        for i, img in enumerate(images):
            os.makedirs(os.path.join(d, f"img_{i:03d}"))
            np.save(os.path.join(d, f"img_{i:03d}", "input.npy"), img[None])
    return d


def cases(tmp):
    out = []
    for model in sorted(glob.glob(os.path.join(ROOT, "tests/models/*.onnx"))):
        data = model[:-5] + "_data"
        if os.path.isdir(data):
            out.append((model, data, data))
    calib = os.path.join(ROOT, "calib_data", "calib")
    for model in sorted(glob.glob(os.path.join(ROOT, "tests/models/fashion/*.onnx"))):
        feeds = fashion_feeds(tmp)
        out.append((model, feeds, calib if os.path.isdir(calib) else feeds))
    return out


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def compare(mpq, model, data, outdir, rtol, ort_level="disable"):
    r = run([mpq, "run", model, "--data", data, "--outputs", outdir])
    if r.returncode != 0:
        return False, f"mpq run failed: {r.stderr.strip()}"
    cmd = [sys.executable, ORT_CHECK, model, "--data", data, "--mpq-outputs", outdir, "--rtol-l2", str(rtol), "--json"]
    r = run(cmd)
    try:
        rep = json.loads(r.stdout)
        worst = rep["worst_rel_l2"]
    except (json.JSONDecodeError, ValueError):
        return False, f"ort_check failed: {r.stderr.strip()[-400:]}"
    return r.returncode == 0, f"worst rel-L2 {worst:.2e}"


def optimized_ort_gap(model, data, outdir):
    """rel-L2 of mpq against ORT with all graph optimisations (fused int8 kernels)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    worst, argmax_ok = 0.0, True
    for feed in sorted(os.listdir(data)):
        fd = os.path.join(data, feed)
        if not os.path.isdir(fd):
            continue
        feeds = {i.name: np.load(os.path.join(fd, i.name + ".npy")) for i in sess.get_inputs()}
        for o, ref in zip(sess.get_outputs(), sess.run(None, feeds)):
            got = np.load(os.path.join(outdir, feed, o.name + ".npy"))
            worst = max(worst, float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-12)))
            argmax_ok &= bool((got.argmax(-1) == ref.argmax(-1)).all())
    return worst, argmax_ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mpq", required=True)
    ap.add_argument("--int8", action="store_true")
    args = ap.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for model, data, calib in cases(tmp):
            name = os.path.relpath(model, ROOT)
            if not args.int8:
                ok, msg = compare(args.mpq, model, data, os.path.join(tmp, "out_" + os.path.basename(model)), 1e-5)
                print(f"{'OK  ' if ok else 'FAIL'} fp32 {name}: {msg}")
                failures += not ok
                continue
            for act in ("int8", "uint8"):
                q = os.path.join(tmp, f"{os.path.basename(model)[:-5]}.{act}.onnx")
                r = run([args.mpq, "quantize", model, "--data", calib, "-o", q, "--activation-type", act])
                if r.returncode != 0:
                    print(f"FAIL {act} {name}: quantize failed: {r.stderr.strip()}")
                    failures += 1
                    continue
                try:
                    onnx.checker.check_model(onnx.load(q))
                except Exception as e:  # the checker raises ValidationError
                    print(f"FAIL {act} {name}: ONNX checker: {str(e).splitlines()[0]}")
                    failures += 1
                    continue
                outdir = os.path.join(tmp, f"out_{act}_{os.path.basename(model)}")
                ok, msg = compare(args.mpq, q, data, outdir, 1e-3)
                extra = ""
                if act == "uint8":
                    gap, am = optimized_ort_gap(q, data, outdir)
                    extra = f"; vs ORT fused int8 kernels: rel-L2 {gap:.2e}, argmax {'identical' if am else 'differs'}"
                print(f"{'OK  ' if ok else 'FAIL'} {act} {name}: {msg}{extra}")
                failures += not ok
    print(f"{'PASS' if failures == 0 else 'FAIL'}: {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
