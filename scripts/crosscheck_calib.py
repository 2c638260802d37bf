#!/usr/bin/env python3
"""mpq calibrate's ranges agree with PyTorch, ONNX Runtime and numpy on the same activations.

    crosscheck_calib.py --mpq BUILD/apps/mpq/mpq [--parts ort,numpy,torch] [--percentile 99.999]

For each case (fashion_resnet on calib_data/calib, resnet_bn_op13 on its own feeds) it runs
`mpq calibrate` with --method minmax, --method percentile (int8: symmetric, one threshold on |x|)
and --method percentile --activation-type uint8 (asymmetric: both tails), reads the JSON tables,
and compares every tensor mpq calibrated with references computed on the activations ONNX Runtime
produces for the same feeds (the model with every float tensor exposed as an output, graph
optimizations off):

  part   reference                                              tolerance
  ort    onnxruntime.quantization MinMax calibrator (min, max)  float rounding: |d| <= 1e-5 * amax + 1e-7
         ORT Percentile calibrator (symmetric, 2048 bins)       one mpq bin + one ORT bin (ORT keeps a
                                                                bin edge, not an interpolated value)
  numpy  np.min / np.max                                        float rounding, as above
         np.percentile(|x|, p); np.percentile(x, [100-p, p])    one bin width of mpq's histogram
                                                                (R / bins, R the power of two above
                                                                the tensor's max |x|) + float rounding
  torch  torch.ao.quantization.MinMaxObserver (min_val/max_val) float rounding, as above

The references are also checked against each other: ORT's MinMax calibrator, numpy and torch see
the very same arrays, so their min/max must be identical bit for bit. mpq computes its activations
with its own kernels, hence the rounding tolerance (summation order in Conv/Gemm); graph inputs
must match exactly.

Exit 0 when everything agrees, 1 on any disagreement, 77 (skipped) when a part's library is missing
(onnxruntime and numpy are needed for anything; a missing torch skips only the torch part, and says
so; `--parts torch` exits 77 without torch so ctest shows it as skipped).
"""
import argparse
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, create_calibrator
except ImportError as e:
    print(f"SKIP: {e} (needs numpy, onnx and onnxruntime: scripts/setup.sh --python)")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = {
    "fashion_resnet": ("tests/models/fashion/fashion_resnet.onnx", "calib_data/calib"),
    "resnet_bn_op13": ("tests/models/resnet_bn_op13.onnx", "tests/models/resnet_bn_op13_data"),
}
ROUNDING_RTOL = 1e-5  # relative to the tensor's max |x|: last-bit differences of float sums
ROUNDING_ATOL = 1e-7


def read_feeds(data_dir, input_names):
    """Feeds in mpq's order for the two layouts used here: one subfolder per feed holding
    <input>.npy, or flat .npy files (single-input model, each file one feed used as is)."""
    entries = sorted(os.listdir(data_dir))
    subdirs = [e for e in entries if os.path.isdir(os.path.join(data_dir, e))]
    feeds = []
    if subdirs:
        for d in subdirs:
            feeds.append({n: np.load(os.path.join(data_dir, d, n + ".npy")) for n in input_names})
    else:
        if len(input_names) != 1:
            raise SystemExit(f"{data_dir}: flat .npy feeds need a single-input model")
        for f in entries:
            if f.endswith(".npy") and f not in ("labels.npy",):
                feeds.append({input_names[0]: np.load(os.path.join(data_dir, f))})
    if not feeds:
        raise SystemExit(f"{data_dir}: no feeds")
    return feeds


class Reader(CalibrationDataReader):
    def __init__(self, feeds):
        self.feeds = feeds
        self.i = 0

    def get_next(self):
        if self.i >= len(self.feeds):
            return None
        self.i += 1
        return self.feeds[self.i - 1]


def run_mpq(mpq, model, data, out, *extra):
    cmd = [mpq, "calibrate", model, "--data", data, "-o", out, *extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-1000:]}")
    import json
    with open(out) as f:
        return json.load(f)


def ort_activations(model_path, feeds, names, tmp):
    """Every named tensor over all feeds, flattened and concatenated, as ORT computes it."""
    from onnxruntime.quantization.quant_utils import load_model_with_shape_infer
    from pathlib import Path
    m = load_model_with_shape_infer(Path(model_path))
    infos = {vi.name: vi for vi in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output)}
    have = {o.name for o in m.graph.output}
    for n in names:
        if n not in have:
            m.graph.output.append(infos[n])
    path = os.path.join(tmp, "exposed.onnx")
    onnx.save(m, path)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    out_names = [o.name for o in sess.get_outputs()]
    per_feed = {n: [] for n in names}
    for feed in feeds:
        got = dict(zip(out_names, sess.run(None, feed)))
        for n in names:
            per_feed[n].append(feed[n] if n in feed else got[n])
    return per_feed


def ort_calibrator(model_path, feeds, method, tmp):
    cal = create_calibrator(model_path, augmented_model_path=os.path.join(tmp, f"aug_{method.name}.onnx"),
                            calibrate_method=method)
    if method == CalibrationMethod.MinMax:
        cal.collect_data(Reader(feeds))
    else:
        # ORT's histogram calibrators stack all feeds' outputs into one array, which fails when feeds
        # differ in batch size; one collect_data per feed merges into the same histograms instead.
        for feed in feeds:
            cal.collect_data(Reader([feed]))
    result = cal.compute_data()
    bin_widths = {}
    if method == CalibrationMethod.Percentile:
        for name, h in cal.collector.histogram_dict.items():
            bin_widths[name] = float(h[1][1] - h[1][0])
    def scalar(v):
        return float(np.asarray(v).reshape(-1)[0])
    return {k: (scalar(v.range_value[0]), scalar(v.range_value[1])) for k, v in result.data.items()}, bin_widths


class Checker:
    def __init__(self):
        self.failures = []
        self.worst = {}  # label -> (deviation in tolerances, tensor)
        self.count = {}

    def check(self, label, tensor, got, want, tol):
        dev = abs(got - want)
        ratio = dev / tol if tol > 0 else (0.0 if dev == 0 else float("inf"))
        self.count[label] = self.count.get(label, 0) + 1
        if label not in self.worst or ratio > self.worst[label][0]:
            self.worst[label] = (ratio, tensor, dev, tol)
        if not dev <= tol:
            self.failures.append(f"{label}: {tensor}: mpq {got!r} vs {want!r} (|d| {dev:.3g} > tol {tol:.3g})")

    def exact(self, label, tensor, a, b):
        self.count[label] = self.count.get(label, 0) + 1
        if label not in self.worst:
            self.worst[label] = (0.0, tensor, 0.0, 0.0)
        if not (a == b):
            self.worst[label] = (float("inf"), tensor, abs(a - b), 0.0)
            self.failures.append(f"{label}: {tensor}: {a!r} != {b!r} (the same arrays must give the same value)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mpq", default=os.path.join(ROOT, "build/apps/mpq/mpq"))
    ap.add_argument("--parts", default="ort,numpy,torch", help="comma-separated subset of ort,numpy,torch")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of " + ",".join(CASES))
    ap.add_argument("--percentile", type=float, default=99.999)
    ap.add_argument("--bins", type=int, default=2048)
    args = ap.parse_args()
    parts = set(p for p in args.parts.split(",") if p)
    if parts - {"ort", "numpy", "torch"}:
        ap.error(f"unknown part(s): {', '.join(sorted(parts - {'ort', 'numpy', 'torch'}))}")
    torch = None
    if "torch" in parts:
        try:
            import torch as _torch
            from torch.ao.quantization import MinMaxObserver  # noqa: F401
            torch = _torch
        except ImportError as e:
            if parts == {"torch"}:
                print(f"SKIP: torch part: {e}")
                return 77
            print(f"SKIPPED PART torch: {e} (PyTorch MinMaxObserver not checked)")
            parts.discard("torch")
    if not os.path.exists(args.mpq):
        print(f"error: mpq binary {args.mpq} not found (--mpq)")
        return 2

    p = args.percentile
    chk = Checker()
    summary = []
    linear_gap = [0.0, 0.0, ""]  # worst |mpq - numpy's default percentile| / amax, in bins, tensor
    ort_clamped = []
    for case in args.cases.split(","):
        model_rel, data_rel = CASES[case]
        model, data = os.path.join(ROOT, model_rel), os.path.join(ROOT, data_rel)
        with tempfile.TemporaryDirectory() as tmp:
            bins = ["--bins", str(args.bins)]
            t_minmax = run_mpq(args.mpq, model, data, os.path.join(tmp, "minmax.json"), "--method", "minmax")["tensors"]
            t_pct = run_mpq(args.mpq, model, data, os.path.join(tmp, "pct.json"), "--method", "percentile",
                            "--percentile", repr(p), *bins)["tensors"]
            t_pct_asym = run_mpq(args.mpq, model, data, os.path.join(tmp, "pct_u8.json"), "--method", "percentile",
                                 "--percentile", repr(p), "--activation-type", "uint8", *bins)["tensors"]
            m = onnx.load(model)
            initializers = {i.name for i in m.graph.initializer}
            input_names = [i.name for i in m.graph.input if i.name not in initializers]
            feeds = read_feeds(data, input_names)
            ort_minmax, _ = ort_calibrator(model, feeds, CalibrationMethod.MinMax, tmp)
            names = [n for n in t_minmax if n in ort_minmax]
            only_mpq = sorted(set(t_minmax) - set(ort_minmax))
            only_ort = sorted(set(ort_minmax) - set(t_minmax))
            if only_ort:
                chk.failures.append(f"{case}: ORT calibrates tensors mpq does not: {only_ort}")
            acts = ort_activations(model, feeds, names, tmp)
            n_values = 0
            for name in names:
                x = np.concatenate([a.reshape(-1) for a in acts[name]]).astype(np.float32)
                n_values += x.size
                mm = t_minmax[name]
                amax = max(abs(mm["min"]), abs(mm["max"]))
                rtol = 0.0 if name in input_names else ROUNDING_RTOL * amax + ROUNDING_ATOL
                # The histogram's range: the smallest power of two above max |x|.
                R = 2.0 ** np.floor(np.log2(amax)) * 2 if amax > 0 else 0.0
                bin_w = R / args.bins
                ref_min, ref_max = float(x.min()), float(x.max())
                if mm["count"] != x.size:
                    chk.failures.append(f"{case}: {name}: mpq counted {mm['count']} values, ORT produced {x.size}")
                # References against each other: the same arrays, so bit-identical.
                o_min, o_max = ort_minmax[name]
                chk.exact("ORT MinMax == numpy min", name, o_min, ref_min)
                chk.exact("ORT MinMax == numpy max", name, o_max, ref_max)
                if "ort" in parts:
                    chk.check("minmax: mpq vs ORT MinMax calibrator", name, mm["min"], o_min, rtol)
                    chk.check("minmax: mpq vs ORT MinMax calibrator", name, mm["max"], o_max, rtol)
                if "numpy" in parts:
                    chk.check("minmax: mpq vs numpy min/max", name, mm["min"], ref_min, rtol)
                    chk.check("minmax: mpq vs numpy min/max", name, mm["max"], ref_max, rtol)
                    # The empirical quantile x_(ceil(n p / 100)) (numpy's inverted_cdf) lies in the
                    # histogram bin where mpq's cumulative count reaches n p / 100, and mpq
                    # interpolates inside that bin: they differ by less than one bin width.
                    ax = np.abs(x)
                    pa = float(np.percentile(ax, p, method="inverted_cdf"))
                    chk.check(f"percentile {p} |x|: mpq vs numpy", name, t_pct[name]["amax"], pa, bin_w + rtol)
                    lo, hi = (float(v) for v in np.percentile(x, [100.0 - p, p], method="inverted_cdf"))
                    chk.check(f"percentile {p} signed: mpq vs numpy", name, t_pct_asym[name]["min"], lo, bin_w + rtol)
                    chk.check(f"percentile {p} signed: mpq vs numpy", name, t_pct_asym[name]["max"], hi, bin_w + rtol)
                    # numpy's default (linear between neighbours) differs by up to the gap between
                    # the two largest order statistics: reported, not gated.
                    gap = abs(t_pct[name]["amax"] - float(np.percentile(ax, p)))
                    if amax > 0 and gap / amax > linear_gap[0]:
                        linear_gap[:] = [gap / amax, gap / bin_w if bin_w else 0.0, f"{case}: {name}"]
                if torch is not None:
                    from torch.ao.quantization import MinMaxObserver
                    obs = MinMaxObserver(dtype=torch.quint8, qscheme=torch.per_tensor_affine)
                    for a in acts[name]:
                        obs(torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)))
                    t_min, t_max = float(obs.min_val), float(obs.max_val)
                    chk.exact("torch MinMaxObserver == numpy min", name, t_min, ref_min)
                    chk.exact("torch MinMaxObserver == numpy max", name, t_max, ref_max)
                    chk.check("minmax: mpq vs torch MinMaxObserver", name, mm["min"], t_min, rtol)
                    chk.check("minmax: mpq vs torch MinMaxObserver", name, mm["max"], t_max, rtol)
            if "ort" in parts:
                ort_pct, ort_bins = ort_calibrator(model, feeds, CalibrationMethod.Percentile, tmp)
                for name in names:
                    mm = t_minmax[name]
                    amax = max(abs(mm["min"]), abs(mm["max"]))
                    R = 2.0 ** np.floor(np.log2(amax)) * 2 if amax > 0 else 0.0
                    tol = R / args.bins + ort_bins.get(name, 0.0) + ROUNDING_RTOL * amax + ROUNDING_ATOL
                    ort_t = ort_pct[name][1]
                    # ORT clips its symmetric threshold to the signed max, so a tensor whose max is
                    # below its |min| gets a threshold that is no percentile of |x|: not comparable.
                    if ort_t == ort_minmax[name][1] and ort_minmax[name][1] < amax - tol:
                        ort_clamped.append(f"{case}: {name}")
                        continue
                    chk.check(f"percentile {p} |x|: mpq vs ORT Percentile calibrator", name, t_pct[name]["amax"],
                              ort_t, tol)
            summary.append(f"{case}: {len(feeds)} feed(s), {len(names)} tensors, {n_values:,} activation values"
                           + (f"; mpq also calibrates {len(only_mpq)} tensor(s) ORT does not: {only_mpq}" if only_mpq else ""))

    print("cases:")
    for s in summary:
        print("  " + s)
    print(f"tolerances: min/max |d| <= {ROUNDING_RTOL:g} * amax + {ROUNDING_ATOL:g} (0 for graph inputs); "
          f"percentile: + one mpq histogram bin (R/{args.bins}, R = power of two above max |x|)"
          "; vs ORT's percentile also + one ORT bin")
    print("worst agreement per check (|d| / tolerance, 1.0 = at the limit):")
    for label in sorted(chk.worst):
        ratio, tensor, dev, tol = chk.worst[label]
        if tol == 0 and dev == 0:
            print(f"  {label:<55} {chk.count[label]:4d} comparisons  all bit-identical")
        else:
            print(f"  {label:<55} {chk.count[label]:4d} comparisons  worst {ratio:6.3f}  (|d| {dev:.3g}, tol {tol:.3g}, {tensor})")
    if linear_gap[2]:
        print(f"  (info) numpy's default linear percentile vs mpq: worst {100 * linear_gap[0]:.3g}% of amax "
              f"({linear_gap[1]:.1f} bins, {linear_gap[2]}): the gap between neighbouring order statistics in a "
              "sparse tail, not a histogram error; gated against inverted_cdf instead")
    if ort_clamped:
        print(f"  (info) {len(ort_clamped)} tensor(s) not compared with ORT's percentile: ORT clips its symmetric "
              f"threshold to the signed max (below |min| there): {', '.join(ort_clamped)}")
    for part in ("ort", "numpy", "torch"):
        if part not in parts:
            print(f"SKIPPED PART {part}")
    if chk.failures:
        print(f"FAIL: {len(chk.failures)} disagreement(s):")
        for f in chk.failures[:40]:
            print("  " + f)
        return 1
    print("OK: mpq's ranges agree with " + ", ".join(sorted(parts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
