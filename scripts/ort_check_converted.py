#!/usr/bin/env python3
"""Check that models converted by `mpq convert --fp16` load and run in ONNX Runtime and match FP32.

Usage: ort_check_converted.py EXPORT_DIR TESTDATA_ROOT [--models-dir DIR] [--json]

EXPORT_DIR holds files named <suite>__<case>.onnx, written by convert_precision_test:
  - <suite>/<case> from the ONNX backend test data: the original is TESTDATA_ROOT/<suite>/<case>/model.onnx
    and the converted model runs on its test_data_set_*/input_<k>.pb, compared with output_<k>.pb;
  - models__<stem>: a model of --models-dir (default: tests/models beside this script), compared with
    ONNX Runtime's run of the original on <stem>_data/<feed>/<input>.npy.
A converted model must pass onnx.checker.check_model(full_check=True) (types of every node against
the operator schemas, with strict shape inference) wherever its original does, and load in ONNX Runtime wherever its original
loads, and its outputs must match (the expected
outputs, or ONNX Runtime's FP32 result where that already differs from them):
  float outputs of 16+ values: cosine >= 0.9999 (inf/NaN only where expected);
  smaller float outputs: max |error| <= 1e-2 * max(1, max |expected|);
  integer, bool and string outputs: exact.
ONNX Runtime's CPU provider runs float16 nodes it has no float16 kernel for in float32 behind
Casts, so this checks loading and the graph's meaning, not FP16 overflow (mpq's executor does that).

Exit 0 when everything loads and matches, 1 otherwise, 77 (ctest: skipped) without onnxruntime.
"""
import argparse
import json
import os
import sys

try:
    import numpy as np
    import onnx
    from onnx import numpy_helper
    import onnxruntime as ort
except ImportError as e:
    print(f"SKIP: {e} (run scripts/setup.sh --python)")
    sys.exit(77)

# Cases whose converted outputs are known not to match, with the reason (kept in step with
# tests/passes/convert_precision_test.cpp).
EXCEPTIONS = {}


def session(path):
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def load_error(path):
    try:
        return None, session(path)
    except Exception as e:  # ORT raises several exception types
        return str(e).splitlines()[0][:300], None


def read_pb(path):
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def compare(got, want, name):
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        return f"output '{name}': shape {list(got.shape)} vs {list(want.shape)}"
    if want.dtype.kind not in "fc":
        if want.dtype.kind in "OSU":
            return "" if list(got.ravel()) == list(want.ravel()) else f"output '{name}': strings differ"
        bad = np.flatnonzero(got.astype(np.int64).ravel() != want.astype(np.int64).ravel()) if got.size else []
        return "" if len(bad) == 0 else f"output '{name}': {len(bad)} of {want.size} values differ"
    a = got.astype(np.float64).ravel()
    b = want.astype(np.float64).ravel()
    fin = np.isfinite(b)
    same_special = (a[~fin] == b[~fin]) | (np.isnan(a[~fin]) & np.isnan(b[~fin]))
    if not np.all(same_special) or not np.all(np.isfinite(a[fin])):
        return f"output '{name}': inf/NaN where the expectation differs"
    a, b = a[fin], b[fin]
    if want.size >= 16:
        na, nb = np.linalg.norm(a), np.linalg.norm(b)
        cos = 1.0 if na == 0 and nb == 0 else (0.0 if na == 0 or nb == 0 else float(a @ b / (na * nb)))
        return "" if cos >= 0.9999 else f"output '{name}': cosine {cos:.6f}"
    scale = max(1.0, float(np.max(np.abs(b))) if b.size else 1.0)
    err = float(np.max(np.abs(a - b))) if b.size else 0.0
    return "" if err <= 1e-2 * scale else f"output '{name}': max |err| {err:.3g} for values up to {scale:.3g}"


def feeds_of_case(case_dir, sess):
    names = [i.name for i in sess.get_inputs()]
    out = []
    for s in sorted(d for d in os.listdir(case_dir) if d.startswith("test_data_set_")):
        folder = os.path.join(case_dir, s)
        feed, k = {}, 0
        while os.path.exists(os.path.join(folder, f"input_{k}.pb")):
            if k < len(names):
                feed[names[k]] = read_pb(os.path.join(folder, f"input_{k}.pb"))
            k += 1
        expected, k = [], 0
        while os.path.exists(os.path.join(folder, f"output_{k}.pb")):
            expected.append(read_pb(os.path.join(folder, f"output_{k}.pb")))
            k += 1
        out.append((s, feed, expected))
    return out


def feeds_of_model(data_dir, sess):
    names = [i.name for i in sess.get_inputs()]
    out = []
    if not os.path.isdir(data_dir):
        return out
    for s in sorted(os.listdir(data_dir)):
        folder = os.path.join(data_dir, s)
        if not os.path.isdir(folder):
            continue
        feed = {n: np.load(os.path.join(folder, n + ".npy")) for n in names if os.path.exists(os.path.join(folder, n + ".npy"))}
        if len(feed) == len(names):
            out.append((s, feed, None))
    return out


def same_outputs(a, b):
    for x, y in zip(a, b):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape:
            return False
        if x.dtype.kind in "fc":
            if not np.array_equal(x, y, equal_nan=True):
                return False
        elif not np.array_equal(x, y):
            return False
    return True


def check_one(path, original, case_dir, data_dir):
    """(status, detail): status is ok / skip / load / mismatch / error.

    The reference is the case's expected output; where ONNX Runtime's run of the FP32 original does
    not meet it either (an ORT deviation, not a conversion problem), ORT's FP32 result is the
    reference instead. Originals that fail to run or give different results on two runs (random
    ops) are skipped."""
    err, ref = load_error(original)
    if err:
        return "skip", f"original does not load in ORT: {err}"
    if full_check_error(original) is None:
        # Strict ONNX check (types of every node, strict shape inference) where the original passes it.
        err = full_check_error(path)
        if err:
            return "load", f"onnx.checker (full): {err}"
    err, sess = load_error(path)
    if err:
        return "load", err
    feeds = feeds_of_case(case_dir, ref) if case_dir else feeds_of_model(data_dir, ref)
    checked = 0
    for set_name, feed, expected in feeds:
        try:
            ref_outs = ref.run(None, feed)
            if not same_outputs(ref_outs, ref.run(None, feed)):
                return "skip", "the original is not deterministic (random op)"
        except Exception as e:
            return "skip", f"original fails to run in ORT: {first_line_of(e)}"
        if expected is None:
            expected = ref_outs
        try:
            got = sess.run(None, feed)
        except Exception as e:
            return "error", f"ORT failed to run: {first_line_of(e)}"
        for k, g in enumerate(got):
            want = expected[k] if k < len(expected) else ref_outs[k]
            if compare(ref_outs[k], want, ""):
                want = ref_outs[k]
            d = compare(g, want, sess.get_outputs()[k].name)
            if d:
                return "mismatch", f"{set_name}: {d}"
        checked += 1
    return "ok", f"{checked} feed(s)"


def full_check_error(path):
    try:
        onnx.checker.check_model(onnx.load(path), full_check=True)
        return None
    except Exception as e:
        return first_line_of(e)


def first_line_of(e):
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:300]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("export_dir")
    ap.add_argument("testdata_root")
    ap.add_argument("--models-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "models"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    files = sorted(f for f in os.listdir(args.export_dir) if f.endswith(".onnx") and "__" in f)
    if not files:
        print(f"no converted models in {args.export_dir}")
        return 1
    counts = {"ok": 0, "skip": 0, "load": 0, "mismatch": 0, "error": 0, "excepted": 0}
    problems = []
    for f in files:
        suite, case = f[: -len(".onnx")].split("__", 1)
        path = os.path.join(args.export_dir, f)
        if suite == "models":
            original = os.path.join(args.models_dir, case + ".onnx")
            if not os.path.exists(original):
                original = os.path.join(args.models_dir, "fashion", case + ".onnx")
            status, detail = check_one(path, original, None, os.path.join(args.models_dir, case + "_data"))
        else:
            case_dir = os.path.join(args.testdata_root, suite, case)
            status, detail = check_one(path, os.path.join(case_dir, "model.onnx"), case_dir, None)
        if status not in ("ok", "skip") and case in EXCEPTIONS:
            status = "excepted"
        counts[status] += 1
        if status not in ("ok", "skip", "excepted"):
            problems.append({"model": f"{suite}/{case}", "status": status, "detail": detail})
    if args.json:
        print(json.dumps({"onnxruntime": ort.__version__, "models": len(files), "counts": counts, "problems": problems}, indent=2))
    else:
        print(f"ONNX Runtime {ort.__version__}: {len(files)} converted models; {counts['ok']} load and match; "
              f"{counts['skip']} skipped (original does not load or run in ORT, or is random); "
              f"{counts['excepted']} listed exceptions; "
              f"{counts['load']} do not load; {counts['error']} fail to run; {counts['mismatch']} mismatch")
        for p in problems:
            print(f"  FAIL {p['model']} ({p['status']}): {p['detail']}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
