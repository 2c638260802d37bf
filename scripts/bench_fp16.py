#!/usr/bin/env python3
"""FP16 conversion side by side: `mpq convert --fp16` vs onnxconverter-common's convert_float_to_float16.

Usage: bench_fp16.py --mpq BUILD/apps/mpq/mpq --out DIR [--models a.onnx ...] [--fashion-count N]
                     [--testdata ROOT] [--json FILE]

For every model (default: tests/models/*.onnx and tests/models/fashion/*.onnx) both converters run
with the FP32 graph interface kept (mpq's default; keep_io_types=True for onnxconverter-common), and
each converted model is judged on:
  - loads:  ONNX Runtime (CPU) creates a session; mpq loads and verifies it;
  - ORT:    outputs of ONNX Runtime on the model's data vs the FP32 model in ONNX Runtime (cosine,
            top-1 agreement). ORT's CPU provider runs most FP16 nodes in FP32 behind Casts, so this
            column hides FP16 overflow;
  - FP16:   outputs of mpq's executor, which runs FP16 nodes in FP16 storage as FP16 hardware does
            (overflow to inf included), vs the FP32 model (cosine, inf/NaN count, top-1);
  - size (% of the FP32 file) and Cast nodes.
Fashion-MNIST classifiers are also scored on all 10,000 test images (Debian dataset-fashion-mnist):
accuracy of FP32, of both conversions in ORT and in FP16 execution, and top-1 agreement with FP32.
With --testdata, every ONNX backend test model that ONNX Runtime loads is converted by both tools
and checked for loading, running and matching the expected outputs.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)


def occ_convert(src, dst):
    from onnxconverter_common import float16
    model = onnx.load(src)
    m16 = float16.convert_float_to_float16(model, keep_io_types=True)
    onnx.save(m16, dst)


def mpq_convert(mpq, src, dst, extra=()):
    r = subprocess.run([mpq, "convert", "--fp16", src, "-o", dst, "--json", *extra], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}")
    return json.loads(r.stdout)


def session(path):
    so = ort.SessionOptions()
    so.log_severity_level = 4
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def first_line(e, n=160):
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:n]


def metrics(got, want):
    a = np.asarray(got, dtype=np.float64).ravel()
    b = np.asarray(want, dtype=np.float64).ravel()
    nonfinite = int(np.count_nonzero(~np.isfinite(a) & np.isfinite(b)))
    fin = np.isfinite(a) & np.isfinite(b)
    a2, b2 = a[fin], b[fin]
    na, nb = np.linalg.norm(a2), np.linalg.norm(b2)
    cos = 1.0 if na == 0 and nb == 0 else (0.0 if na == 0 or nb == 0 else float(a2 @ b2 / (na * nb)))
    if nonfinite:
        cos = float("nan")
    rows = agree = 0
    g, w = np.asarray(got), np.asarray(want)
    if w.ndim >= 1 and w.shape[-1] >= 2 and w.dtype.kind == "f":
        ga = np.nan_to_num(g.reshape(-1, w.shape[-1]).astype(np.float64), nan=-np.inf)
        wa = w.reshape(-1, w.shape[-1])
        rows = ga.shape[0]
        agree = int(np.count_nonzero(ga.argmax(1) == wa.argmax(1)))
    return cos, nonfinite, rows, agree


def model_feeds(model_path, sess):
    """Feeds from <stem>_data/<feed>/<input>.npy, or the Fashion-MNIST eval images."""
    stem = os.path.splitext(os.path.basename(model_path))[0]
    data = os.path.join(os.path.dirname(model_path), stem + "_data")
    names = [i.name for i in sess.get_inputs()]
    feeds = []
    if os.path.isdir(data):
        for sub in sorted(os.listdir(data)):
            folder = os.path.join(data, sub)
            if os.path.isdir(folder):
                feeds.append({n: np.load(os.path.join(folder, n + ".npy")) for n in names})
    return feeds


def mpq_run(mpq, model, feeds, tmp):
    """Outputs of mpq's executor (FP16 storage) for each feed: list of lists of arrays."""
    data = os.path.join(tmp, "feeds")
    outs = os.path.join(tmp, "outs")
    for d in (data, outs):
        subprocess.run(["rm", "-rf", d])
        os.makedirs(d)
    for k, f in enumerate(feeds):
        os.makedirs(os.path.join(data, f"f{k:05d}"))
        for n, a in f.items():
            np.save(os.path.join(data, f"f{k:05d}", n + ".npy"), a)
    r = subprocess.run([mpq, "run", model, "--data", data, "--outputs", outs], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}")
    sess_names = [o.name for o in onnx.load(model, load_external_data=False).graph.output]
    result = []
    for k in range(len(feeds)):
        result.append([np.load(os.path.join(outs, f"f{k:05d}", "".join(c if c.isalnum() or c in "._-" else "_" for c in n) + ".npy"))
                       for n in sess_names])
    return result


def count_casts(path):
    m = onnx.load(path, load_external_data=False)
    return sum(1 for n in m.graph.node if n.op_type == "Cast")


def judge(mpq, fp32_path, cand_path, feeds, ref_outs, tmp, fashion=None):
    r = {"size_pct": 100.0 * os.path.getsize(cand_path) / os.path.getsize(fp32_path), "casts": count_casts(cand_path)}
    try:
        sess = session(cand_path)
        r["ort_loads"] = True
    except Exception as e:
        r["ort_loads"] = False
        r["ort_error"] = first_line(e)
        sess = None
    if sess is not None and feeds:
        try:
            worst = (1.0, 0, 0, 0)
            for f, want in zip(feeds, ref_outs):
                got = sess.run(None, f)
                for g, w in zip(got, want):
                    c = metrics(g, w)
                    worst = (min(worst[0], c[0]) if not np.isnan(c[0]) else float("nan"), worst[1] + c[1],
                             worst[2] + c[2], worst[3] + c[3])
            r["ort_cosine"], r["ort_nonfinite"], r["ort_rows"], r["ort_top1"] = worst
        except Exception as e:
            r["ort_run_error"] = first_line(e)
    if feeds:
        try:
            outs = mpq_run(mpq, cand_path, feeds, tmp)
            worst = (1.0, 0, 0, 0)
            for got, want in zip(outs, ref_outs):
                for g, w in zip(got, want):
                    c = metrics(g, w)
                    worst = (min(worst[0], c[0]) if not np.isnan(c[0]) else float("nan"), worst[1] + c[1],
                             worst[2] + c[2], worst[3] + c[3])
            r["fp16_cosine"], r["fp16_nonfinite"], r["fp16_rows"], r["fp16_top1"] = worst
        except Exception as e:
            r["fp16_error"] = first_line(e)
    if fashion is not None:
        images, labels, ref_pred = fashion
        if sess is not None:
            pred = np.concatenate([sess.run(None, {sess.get_inputs()[0].name: images[i:i + 1000]})[0].argmax(1)
                                   for i in range(0, len(images), 1000)])
            r["fashion_ort_acc"] = float(np.mean(pred == labels))
            r["fashion_ort_agree"] = int(np.count_nonzero(pred == ref_pred))
        try:
            chunks = [{"input": images[i:i + 1000]} for i in range(0, len(images), 1000)]
            outs = mpq_run(mpq, cand_path, chunks, tmp)
            logits = np.concatenate([o[0] for o in outs]).astype(np.float64)
            pred = np.nan_to_num(logits, nan=-np.inf).argmax(1)
            r["fashion_fp16_acc"] = float(np.mean(pred == labels))
            r["fashion_fp16_agree"] = int(np.count_nonzero(pred == ref_pred))
            r["fashion_fp16_nonfinite"] = int(np.count_nonzero(~np.isfinite(logits)))
        except Exception as e:
            r["fashion_fp16_error"] = first_line(e)
    return r


def bench_models(args, tmp):
    models = args.models or (sorted(os.path.join(ROOT, "tests/models", f) for f in os.listdir(os.path.join(ROOT, "tests/models"))
                                    if f.endswith(".onnx"))
                             + sorted(os.path.join(ROOT, "tests/models/fashion", f)
                                      for f in os.listdir(os.path.join(ROOT, "tests/models/fashion")) if f.endswith(".onnx")))
    fashion_data = None
    if any("/fashion/" in m for m in models):
        from fashion_data import load
        images, labels = load("test", count=args.fashion_count)
        fashion_data = (images, labels)
    rows = []
    for path in models:
        stem = os.path.splitext(os.path.basename(path))[0]
        print(f"[bench] {stem}", file=sys.stderr, flush=True)
        ref = session(path)
        feeds = model_feeds(path, ref)
        fashion = None
        if "/fashion/" in path and fashion_data is not None:
            images, labels = fashion_data
            feeds = [{ref.get_inputs()[0].name: images[:64]}]
            ref_pred = np.concatenate([ref.run(None, {ref.get_inputs()[0].name: images[i:i + 1000]})[0].argmax(1)
                                       for i in range(0, len(images), 1000)])
            fashion = (images, labels, ref_pred)
        ref_outs = [ref.run(None, f) for f in feeds]
        row = {"model": stem, "fp32_bytes": os.path.getsize(path)}
        if fashion is not None:
            row["fashion_fp32_acc"] = float(np.mean(fashion[2] == fashion[1]))
            row["fashion_images"] = int(len(fashion[1]))
        for tool in ("mpq", "occ"):
            dst = os.path.join(args.out, f"{stem}.{tool}.onnx")
            t0 = time.time()
            try:
                if tool == "mpq":
                    info = mpq_convert(args.mpq, path, dst)
                else:
                    occ_convert(path, dst)
                    info = None
            except Exception as e:
                row[tool] = {"convert_error": first_line(e)}
                continue
            res = judge(args.mpq, path, dst, feeds, ref_outs, tmp, fashion)
            res["seconds"] = time.time() - t0
            if info:
                res["kept_fp32"] = info["nodes_fp32"]
                res["islands"] = info["fp32_islands"]["count"]
                res["max_casts_per_island"] = info["fp32_islands"]["max_casts_per_island"]
            row[tool] = res
        rows.append(row)
    return rows


def bench_testdata(args, tmp):
    """Every ONNX backend test model ORT loads: convert with both tools, load, run, compare."""
    sys.path.insert(0, HERE)
    from ort_check_converted import compare, feeds_of_case
    summary = {t: {"converted": 0, "convert_fail": 0, "load_fail": 0, "run_fail": 0, "mismatch": 0, "ok": 0, "examples": []}
               for t in ("mpq", "occ")}
    total = 0
    for suite in ("node", "pytorch-converted", "pytorch-operator", "simple"):
        root = os.path.join(args.testdata, suite)
        for case in sorted(os.listdir(root)):
            src = os.path.join(root, case, "model.onnx")
            if not os.path.exists(src):
                continue
            try:
                ref = session(src)
            except Exception:
                continue
            try:
                feeds = feeds_of_case(os.path.join(root, case), ref)
            except Exception:
                continue  # test data that is not a plain tensor (sequences, optionals): nothing to compare
            total += 1
            for tool in ("mpq", "occ"):
                s = summary[tool]
                dst = os.path.join(tmp, f"td.{tool}.onnx")
                try:
                    if tool == "mpq":
                        mpq_convert(args.mpq, src, dst)
                    else:
                        occ_convert(src, dst)
                    s["converted"] += 1
                except Exception as e:
                    s["convert_fail"] += 1
                    if tool == "mpq" and "unsupported" not in str(e).lower():
                        s["examples"].append(f"{suite}/{case}: convert: {first_line(e)}")
                    continue
                try:
                    sess = session(dst)
                except Exception as e:
                    s["load_fail"] += 1
                    if len(s["examples"]) < 400:
                        s["examples"].append(f"{suite}/{case}: load: {first_line(e, 120)}")
                    continue
                status = "ok"
                try:
                    for name, feed, expected in feeds:
                        got = sess.run(None, feed)
                        for k, (g, w) in enumerate(zip(got, expected)):
                            d = compare(g, w, sess.get_outputs()[k].name)
                            if d and status == "ok":
                                status = "mismatch"
                                if len(s["examples"]) < 400:
                                    s["examples"].append(f"{suite}/{case}: {d}")
                except Exception as e:
                    status = "run_fail"
                    if len(s["examples"]) < 400:
                        s["examples"].append(f"{suite}/{case}: run: {first_line(e, 120)}")
                s[status] += 1
    return {"models_ort_loads": total, "tools": summary}


def fmt_cos(r, key):
    if f"{key}_error" in r:
        return "error"
    if f"{key}_cosine" not in r:
        return "-"
    c = r[f"{key}_cosine"]
    if isinstance(c, float) and np.isnan(c):
        return f"inf/NaN ({r.get(key + '_nonfinite', 0)})"
    return f"{c:.6f}"


def print_table(rows):
    print("| model | tool | ORT loads | cosine in ORT | cosine in FP16 execution | top-1 (FP16 exec) | size % | Casts | notes |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        for tool in ("mpq", "occ"):
            r = row.get(tool, {})
            if "convert_error" in r:
                print(f"| {row['model']} | {tool} | - | - | - | - | - | - | conversion failed: {r['convert_error']} |")
                continue
            notes = []
            if not r.get("ort_loads"):
                notes.append(f"ORT: {r.get('ort_error', '')}")
            if "ort_run_error" in r:
                notes.append(f"ORT run: {r['ort_run_error']}")
            if "fp16_error" in r:
                notes.append(f"mpq: {r['fp16_error']}")
            if "max_casts_per_island" in r:
                notes.append(f"{r['kept_fp32']} FP32 nodes, {r['islands']} islands, <= {r['max_casts_per_island']} Casts/island")
            if "fashion_fp16_acc" in r or "fashion_ort_acc" in r:
                n = row["fashion_images"]
                notes.append(f"Fashion-MNIST {n} images: FP32 acc {row['fashion_fp32_acc']:.4f}, "
                             f"ORT acc {r.get('fashion_ort_acc', float('nan')):.4f} (agree {r.get('fashion_ort_agree', '-')}/{n}), "
                             f"FP16 acc {r.get('fashion_fp16_acc', float('nan')):.4f} (agree {r.get('fashion_fp16_agree', '-')}/{n})")
            top1 = f"{r['fp16_top1']}/{r['fp16_rows']}" if r.get("fp16_rows") else "-"
            print(f"| {row['model']} | {tool} | {'yes' if r.get('ort_loads') else 'NO'} | {fmt_cos(r, 'ort')} | "
                  f"{fmt_cos(r, 'fp16')} | {top1} | {r.get('size_pct', 0):.1f} | {r.get('casts', '-')} | {'; '.join(notes)} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mpq", required=True, help="the mpq binary")
    ap.add_argument("--out", required=True, help="folder for the converted models")
    ap.add_argument("--models", nargs="*", help="models to compare (default: tests/models and tests/models/fashion)")
    ap.add_argument("--fashion-count", type=int, default=10000, help="Fashion-MNIST test images to score (default all 10000)")
    ap.add_argument("--testdata", help="also sweep the ONNX backend test data under this root")
    ap.add_argument("--json", help="write the raw results here")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench_fp16_") as tmp:
        rows = bench_models(args, tmp)
        print_table(rows)
        sys.stdout.flush()  # the model table stands on its own while the test-data sweep runs
        result = {"onnxruntime": ort.__version__, "models": rows}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2, default=str)
        if args.testdata:
            td = bench_testdata(args, tmp)
            result["testdata"] = td
            print()
            print(f"ONNX backend test models that ORT loads: {td['models_ort_loads']}")
            print("| tool | converted | conversion failed | converted model does not load in ORT | fails to run | "
                  "mismatch | load, run and match |")
            print("| --- | --- | --- | --- | --- | --- | --- |")
            for tool, s in td["tools"].items():
                print(f"| {tool} | {s['converted']} | {s['convert_fail']} | {s['load_fail']} | {s['run_fail']} | "
                      f"{s['mismatch']} | {s['ok']} |")
            for tool, s in td["tools"].items():
                for e in s["examples"][:60]:
                    print(f"  {tool}: {e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
