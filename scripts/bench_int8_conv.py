#!/usr/bin/env python3
"""Benchmark (not a test): oneDNN's INT8 convolutions against its FP32 ones on every convolution of
an INT8 QDQ model, beside mpq's own time for each inside the model.

    bench_int8_conv.py [--mpq build/apps/mpq/mpq] [--driver build/tests/bench_conv_int8]
                       [--threads 1,2] [--batches 1,8] [--repeat 300] [--int8 DIR] [MODEL ...]

mpq's float path for an INT8 QDQ CNN: weights dequantized once at load, each activation's Q -> DQ
pair one mpq::FakeQuant, each convolution an FP32 mpq::FusedConv (on oneDNN or mpq's kernels,
whichever is faster for the shape). Since the twenty-first session the convolutions whose input and
weights lie on int8 grids run on oneDNN's int8 kernels instead (passes/int8_conv); run this with
MPQ_INT8_CONV=0 for the float path's in-model times, as docs/runtime.md's table was. For every convolution of the shipped CNNs' INT8 models (made by `mpq
quantize --mode static` into DIR, as bench_run.py does), this prints:
  mpq   its time inside the model (`mpq run --profile-nodes`, mean per run);
  f32   oneDNN's FP32 convolution of the same shape alone (bench_conv_int8);
  s8    oneDNN's INT8 convolution alone: int8 activations in and out, int8 per-channel weights,
        requantization in the output scales (how an INT8 engine chains its convolutions);
and per model the sums, the model's FakeQuant time (the passes an INT8 chain would fold into its
convolutions' outputs) and its whole latency. The convolutions are timed alone (input in cache),
the model's in a run (means per node, with the profiler's own cost per node; the model's latency is
the median of the same profiled runs): the sums say where INT8 would pay, not what a model would
take.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import shape_inference

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_run as br  # noqa: E402


def conv_shapes(path, batch):
    """(node name, 'N,C,H,M,CG,K,S,P') of every 2-D Conv with square input, kernel and stride."""
    m = shape_inference.infer_shapes(onnx.load(path))
    g = m.graph
    dims = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in list(g.value_info) + list(g.input)}
    inits = {i.name: list(i.dims) for i in g.initializer}
    out = []
    for n in g.node:
        if n.op_type != "Conv":
            continue
        a = {x.name: onnx.helper.get_attribute_value(x) for x in n.attribute}
        x, w = dims[n.input[0]], inits[n.input[1]]
        group, stride, pad = a.get("group", 1), a.get("strides", [1, 1]), a.get("pads", [0, 0, 0, 0])
        auto_pad = a.get("auto_pad", b"NOTSET")
        if x[2] != x[3] or w[2] != w[3] or stride[0] != stride[1] or len(set(pad)) != 1 \
                or auto_pad not in (b"NOTSET", b"") or any(d != 1 for d in a.get("dilations", [1, 1])):
            raise SystemExit(f"{path}: {n.name}: only square, explicitly padded, undilated convolutions are handled here")
        if x[1] != w[1] * group:
            raise SystemExit(f"{path}: {n.name}: {x[1]} input channels, but weights for {w[1] * group}")
        out.append((n.name, f"{batch},{x[1]},{x[2]},{w[0]},{w[1]},{w[2]},{stride[0]},{pad[0]}"))
    return out


def driver_rows(driver, shapes, threads, repeat):
    cmd = [driver, "--threads", str(threads), "--repeat", str(repeat)]
    for _, s in shapes:
        cmd += ["--conv", s]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    rows = [ln.split() for ln in out.stdout.splitlines()[2:] if ln.strip()]
    if len(rows) != len(shapes):
        raise RuntimeError(f"bench_conv_int8 printed {len(rows)} rows for {len(shapes)} convolutions")
    return [(float(r[8]), float(r[9])) for r in rows]


def model_profile(mpq, model, feeds, repeat, threads):
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "feed_0"))
        for name, arr in feeds.items():
            np.save(os.path.join(d, "feed_0", name + ".npy"), arr)
        out = subprocess.run([mpq, "run", model, "--data", d, "--repeat", str(repeat), "--threads", str(threads),
                              "--profile-nodes", "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    j = json.loads(out.stdout)
    return j["latency_ms"]["median"], j["profile"], j.get("idle_threads", "unknown")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", help="FP32 source models (default: bench_run.py's INT8 sources)")
    ap.add_argument("--mpq", default=os.path.join(br.ROOT, "build/apps/mpq/mpq"))
    ap.add_argument("--driver", default=os.path.join(br.ROOT, "build/tests/bench_conv_int8"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--repeat", type=int, default=300)
    ap.add_argument("--int8", default=os.path.join(tempfile.gettempdir(), "mpq_bench_int8"),
                    help="where the INT8 models are made (kept, so runs compare the same files)")
    ap.add_argument("--json", help="also write the per-model sums to this JSON file")
    args = ap.parse_args()
    sources = args.models or [os.path.join(br.ROOT, "tests/models", n + ".onnx") for n in br.INT8_SOURCES]
    made = {os.path.basename(q)[: -len("_int8.onnx")]: q for q in br.int8_models(args.mpq, args.int8)}
    summary = []
    for src in sources:
        name = os.path.basename(src)[: -len(".onnx")]
        if name not in made:
            raise SystemExit(f"{src}: no INT8 model (bench_run.py's INT8 sources: {', '.join(br.INT8_SOURCES)})")
        q = made[name]
        sess = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
        for batch in [int(b) for b in args.batches.split(",")]:
            shapes = conv_shapes(src, batch)
            feeds = br.make_inputs(sess, batch, seed=batch)
            for threads in [int(t) for t in args.threads.split(",")]:
                latency, profile, idle = model_profile(args.mpq, q, feeds, args.repeat, threads)
                in_model = {p["node"]: p["ms_per_run"] * 1000.0 for p in profile if "node" in p}
                fake_quant = sum(p["ms_per_run"] for p in profile if p["op"] == "mpq::FakeQuant") * 1000.0
                timed = driver_rows(args.driver, shapes, threads, args.repeat)
                print(f"\n{name} INT8, batch {batch}, {threads} thread(s): model {latency * 1000.0:.1f} us (median, "
                      f"profiled), its FakeQuant passes {fake_quant:.1f} us (mean), idle threads {idle}")
                print(f"  {'convolution':<34} {'N,C,H,M,CG,K,S,P':<22} {'mpq':>8} {'f32':>8} {'s8':>8} {'s8/mpq':>7}")
                sums = [0.0, 0.0, 0.0]
                for (node, shape), (f32, s8) in zip(shapes, timed):
                    mine = in_model.get(node)
                    if mine is None:
                        raise SystemExit(f"{q}: no profiled node {node} (was it fused away?)")
                    sums = [sums[0] + mine, sums[1] + f32, sums[2] + s8]
                    print(f"  {node[-34:]:<34} {shape:<22} {mine:8.2f} {f32:8.2f} {s8:8.2f} {s8 / mine:7.2f}")
                print(f"  {'all ' + str(len(shapes)) + ' convolutions':<34} {'':<22} {sums[0]:8.2f} {sums[1]:8.2f} "
                      f"{sums[2]:8.2f} {sums[2] / sums[0]:7.2f}", flush=True)
                summary.append({"model": name, "batch": batch, "threads": threads, "model_us": latency * 1000.0,
                                "fake_quant_us": fake_quant, "mpq_conv_us": sums[0], "onednn_f32_us": sums[1],
                                "onednn_s8_us": sums[2], "idle_threads": idle})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
