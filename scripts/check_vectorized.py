#!/usr/bin/env python3
"""Checks, in the built binary's machine code, that the AVX-512 builds of the element-wise kernels
that call mpq's float math (exp, erf, tanh, ...) are vector loops.

    check_vectorized.py --bin build/apps/mpq/mpq

Why: these loops are plain C++ that GCC vectorises only when it inlines every call in the loop
body. In the twenty-ninth session the math helpers became always_inline, which made the small
wrappers around them (exp_t in the GELU backward) too large for GCC's inlining heuristics; the
GELU backward's AVX-512 loop became a scalar loop calling exp_t, the same bits, and the ViT's
training step at batch 64 went from 14 to 22 ms. No test could see it (the results were the same),
so this one reads the code: each listed function must contain vector (zmm or, where GCC's tuning
prefers 256-bit vectors in AVX-512 code, ymm) instructions; a scalar loop uses xmm alone.

Exit 0: all vectorised; 1: some are not (listed); 77 (ctest's skip): no objdump on this machine.
"""
import argparse
import re
import shutil
import subprocess
import sys

# Forward kernels (runtime/cpu/unary.cpp): map_range_avx512<float, float, unary_kernel<Op>...>.
FORWARD = ["GeluErf", "GeluTanh", "Erf", "Exp", "Log", "Sigmoid", "Tanh", "Softplus", "Elu", "Celu", "Selu",
           "HardSwish", "HardSigmoid", "Relu", "LeakyRelu"]
# mpq::GeluMlp's Gelu (runtime/cpu/mlp.cpp through unary.cpp's gelu_range): its own instantiations.
GELU_RANGE = ["GeluErf", "GeluTanh"]
# Backward kernels (train/grads/unary_grad.cpp): grad_range_avx512<OpGrad, float>.
BACKWARD = ["GeluErfGrad", "GeluTanhGrad", "ErfGrad", "EluGrad", "SoftplusGrad", "SigmoidGrad", "TanhGrad",
            "ExpGrad", "LogGrad", "HardSwishGrad", "HardSigmoidGrad", "ReluGrad", "LeakyReluGrad"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    args = ap.parse_args()
    objdump = shutil.which("objdump")
    if objdump is None:
        print("SKIP: objdump not found (binutils); cannot read the machine code")
        return 77
    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", "-C", args.bin], capture_output=True, text=True,
                          check=True).stdout
    wanted = {}
    for op in FORWARD:
        wanted[op] = re.compile(r"map_range_avx512<float, float, mpq::rt::cpu::\(anonymous namespace\)::unary_kernel<"
                                r"mpq::rt::cpu::\(anonymous namespace\)::" + op + r">")
    for op in GELU_RANGE:
        wanted["gelu_range " + op] = re.compile(
            r"map_range_avx512<float, float, mpq::rt::cpu::\(anonymous namespace\)::gelu_range_with<"
            r"mpq::rt::cpu::\(anonymous namespace\)::" + op + r">")
    for op in BACKWARD:
        wanted[op] = re.compile(r"grad_range_avx512<mpq::train::grads::\(anonymous namespace\)::" + op + r", float>")
    found = {name: 0 for name in wanted}
    vector_ops = {name: 0 for name in wanted}
    current = None
    header = re.compile(r"^[0-9a-f]+ <(.*)>:$")
    for line in text.splitlines():
        m = header.match(line)
        if m:
            current = None
            for name, pattern in wanted.items():
                if pattern.search(m.group(1)):
                    current = name
                    found[name] += 1
                    break
            continue
        if current is not None and ("zmm" in line or "ymm" in line):
            vector_ops[current] += 1
    missing = [n for n in wanted if found[n] == 0]
    scalar = [n for n in wanted if found[n] > 0 and vector_ops[n] == 0]
    for n in wanted:
        print(f"{n:20s} functions {found[n]}  vector instructions {vector_ops[n]}")
    if missing:
        print(f"FAIL: no AVX-512 build found for {', '.join(missing)} (renamed, or no longer built per ISA?)")
    if scalar:
        print(f"FAIL: scalar AVX-512 builds (no zmm or ymm instruction): {', '.join(scalar)}; a call in the loop body "
              "(a wrapper GCC did not inline) keeps a loop scalar")
    if missing or scalar:
        return 1
    print(f"OK: {len(wanted)} element-wise kernels vectorised in {args.bin}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
