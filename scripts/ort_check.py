#!/usr/bin/env python3
"""Cross-check mpq's outputs against ONNX Runtime, or write ONNX Runtime reference outputs.

Compare:
    ort_check.py MODEL --data DIR --mpq-outputs OUTDIR [--rtol-l2 1e-5] [--argmax-tie-tol 0] [--json]
Write reference:
    ort_check.py MODEL --data DIR --write-reference OUTDIR [--json]

Feeds are read from DIR following the data-directory conventions of docs/DESIGN.md, taken in sorted
name order:
  1. one subfolder per feed holding `<input name>.npy` (raw or sanitised name) or `input_<k>.pb`
     (ONNX TensorProto, the ONNX backend-test layout: `--data test_case_dir` works);
  2. flat `*.npy` / `*.pb` files for single-input models, one feed per file, used as is; where the
     model fixes the batch dimension to 1 and a file holds N > 1 rows, it is split into N feeds
     `<stem>_<k>`. `labels.npy` is not a feed.
Image folders (layout 3) are not read by this script.

The reference is ONNX Runtime's CPUExecutionProvider with every graph optimisation disabled
(ORT_DISABLE_ALL), so it evaluates the graph as written. mpq's outputs are read from
OUTDIR/<feed id>/<output name>.npy (feed id: subfolder name or file stem; names sanitised to
[A-Za-z0-9._-], anything else becomes '_') -- the layout `mpq run --outputs` writes.

For every feed and output it prints the relative L2 error ||mpq - ort|| / max(||ort||, 1e-12), the
maximum absolute difference and the argmax agreement along the last axis. A row whose argmax differs
is excused only if the reference values at the two indices are within --argmax-tie-tol (default 0:
an exact tie).

Exit status: 0 all within threshold; 1 a rel-L2 above --rtol-l2, an argmax disagreement, a missing
or misshapen mpq output; 2 bad usage or bad input (unreadable model, no feeds, a feed that does not
match the model's inputs); 3 internal error. With --json the report goes to stdout as JSON and
messages to stderr.
"""

import argparse
import json
import math
import os
import re
import sys
import tempfile

import numpy as np

try:
    import onnx
    from onnx import numpy_helper
    import onnxruntime as ort
except ImportError as e:  # pragma: no cover
    print(f"ort_check: {e}; install scripts/requirements.txt", file=sys.stderr)
    sys.exit(2)


class BadInput(Exception):
    """Bad usage or bad input: exit status 2."""


ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(int16)": np.int16,
    "tensor(uint16)": np.uint16, "tensor(int32)": np.int32, "tensor(uint32)": np.uint32,
    "tensor(int64)": np.int64, "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_,
}
FEED_EXTS = (".npy", ".pb")
IMAGE_EXTS = (".png", ".jpg", ".jpeg")
NOT_FEEDS = {"labels.npy"}


def sanitize(name):
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def log(msg):
    print(msg, file=sys.stderr)


# --------------------------------------------------------------------------------------------------
# Reading feeds
# --------------------------------------------------------------------------------------------------


def read_tensor(path):
    try:
        if path.endswith(".npy"):
            return np.load(path, allow_pickle=False)
        t = onnx.TensorProto()
        with open(path, "rb") as f:
            t.ParseFromString(f.read())
        return numpy_helper.to_array(t)
    except Exception as e:
        raise BadInput(f"{path}: cannot read tensor: {e}") from e


def model_inputs(sess):
    """[(name, numpy dtype or None, shape list with int or None per dim)] of the graph inputs."""
    out = []
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else None for d in (i.shape or [])]
        out.append((i.name, ORT_TYPES.get(i.type), shape))
    return out


def check_feed(arr, inp, where):
    name, dtype, shape = inp
    if dtype is None:
        raise BadInput(f"{where}: input '{name}' has a type this script does not feed")
    if arr.dtype != dtype:
        raise BadInput(f"{where}: input '{name}' expects {np.dtype(dtype).name}, file holds {arr.dtype.name}")
    if arr.ndim != len(shape) or any(d is not None and d != a for d, a in zip(shape, arr.shape)):
        want = "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"
        raise BadInput(f"{where}: input '{name}' expects shape {want}, file holds {list(arr.shape)}")


def is_feed_file(entry):
    return entry.lower().endswith(FEED_EXTS) and entry not in NOT_FEEDS


def discover_feeds(data_dir, inputs):
    """[(feed id, {input name: array})] in sorted order, checked against the model's inputs."""
    if not os.path.isdir(data_dir):
        raise BadInput(f"{data_dir}: not a directory")
    entries = sorted(e for e in os.listdir(data_dir) if not e.startswith("."))
    subdirs = [e for e in entries if os.path.isdir(os.path.join(data_dir, e))
               and any(is_feed_file(f) for f in os.listdir(os.path.join(data_dir, e)))]
    flat = [e for e in entries if os.path.isfile(os.path.join(data_dir, e)) and is_feed_file(e)]
    if subdirs and flat:
        raise BadInput(f"{data_dir}: holds both feed subfolders ({subdirs[0]}, ...) and flat feed files "
                       f"({flat[0]}, ...); use one layout")
    feeds = []
    if subdirs:
        for sub in subdirs:
            folder = os.path.join(data_dir, sub)
            present = set(os.listdir(folder))
            feed = {}
            for k, inp in enumerate(inputs):
                name = inp[0]
                for cand in (name + ".npy", sanitize(name) + ".npy", f"input_{k}.pb"):
                    if cand in present and os.path.isfile(os.path.join(folder, cand)):
                        path = os.path.join(folder, cand)
                        break
                else:
                    raise BadInput(f"{folder}: no file for input '{name}' (expected {sanitize(name)}.npy "
                                   f"or input_{k}.pb)")
                arr = read_tensor(path)
                check_feed(arr, inp, path)
                feed[name] = arr
            feeds.append((sub, feed))
    elif flat:
        if len(inputs) != 1:
            raise BadInput(f"{data_dir}: flat feed files need a single-input model; this one has "
                           f"{len(inputs)} inputs ({', '.join(i[0] for i in inputs)}); use one subfolder per feed")
        inp = inputs[0]
        name, _, shape = inp
        for fname in flat:
            path = os.path.join(data_dir, fname)
            stem = os.path.splitext(fname)[0]
            arr = read_tensor(path)
            if shape and shape[0] == 1 and arr.ndim == len(shape) and arr.shape[0] > 1:
                for k in range(arr.shape[0]):
                    row = np.ascontiguousarray(arr[k:k + 1])
                    check_feed(row, inp, f"{path}[{k}]")
                    feeds.append((f"{stem}_{k}", {name: row}))
            else:
                check_feed(arr, inp, path)
                feeds.append((stem, {name: arr}))
    else:
        if any(e.lower().endswith(IMAGE_EXTS) for e in entries):
            raise BadInput(f"{data_dir}: image folders are not supported by ort_check.py; "
                           "convert them to .npy feeds first")
        raise BadInput(f"{data_dir}: no feeds found (no subfolders with .npy/.pb files, no flat .npy/.pb files)")
    return feeds


# --------------------------------------------------------------------------------------------------
# Comparison
# --------------------------------------------------------------------------------------------------


def compare(a, b, tie_tol):
    """Metrics for candidate a against reference b (both numpy arrays of the same shape)."""
    a64 = a.astype(np.float64)
    b64 = b.astype(np.float64)
    both_nan = np.isnan(a64) & np.isnan(b64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where((a64 == b64) | both_nan, 0.0, a64 - b64)   # equal infinities count as equal
    b_fin = np.where(np.isfinite(b64), b64, 0.0)
    rel = float(np.linalg.norm(diff) / max(float(np.linalg.norm(b_fin)), 1e-12))
    if np.isnan(rel):
        rel = math.inf
    max_abs = float(np.max(np.abs(diff))) if diff.size else 0.0
    if np.isnan(max_abs):
        max_abs = math.inf
    rows, mismatches = 0, 0
    if a64.ndim >= 1 and a64.size:
        ra = a64.reshape(-1, a64.shape[-1])
        rb = b64.reshape(-1, b64.shape[-1])
        rows = ra.shape[0]
        ia = np.argmax(ra, axis=1)
        ib = np.argmax(rb, axis=1)
        r = np.arange(rows)
        differ = ia != ib
        # excused: the reference value at mpq's argmax is within tie_tol of the reference maximum
        excused = rb[r, ia] >= rb[r, ib] - tie_tol
        mismatches = int(np.count_nonzero(differ & ~excused))
    return rel, max_abs, rows, mismatches


def jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


def atomic_save(path, arr):
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp_", suffix=".npy", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, arr)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def run(args):
    if not os.path.isfile(args.model):
        raise BadInput(f"{args.model}: no such model file")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    if args.threads:
        so.intra_op_num_threads = args.threads
    try:
        sess = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise BadInput(f"{args.model}: ONNX Runtime cannot load the model: {e}") from e
    inputs = model_inputs(sess)
    out_names = [o.name for o in sess.get_outputs()]
    feeds = discover_feeds(args.data, inputs)

    results = []
    refs = []
    for feed_id, feed in feeds:
        try:
            outs = sess.run(out_names, feed)
        except Exception as e:
            raise BadInput(f"feed {feed_id}: ONNX Runtime failed to run the model: {e}") from e
        refs.append((feed_id, outs))

    report = {"model": args.model, "data": args.data, "feeds": len(feeds), "outputs": out_names,
              "reference": f"onnxruntime {ort.__version__} CPUExecutionProvider ORT_DISABLE_ALL"}

    if args.write_reference:
        out_dir = args.write_reference
        if os.path.abspath(out_dir) == os.path.abspath(args.data):
            raise BadInput("--write-reference must not be the --data folder")
        written = []
        for feed_id, outs in refs:
            folder = os.path.join(out_dir, feed_id)
            os.makedirs(folder, exist_ok=True)
            for name, arr in zip(out_names, outs):
                path = os.path.join(folder, sanitize(name) + ".npy")
                atomic_save(path, np.asarray(arr))
                written.append({"feed": feed_id, "output": name, "path": path, "shape": list(np.shape(arr)),
                                "dtype": np.asarray(arr).dtype.name})
        report.update(mode="write-reference", written=written)
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            for w in written:
                print(f"{w['feed']:<20} {w['output']:<24} {w['dtype']} {w['shape']} -> {w['path']}")
            print(f"wrote {len(written)} reference outputs for {len(feeds)} feeds under {out_dir}")
        return 0

    worst = 0.0
    failed = 0
    rows_out = []
    for feed_id, outs in refs:
        for name, ref in zip(out_names, outs):
            ref = np.asarray(ref)
            entry = {"feed": feed_id, "output": name, "status": "ok"}
            cands = [os.path.join(args.mpq_outputs, feed_id, sanitize(name) + ".npy")]
            if os.sep not in name and sanitize(name) != name:
                cands.append(os.path.join(args.mpq_outputs, feed_id, name + ".npy"))
            path = next((c for c in cands if os.path.isfile(c)), None)
            if path is None:
                entry.update(status="missing", detail=f"no file {cands[0]}")
            else:
                try:
                    got = np.load(path, allow_pickle=False)
                except Exception as e:
                    got = None
                    entry.update(status="unreadable", detail=f"{path}: {e}")
                if got is not None and got.shape != ref.shape:
                    entry.update(status="shape", detail=f"mpq shape {list(got.shape)} vs ORT {list(ref.shape)}")
                elif got is not None:
                    if got.dtype != ref.dtype:
                        entry["dtype_note"] = f"mpq {got.dtype.name} vs ORT {ref.dtype.name}"
                    rel, max_abs, rows, mism = compare(got, ref, args.argmax_tie_tol)
                    worst = max(worst, rel)
                    entry.update(rel_l2=rel, max_abs=max_abs, argmax_rows=rows, argmax_mismatches=mism)
                    if not rel <= args.rtol_l2:
                        entry["status"] = "rel_l2"
                    elif mism:
                        entry["status"] = "argmax"
            if entry["status"] != "ok":
                failed += 1
            rows_out.append(entry)

    passed = failed == 0
    report.update(mode="compare", mpq_outputs=args.mpq_outputs, rtol_l2=args.rtol_l2,
                  argmax_tie_tol=args.argmax_tie_tol, worst_rel_l2=worst, comparisons=len(rows_out),
                  failed=failed, passed=passed,
                  results=[{k: jsonable(v) for k, v in r.items()} for r in rows_out])
    if args.json:
        print(json.dumps({k: jsonable(v) for k, v in report.items()}, indent=2))
    else:
        print(f"{'feed':<20} {'output':<24} {'rel-L2':>10} {'max-abs':>10} {'argmax':>9}  status")
        for r in rows_out:
            if "rel_l2" in r:
                agree = f"{r['argmax_rows'] - r['argmax_mismatches']}/{r['argmax_rows']}"
                print(f"{r['feed']:<20} {r['output']:<24} {r['rel_l2']:>10.3e} {r['max_abs']:>10.3e} "
                      f"{agree:>9}  {'OK' if r['status'] == 'ok' else 'FAIL (' + r['status'] + ')'}")
            else:
                print(f"{r['feed']:<20} {r['output']:<24} {'-':>10} {'-':>10} {'-':>9}  FAIL ({r['status']}: {r['detail']})")
        verdict = "PASS" if passed else "FAIL"
        print(f"{verdict}: {len(rows_out)} comparisons over {len(feeds)} feeds, {failed} failed, "
              f"worst rel-L2 {worst:.3e} (threshold {args.rtol_l2:g})")
    return 0 if passed else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="the FP32 ONNX model")
    ap.add_argument("--data", required=True, help="feeds folder (docs/DESIGN.md data-directory layouts)")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--mpq-outputs", metavar="OUTDIR", help="mpq's outputs: OUTDIR/<feed id>/<output>.npy")
    mode.add_argument("--write-reference", metavar="OUTDIR", help="write ORT outputs in that layout instead")
    ap.add_argument("--rtol-l2", type=float, default=1e-5, help="largest relative L2 error allowed (default 1e-5)")
    ap.add_argument("--argmax-tie-tol", type=float, default=0.0,
                    help="excuse an argmax difference where the reference values differ by at most this")
    ap.add_argument("--threads", type=int, default=0, help="ORT intra-op threads (0: ORT default)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    try:
        return run(args)
    except BadInput as e:
        log(f"ort_check: {e}")
        return 2
    except Exception as e:  # internal error
        log(f"ort_check: internal error: {type(e).__name__}: {e}")
        return 3


if __name__ == "__main__":
    sys.exit(main())
