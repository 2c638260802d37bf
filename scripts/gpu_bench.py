#!/usr/bin/env python3
"""GPU figures for docs/gpu.md, measured in one run on the GPU machine (scripts/gpu_check.sh calls
this with the machine's python3, which has torch, onnx, onnxruntime and numpy). Every figure is a
ratio against a reference measured in the same run on the same GPU:

  gemm      mpq's cuBLASLt GEMM (bin/bench_cuda_gemm: plan_gemm -> the executor's gemm entry) at
            4096 and 8192 square, FP32 / TF32 / FP16 / BF16 / INT8, against a PyTorch matmul of the
            same shape and type (torch._int_mm for INT8): the practical peak. Goal FP16, INT8 >= 70%.
  latency   `mpq run --device cuda --repeat` on the shipped models, FP32 / FP16 (mpq convert) /
            INT8 QDQ (mpq quantize --mode static), batch 1 and 64, against PyTorch eager (the same
            ONNX graph run op by op on torch CUDA tensors by scripts/onnx_torch.py, inputs already
            on the GPU) and ONNX Runtime (CUDA provider when the installed onnxruntime has one,
            else its CPU provider, said in the row). Goal mpq <= PyTorch eager.
  qat_step  one label-free QAT step (forward of the fake-quant student and the FP32 teacher,
            KL distillation loss, backward, AdamW update) with AMP FP16 (autocast + GradScaler) in
            PyTorch eager on the demo model at batch 64, and the same step in FP32 (autocast off);
            mpq's `qat-finetune --device cuda` (FP32: AMP on the GPU is not written) at batch 64,
            its training seconds over the steps (teacher and update on the GPU, loss on the host, included).
  validate  `mpq validate --device cuda` against `--device cpu` on calib_data/eval (1,000 images),
            INT8 and FP16 candidates of the demo model: the same exit status and every metric
            within 1e-5.

    python3 scripts/gpu_bench.py --bundle DIR [--repo ROOT] [--json OUT] [--sections gemm,latency,...]
                                 [--torch-device cuda] [--repeat 50] [--quick]
--torch-device cpu with MPQ_CUDA_EMULATE=host runs the whole script on a machine without a GPU (a
dry run of the plumbing; its numbers mean nothing).
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name, FP32 model (repo-relative), input shape without the batch dimension, has INT8 QDQ version
MODELS = [
    ("resnet_bn", "tests/models/resnet_bn_op13.onnx", (3, 32, 32)),
    ("mobilenetv3", "tests/models/mobilenetv3_op13.onnx", (3, 32, 32)),
    ("unet", "tests/models/unet_op13.onnx", (3, 32, 32)),
    ("transformer", "tests/models/transformer_op13.onnx", (16, 64)),
    ("fashion_demo", "calib_data/demo.onnx", (1, 28, 28)),
]


def log(*a):
    print(*a, flush=True)


def run(cmd, timeout=300, env=None):
    t = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=None if env is None else {**os.environ, **env})
    return r.returncode, r.stdout, r.stderr, time.time() - t


def bench_models_dir(bundle):
    return os.path.join(bundle, "data", "bench")


# ---------------------------------------------------------------- gemm
def torch_matmul_tflops(torch, n, kind, device, repeat):
    g = torch.Generator(device="cpu").manual_seed(0)
    if kind == "int8":
        a = torch.randint(-127, 128, (n, n), dtype=torch.int8, generator=g).to(device)
        b = torch.randint(-127, 128, (n, n), dtype=torch.int8, generator=g).to(device).t()  # column-major, as TN
        f = lambda: torch._int_mm(a, b)
    else:
        dt = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[kind]
        a = torch.rand((n, n), generator=g).mul_(2).sub_(1).to(device=device, dtype=dt)
        b = torch.rand((n, n), generator=g).mul_(2).sub_(1).to(device=device, dtype=dt)
        f = lambda: a @ b
    torch.backends.cuda.matmul.allow_tf32 = kind == "tf32"
    ms = time_device(torch, f, device, repeat, warmup=3)
    torch.backends.cuda.matmul.allow_tf32 = False
    return 2.0 * n ** 3 / (ms * 1e-3) / 1e12, ms


def time_device(torch, f, device, repeat, warmup=3):
    """Median milliseconds of f(): CUDA events on a GPU, the host clock on the CPU."""
    for _ in range(warmup):
        f()
    if device == "cuda":
        torch.cuda.synchronize()
        ts = []
        for _ in range(repeat):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            f()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1))
        return statistics.median(ts)
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def section_gemm(args, torch):
    rows = []
    sizes = "4096" if args.quick else "4096,8192"
    rc, out, err, _ = run([os.path.join(args.bundle, "bin", "bench_cuda_gemm"), "--sizes", sizes, "--repeat", "10"], 600)
    mpq = {}
    for line in out.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            mpq[(d["type"], d["n"])] = d
    if rc not in (0, 1):
        log(f"bench_cuda_gemm exited {rc}: {out.strip()[-300:]} {err.strip()[-500:]}")
    for n in [int(s) for s in sizes.split(",")]:
        for kind in ("fp32", "tf32", "fp16", "bf16", "int8"):
            row = {"n": n, "type": kind}
            m = mpq.get((kind, n))
            if m:
                row.update(mpq_tflops=m.get("tflops"), mpq_ok=m.get("ok"), mpq_max_rel_err=m.get("max_rel_err"), mpq_error=m.get("error"))
            else:
                row["mpq_error"] = f"no result (bench_cuda_gemm rc {rc})"
            try:
                t, _ = torch_matmul_tflops(torch, n if args.torch_device == "cuda" else 256, kind, args.torch_device, 10)
                row["torch_tflops"] = t
            except Exception as e:  # noqa: BLE001 -- reported in the row
                row["torch_error"] = f"{type(e).__name__}: {e}"[:200]
            if row.get("mpq_tflops") and row.get("torch_tflops"):
                row["mpq_over_peak"] = row["mpq_tflops"] / row["torch_tflops"]
            rows.append(row)
            log("gemm", json.dumps(row))
    return rows


# ---------------------------------------------------------------- latency
def make_feed(tmp, name, shape, batch):
    d = os.path.join(tmp, f"{name}_b{batch}", "feed_0")
    os.makedirs(d, exist_ok=True)
    x = np.random.default_rng(0).standard_normal((batch,) + shape).astype(np.float32)
    np.save(os.path.join(d, "input.npy"), x)
    return os.path.dirname(d), x


def mpq_latency(args, model, data):
    rc, out, err, _ = run([args.mpq, "run", model, "--data", data, "--device", args.mpq_device, "--repeat", str(args.repeat), "--json"])
    if rc != 0:
        return None, f"mpq run exited {rc}: {err.strip()[-300:]}"
    d = json.loads(out)
    # "<op> has no CUDA kernel (<why>): it runs on the CPU ..." (runtime/cuda/context.cpp), once per op type
    fallbacks = sorted({ln.split("]")[-1].split(" has no CUDA kernel")[0].strip() for ln in err.splitlines() if " has no CUDA kernel" in ln})
    return d["latency_ms"]["median"], ("CPU fallback: " + ",".join(fallbacks)) if fallbacks else None


def torch_latency(args, torch, OnnxTorch, onnx, model, x, half):
    g = OnnxTorch(onnx.load(model), device=args.torch_device, half=half)
    xt = torch.from_numpy(x).to(args.torch_device)
    if half:
        xt = xt.half()
    with torch.no_grad():
        return time_device(torch, lambda: g.run({"input": xt}), args.torch_device, args.repeat)


def ort_latency(args, ort, model, x):
    providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in ort.get_available_providers()]
    if args.torch_device != "cuda":
        providers = ["CPUExecutionProvider"]
    s = ort.InferenceSession(model, providers=providers)
    name = s.get_inputs()[0].name
    feed = {name: x.astype(np.float16) if s.get_inputs()[0].type == "tensor(float16)" else x}
    for _ in range(3):
        s.run(None, feed)
    ts = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        s.run(None, feed)
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts), s.get_providers()[0]


def section_latency(args, torch):
    import onnx
    import onnxruntime as ort
    sys.path.insert(0, os.path.join(args.repo, "scripts"))
    from onnx_torch import OnnxTorch
    rows = []
    bench = bench_models_dir(args.bundle)
    with tempfile.TemporaryDirectory() as tmp:
        for name, rel, shape in MODELS:
            fp32 = os.path.join(args.repo, rel)
            variants = [("fp32", fp32), ("fp16", os.path.join(bench, f"{name}_fp16.onnx")), ("int8", os.path.join(bench, f"{name}_int8.onnx"))]
            for batch in (1, 64):
                data, x = make_feed(tmp, name, shape, batch)
                for prec, path in variants:
                    if not os.path.exists(path):
                        continue
                    row = {"model": name, "precision": prec, "batch": batch}
                    try:
                        row["mpq_ms"], note = mpq_latency(args, path, data)
                        if note:
                            row["mpq_note"] = note
                    except Exception as e:  # noqa: BLE001
                        row["mpq_note"] = f"{type(e).__name__}: {e}"[:200]
                    if prec != "int8":  # PyTorch eager has no INT8 path for these graphs on the GPU
                        try:
                            row["torch_ms"] = torch_latency(args, torch, OnnxTorch, onnx, fp32, x, prec == "fp16")
                        except Exception as e:  # noqa: BLE001
                            row["torch_note"] = f"{type(e).__name__}: {e}"[:200]
                    try:
                        row["ort_ms"], row["ort_provider"] = ort_latency(args, ort, path, x)
                    except Exception as e:  # noqa: BLE001
                        row["ort_note"] = f"{type(e).__name__}: {e}"[:200]
                    if row.get("mpq_ms") and row.get("torch_ms"):
                        row["mpq_over_torch"] = row["mpq_ms"] / row["torch_ms"]
                    if row.get("mpq_ms") and row.get("ort_ms"):
                        row["mpq_over_ort"] = row["mpq_ms"] / row["ort_ms"]
                    rows.append(row)
                    log("latency", json.dumps(row))
    return rows


# ---------------------------------------------------------------- QAT step
def section_qat(args, torch):
    import onnx
    sys.path.insert(0, os.path.join(args.repo, "scripts"))
    from onnx_torch import OnnxTorch, fake_quant_student
    dev = args.torch_device
    student, params, _ = fake_quant_student(onnx.load(os.path.join(bench_models_dir(args.bundle), "fashion_demo_fq.onnx")), dev)
    teacher = OnnxTorch(onnx.load(os.path.join(args.repo, "calib_data", "demo.onnx")), device=dev)
    x = torch.from_numpy(np.load(os.path.join(args.repo, "calib_data", "eval", "images.npy"))[:64]).to(dev)
    opt = torch.optim.AdamW(list(params.values()), lr=1e-4, weight_decay=0.0)
    mode = {"amp": dev == "cuda"}
    scalers = {True: torch.amp.GradScaler("cuda", enabled=dev == "cuda"), False: torch.amp.GradScaler("cuda", enabled=False)}

    def step():
        amp = mode["amp"]
        scaler = scalers[amp]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev, dtype=torch.float16, enabled=amp):
            out = student.run({"input": x})[0]
            with torch.no_grad():
                t = teacher.run({"input": x})[0]
            loss = torch.nn.functional.kl_div(torch.log_softmax(out.float(), 1), torch.softmax(t.float(), 1), reduction="batchmean")
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    loss0 = float(step())
    ms = time_device(torch, step, dev, 30 if not args.quick else 5, warmup=5)
    mode["amp"] = False  # the same step in FP32, what mpq's GPU training runs
    ms32 = time_device(torch, step, dev, 30 if not args.quick else 5, warmup=5)
    steps = 20 if not args.quick else 4
    mpq = {}
    # mpq's step in FP32 and with --amp fp16 (autocast's FP16 storage and dynamic loss scaling),
    # each against PyTorch's step of the same precision.
    for amp, torch_ms in (("off", ms32), ("fp16", ms)):
        key = "fp32" if amp == "off" else "amp_fp16"
        with tempfile.TemporaryDirectory() as tmp:
            rc, out, err, _ = run([args.mpq, "qat-finetune", os.path.join(args.repo, "calib_data", "demo.onnx"), "--data",
                                   os.path.join(args.repo, "calib_data", "calib"), "--weight-bits", "4", "--steps", str(steps),
                                   "--batch-size", "64", "--lr", "1e-4", "--device", args.mpq_device, "--amp", amp, "--json",
                                   "-o", os.path.join(tmp, "qat.onnx")], timeout=900)
        if rc == 0:
            d = json.loads(out)
            # Steady state, as PyTorch's figure (timed after warm-up steps): the median step
            # after the first; the mean over the run, first step included, beside it.
            mean_ms = 1000.0 * d["seconds"] / max(d["steps"], 1)
            step_ms = d.get("step_ms_median", mean_ms)
            mpq.update({f"mpq_{key}_step_ms": step_ms, f"mpq_{key}_mean_step_ms": mean_ms,
                        f"mpq_{key}_first_step_ms": d.get("first_step_ms"), f"mpq_{key}_first_loss": d["first_loss"],
                        f"mpq_{key}_vs_torch": step_ms / torch_ms})
        else:
            mpq[f"mpq_{key}"] = f"qat-finetune --device {args.mpq_device} --amp {amp} exited {rc}: {err.strip()[-300:]}"
    # Where mpq's step goes: a short FP32 run with MPQ_CUDA_PROFILE=1 (each node timed between two
    # synchronisations, so its total exceeds the unprofiled step) prints a table per op type.
    with tempfile.TemporaryDirectory() as tmp:
        rc, out, err, _ = run([args.mpq, "qat-finetune", os.path.join(args.repo, "calib_data", "demo.onnx"), "--data",
                               os.path.join(args.repo, "calib_data", "calib"), "--weight-bits", "4", "--steps", "6",
                               "--batch-size", "64", "--lr", "1e-4", "--device", args.mpq_device, "--json",
                               "-o", os.path.join(tmp, "qat.onnx")], timeout=900, env={"MPQ_CUDA_PROFILE": "1"})
    prof = [l for l in err.splitlines() if l.startswith("MPQ_CUDA_PROFILE") or l.startswith("  ")]
    for l in prof:
        log("qat_profile", l)
    mpq["mpq_fp32_profile"] = prof if rc == 0 else f"exited {rc}: {err.strip()[-300:]}"
    row = {"model": "fashion_demo (4-bit weights, int8 activations, fake-quant)", "batch": 64, "torch_amp_fp16_step_ms": ms,
           "torch_fp32_step_ms": ms32, "torch_first_loss": loss0, **mpq}
    log("qat_step", json.dumps(row))
    return [row]


# ---------------------------------------------------------------- validate
def leaves(d, prefix=""):
    if isinstance(d, dict):
        for k, v in d.items():
            yield from leaves(v, f"{prefix}.{k}")
    elif isinstance(d, list):
        for i, v in enumerate(d):
            yield from leaves(v, f"{prefix}[{i}]")
    else:
        yield prefix, d


def section_validate(args, _torch):
    rows = []
    bench = bench_models_dir(args.bundle)
    ref = os.path.join(args.repo, "calib_data", "demo.onnx")
    data = os.path.join(args.repo, "calib_data", "eval")
    for prec, thresholds in (("int8", "demo_int8.json"), ("fp16", "demo_fp16.json")):
        cand = os.path.join(bench, f"fashion_demo_{prec}.onnx")
        res = {}
        for dev in ("cpu", args.mpq_device):
            cmd = [args.mpq, "validate", "--reference", ref, "--candidate", cand, "--data", data, "--device", dev, "--json",
                   "--thresholds", os.path.join(args.repo, "ci", "thresholds", thresholds)]
            rc, out, err, secs = run(cmd, 600)
            try:
                rep = json.loads(out)
            except ValueError:
                rep = None
            res[dev] = (rc, rep, err.strip()[-300:], secs)
        (rc_c, rep_c, err_c, s_c), (rc_g, rep_g, err_g, s_g) = res["cpu"], res[args.mpq_device]
        row = {"candidate": prec, "cpu_rc": rc_c, "cuda_rc": rc_g, "cpu_s": round(s_c, 2), "cuda_s": round(s_g, 2)}
        if rep_c is None or rep_g is None:
            row["error"] = f"no JSON report: cpu: {err_c} | cuda: {err_g}"
            row["ok"] = False
        else:
            a, b = dict(leaves(rep_c)), dict(leaves(rep_g))
            worst, worst_key, differ = 0.0, None, []
            for k, v in a.items():
                w = b.get(k)
                if any(s in k for s in ("time", "seconds", "_ms", "device", "message")):
                    continue  # timings, the device name, and messages that print the values compared below
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not isinstance(w, (int, float)):
                    if v != w:
                        differ.append(k)
                    continue
                dlt = abs(float(v) - float(w))
                if dlt > worst:
                    worst, worst_key = dlt, k
            # The same verdict (exit status, every check's status) is the hard requirement; the metrics
            # are reported with their largest absolute difference against the 1e-5 goal.
            row.update(max_metric_diff=worst, worst_metric=worst_key, differing_fields=differ[:10],
                       same_verdict=rc_c == rc_g and not differ)
            row["metrics_within_1e-5"] = worst <= 1e-5
            row["ok"] = row["same_verdict"] and row["metrics_within_1e-5"]
        rows.append(row)
        log("validate", json.dumps(row))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True, help="the unpacked GPU bundle (bin/, data/bench/)")
    ap.add_argument("--repo", default=ROOT, help="the repository checkout (models, calib_data, ci/thresholds)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--sections", default="gemm,latency,qat_step,validate")
    ap.add_argument("--torch-device", default="cuda")
    ap.add_argument("--mpq-device", default="cuda")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="4096 only, fewer QAT steps")
    args = ap.parse_args()
    args.mpq = os.path.join(args.bundle, "bin", "mpq")
    import torch
    log(f"torch {torch.__version__}, device {args.torch_device}"
        + (f" ({torch.cuda.get_device_name(0)})" if args.torch_device == "cuda" else ""))
    fns = {"gemm": section_gemm, "latency": section_latency, "qat_step": section_qat, "validate": section_validate}
    results = {"torch": torch.__version__}
    for s in args.sections.split(","):
        t = time.time()
        try:
            results[s] = fns[s](args, torch)
        except Exception as e:  # noqa: BLE001 -- one broken section must not hide the others
            import traceback
            traceback.print_exc()
            results[s] = {"error": f"{type(e).__name__}: {e}"}
        log(f"== {s}: {time.time() - t:.1f} s")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    # Summary table (the reply carries the end of the output).
    def num(v, p=3):
        return f"{v:.{p}f}" if isinstance(v, (int, float)) else "-"

    log("\n== summary")
    problems = [f"section {k}: {v['error']}" for k, v in results.items() if isinstance(v, dict) and "error" in v]
    for r in results.get("gemm", []) if isinstance(results.get("gemm"), list) else []:
        wrong = r.get("mpq_ok") is False
        if wrong or r.get("mpq_error"):
            problems.append(f"gemm {r['type']} n={r['n']}: {'WRONG RESULT' if wrong else r['mpq_error']}")
        log(f"gemm {r['type']:5s} n={r['n']}: mpq {num(r.get('mpq_tflops'), 1)} vs torch {num(r.get('torch_tflops'), 1)} TFLOP/s"
            f" = {num(r.get('mpq_over_peak'), 2)} {'WRONG RESULT' if wrong else ''} {r.get('mpq_error') or ''} {r.get('torch_error') or ''}")
    for r in results.get("latency", []) if isinstance(results.get("latency"), list) else []:
        log(f"lat {r['model']:12s} {r['precision']} b{r['batch']:<2d}: mpq {num(r.get('mpq_ms'))} torch {num(r.get('torch_ms'))}"
            f" ort {num(r.get('ort_ms'))} ({r.get('ort_provider', '-')}) mpq/torch {num(r.get('mpq_over_torch'), 2)}"
            f" {(r.get('mpq_note') or '')[:80]} {(r.get('torch_note') or '')[:60]}")
    for key in ("qat_step", "validate"):
        v = results.get(key)
        for r in v if isinstance(v, list) else [v]:
            log(key, json.dumps(r))
            if key == "validate" and isinstance(r, dict) and r.get("same_verdict") is False:
                problems.append(f"validate {r.get('candidate')}: the CPU and CUDA verdicts differ")
    # Exit status: 1 when a result is wrong (a GEMM off its float64 check or declined, a section that
    # broke, validate verdicts that differ). Figures that miss a goal (latency, the 1e-5 metric
    # agreement) are reported, not failed: they are measurements.
    for p in problems:
        log("PROBLEM:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
