#!/usr/bin/env python3
"""Benchmark (not a test): calibration memory and time, mpq against ONNX Runtime's calibrators.

    bench_calibrate.py [--mpq build/apps/mpq/mpq] [--model M] [--small 200] [--large 2000] [--threads N]
                       [--repeat 3] [--skip-ort] [--json FILE]

Writes N single-image feeds (one subfolder each, Fashion-MNIST training images) and measures, each
in its own child process so peak RSS is the child's own:
  1. mpq calibrate (default method) on `small` and on `large` feeds: peak RSS must stay flat
     (within 10%) as the number of feeds grows 10x;
  2. mpq calibrate against a plain `mpq run` over the same feeds (target: <= 1.5x), and with
     `--tensors quantized` (what `mpq quantize --data` calibrates: the fused graph), entropy and minmax;
  3. ONNX Runtime's MinMax, Entropy and Percentile calibrators (onnxruntime.quantization) on the
     same model and feeds: peak RSS and time.
`mpq run` and `mpq calibrate` on the large set are run --repeat times, interleaved, and the best
(lowest) wall time of each is compared, so a burst of load from other processes on a shared machine
hits both alike; CPU time (user + system) of the same runs is printed beside it.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from fashion_data import load  # noqa: E402


TIME = "/usr/bin/time"


def child(cmd, env=None, cpu=None):
    """Runs cmd; returns (seconds, peak RSS MiB, stdout); appends user+system CPU seconds to cpu.

    Peak RSS comes from GNU time's own child: a process forked from this (large) Python process
    inherits its high-water mark, so wait4's ru_maxrss would report at least Python's RSS."""
    with tempfile.TemporaryFile("w+") as out_f, tempfile.TemporaryFile("w+") as err_f, \
            tempfile.NamedTemporaryFile("r", suffix=".rss") as rss_f:
        wrapped = [TIME, "-f", "%M", "-o", rss_f.name, *cmd] if os.access(TIME, os.X_OK) else cmd
        t0 = time.perf_counter()
        p = subprocess.Popen(wrapped, stdout=out_f, stderr=err_f, text=True, env=env)
        _, status, usage = os.wait4(p.pid, 0)
        secs = time.perf_counter() - t0
        out_f.seek(0)
        err_f.seek(0)
        out, err = out_f.read(), err_f.read()
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {err.strip()[-500:]}")
        rss_mib = usage.ru_maxrss / 1024.0
        if wrapped is not cmd:
            rss_mib = int(rss_f.read().split()[-1]) / 1024.0
    if cpu is not None:
        cpu.append(usage.ru_utime + usage.ru_stime)  # includes the waited-for grandchild
    return secs, rss_mib, out


def best_of(n, cmds):
    """Runs each command n times, interleaved; per command (best wall s, max peak RSS MiB, best CPU s)."""
    walls = [[] for _ in cmds]
    rsss = [[] for _ in cmds]
    cpus = [[] for _ in cmds]
    for _ in range(n):
        for k, cmd in enumerate(cmds):
            t, rss, _ = child(cmd, cpu=cpus[k])
            walls[k].append(t)
            rsss[k].append(rss)
    return [(min(walls[k]), max(rsss[k]), min(cpus[k])) for k in range(len(cmds))]


def write_feeds(root, images, input_name):
    for i, img in enumerate(images):
        d = os.path.join(root, f"feed_{i:05d}")
        os.makedirs(d)
        np.save(os.path.join(d, input_name + ".npy"), img[None])


ORT_CHILD = r"""
import sys, os, time, numpy as np
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, create_calibrator
model, data, method, out_dir = sys.argv[1:5]
class Reader(CalibrationDataReader):
    def __init__(self):
        self.dirs = sorted(os.path.join(data, d) for d in os.listdir(data))
        self.i = 0
    def get_next(self):
        if self.i >= len(self.dirs):
            return None
        d = self.dirs[self.i]; self.i += 1
        f = os.listdir(d)[0]
        return {f[:-4]: np.load(os.path.join(d, f))}
m = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
     "percentile": CalibrationMethod.Percentile}[method]
cal = create_calibrator(model, augmented_model_path=os.path.join(out_dir, "augmented.onnx"), calibrate_method=m)
cal.collect_data(Reader())
ranges = cal.compute_data()
print(len(ranges.data) if hasattr(ranges, "data") else len(ranges))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mpq", default=os.path.join(ROOT, "build/apps/mpq/mpq"))
    ap.add_argument("--model", default=os.path.join(ROOT, "tests/models/fashion/fashion_resnet.onnx"))
    ap.add_argument("--small", type=int, default=200)
    ap.add_argument("--large", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=3, help="runs of `mpq run` / `mpq calibrate` (best is kept)")
    ap.add_argument("--skip-ort", action="store_true")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()

    import onnx
    input_name = onnx.load(args.model, load_external_data=False).graph.input[0].name
    images, _ = load("train", count=args.large)
    results = {"model": os.path.basename(args.model), "threads": args.threads}
    with tempfile.TemporaryDirectory() as tmp:
        small_dir, large_dir = os.path.join(tmp, "small"), os.path.join(tmp, "large")
        write_feeds(small_dir, images[: args.small], input_name)
        write_feeds(large_dir, images, input_name)
        table = os.path.join(tmp, "t.json")
        thr = ["--threads", str(args.threads)]
        (t_run, rss_run, cpu_run), (t_large, rss_large, cpu_large), (t_q, _, cpu_q), (t_qmm, _, _) = best_of(args.repeat, [
            [args.mpq, "run", args.model, "--data", large_dir, *thr],
            [args.mpq, "calibrate", args.model, "--data", large_dir, "-o", table, *thr],
            [args.mpq, "calibrate", args.model, "--data", large_dir, "-o", table, "--tensors", "quantized", *thr],
            [args.mpq, "calibrate", args.model, "--data", large_dir, "-o", table, "--tensors", "quantized",
             "--method", "minmax", *thr]])
        t_small, rss_small, _ = child([args.mpq, "calibrate", args.model, "--data", small_dir, "-o", table, *thr])
        results.update({"mpq_run_s": t_run, "mpq_run_rss_mib": rss_run,
                        "mpq_calibrate_small_s": t_small, "mpq_calibrate_small_rss_mib": rss_small,
                        "mpq_calibrate_large_s": t_large, "mpq_calibrate_large_rss_mib": rss_large})
        print(f"model {results['model']}, {args.threads} threads")
        results.update({"mpq_run_cpu_s": cpu_run, "mpq_calibrate_large_cpu_s": cpu_large, "repeat": args.repeat})
        print(f"mpq run        {args.large:>5} feeds: {t_run:7.2f} s (CPU {cpu_run:6.2f} s)  peak RSS {rss_run:7.1f} MiB"
              f"  [best of {args.repeat}]")
        print(f"mpq calibrate  {args.small:>5} feeds: {t_small:7.2f} s  peak RSS {rss_small:7.1f} MiB")
        print(f"mpq calibrate  {args.large:>5} feeds: {t_large:7.2f} s (CPU {cpu_large:6.2f} s)  peak RSS {rss_large:7.1f} MiB"
              f"  [best of {args.repeat}]")
        print(f"  RSS {args.large} vs {args.small} feeds: {100 * (rss_large / rss_small - 1):+.1f}% (target within 10%)")
        print(f"  calibrate / run time on {args.large} feeds: {t_large / t_run:.2f}x wall (target <= 1.5x), "
              f"{cpu_large / cpu_run:.2f}x CPU")
        # What `mpq quantize --data` does: only the tensors QDQ export reads, on the fused graph.
        results.update({"mpq_calibrate_quantized_s": t_q, "mpq_calibrate_quantized_minmax_s": t_qmm})
        print(f"  --tensors quantized: entropy {t_q:.2f} s = {t_q / t_run:.2f}x run ({cpu_q / cpu_run:.2f}x CPU), "
              f"minmax {t_qmm:.2f} s = {t_qmm / t_run:.2f}x run (target <= 1.2x)  [best of {args.repeat}]")
        for method in ([] if args.skip_ort else ["minmax", "entropy", "percentile"]):
            env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
            try:
                t, rss, _ = child([sys.executable, "-c", ORT_CHILD, args.model, large_dir, method, tmp], env)
            except RuntimeError as e:
                print(f"ORT {method}: failed: {e}")
                continue
            mpq_t, mpq_rss = t_large, rss_large
            if method != "entropy":
                mpq_t, mpq_rss, _ = child([args.mpq, "calibrate", args.model, "--data", large_dir, "-o", table,
                                           "--method", method, "--threads", str(args.threads)])
            results[f"ort_{method}_s"] = t
            results[f"ort_{method}_rss_mib"] = rss
            results[f"mpq_{method}_s"] = mpq_t
            results[f"mpq_{method}_rss_mib"] = mpq_rss
            print(f"{method:<10} {args.large} feeds: ORT {t:7.2f} s {rss:7.1f} MiB | mpq {mpq_t:7.2f} s {mpq_rss:7.1f} MiB"
                  f" | mpq memory {100 * mpq_rss / rss:.0f}% of ORT, time {mpq_t / t:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
