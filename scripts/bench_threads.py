#!/usr/bin/env python3
"""Benchmark (not a test): what a second thread (or more) gains, mpq against ONNX Runtime.

    bench_threads.py [--mpq build/apps/mpq/mpq] [--threads 2] [--rounds 7] [--repeat 300]
                     [--batches 1,8] [--stat median|min] [--int8 DIR] [--json FILE] [MODEL ...]

The issue's threading goal: on every model and batch, N threads must be faster than one, by at
least as much as ONNX Runtime gains. bench_run.py measures each thread count in its own pass, so
on a machine whose speed drifts (a shared VM) the gain it implies is as noisy as two separate
passes. Here each round times, per model and batch, mpq at one thread and at N threads and ONNX
Runtime at one and at N, back to back (same inputs as bench_run.py), and takes the gain of that
round (time at 1 / time at N). Reported per row: the median gain over the rounds of each engine,
the share of rounds in which mpq's gain is at least ORT's, and whether the goal holds on the
medians (mpq's gain >= ORT's and > 1). Each measurement is the median of its `--repeat` runs, or
with `--stat min` the fastest of them, for both engines alike: the goal is stated for a quiet
machine, and on a shared VM whose runs stray 10-60% above the fastest one within a process the
fastest run estimates that better (a second run without it gives the medians). Models and --int8
as in bench_run.py. A row also says in how
many of its mpq runs the idle threads slept because the machine looked busy when mpq started
(`idle_threads` in `mpq run --json`): those runs measured a disturbed machine, not mpq.
"""
import argparse
import json
import os
import statistics
import sys

import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_run as br  # noqa: E402


def ort_session(model, threads):
    so = ort.SessionOptions()  # all graph optimisations (the default), as in bench_run.py
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*")
    ap.add_argument("--mpq", default=os.path.join(br.ROOT, "build/apps/mpq/mpq"))
    ap.add_argument("--threads", type=int, default=2, help="the thread count compared with one")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=300, help="timed runs per measurement (the median kept, or the fastest with --stat min)")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--stat", choices=["median", "min"], default="median",
                    help="per measurement: the median of the timed runs, or the fastest (both engines alike)")
    ap.add_argument("--int8", metavar="DIR", help="also the INT8 QDQ models (made by mpq quantize into DIR)")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    args = ap.parse_args()
    if args.threads < 2:
        ap.error("--threads must be at least 2")
    models = args.models or [os.path.join(br.ROOT, m) for m in br.DEFAULT_MODELS]
    if args.int8:
        models += br.int8_models(args.mpq, args.int8)
    batches = [int(b) for b in args.batches.split(",")]
    print(br.blas_note(args.mpq))

    rows = []
    for model in models:
        sessions = {t: ort_session(model, t) for t in (1, args.threads)}
        fixed = br.fixed_batch(sessions[1])
        for batch in batches:
            if fixed is not None and fixed != batch:
                continue
            feeds = br.make_inputs(sessions[1], batch, seed=batch)  # bench_run.py's inputs
            times = {(e, t): [] for e in ("mpq", "ort") for t in (1, args.threads)}
            idle_modes = []
            for _ in range(args.rounds):
                for t in (1, args.threads):
                    times[("mpq", t)].append(br.time_mpq(args.mpq, model, feeds, args.repeat, t, idle_modes, args.stat))
                    times[("ort", t)].append(br.time_ort(sessions[t], feeds, args.repeat, args.stat))
            gains = {e: [a / b for a, b in zip(times[(e, 1)], times[(e, args.threads)])] for e in ("mpq", "ort")}
            row = {
                "model": os.path.basename(model), "batch": batch, "threads": args.threads, "rounds": args.rounds,
                "stat": args.stat,
                "mpq_ms": {str(t): statistics.median(times[("mpq", t)]) for t in (1, args.threads)},
                "ort_ms": {str(t): statistics.median(times[("ort", t)]) for t in (1, args.threads)},
                "mpq_gain": statistics.median(gains["mpq"]), "ort_gain": statistics.median(gains["ort"]),
                "rounds_at_least_ort": sum(m >= o for m, o in zip(gains["mpq"], gains["ort"])),
                # mpq runs whose idle threads slept: the machine looked busy when mpq started
                # (apps/mpq/main.cpp), which slows a small model on several threads.
                "mpq_runs_sleeping": sum(m == "sleep" for m in idle_modes),
            }
            row["meets"] = row["mpq_gain"] >= row["ort_gain"] and row["mpq_gain"] > 1.0
            rows.append(row)
            print(f"{row['model']:32s} {batch:3d}  mpq {row['mpq_ms']['1']:.3f} -> {row['mpq_ms'][str(args.threads)]:.3f} ms"
                  f" gain {row['mpq_gain']:.2f}   ORT {row['ort_ms']['1']:.3f} -> {row['ort_ms'][str(args.threads)]:.3f} ms"
                  f" gain {row['ort_gain']:.2f}   mpq >= ORT in {row['rounds_at_least_ort']}/{args.rounds} rounds"
                  f"{'' if row['meets'] else '   *'}"
                  f"{'   (mpq found the machine busy in ' + str(row['mpq_runs_sleeping']) + ' of ' + str(2 * args.rounds) + ' runs)' if row['mpq_runs_sleeping'] else ''}",
                  flush=True)
    met = sum(r["meets"] for r in rows)
    print(f"goal met (median gain >= ORT's and > 1; each measurement the {args.stat} of its runs) on {met} of "
          f"{len(rows)} rows")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
