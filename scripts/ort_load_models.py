#!/usr/bin/env python3
"""Check that models exported by mpq load in ONNX Runtime wherever the originals do.

Usage: ort_load_models.py EXPORT_DIR ORIGINALS_ROOT
EXPORT_DIR holds files named <suite>__<case>.onnx (written by the round-trip test); the original of
each is ORIGINALS_ROOT/<suite>/<case>/model.onnx. Exit 0 when every exported model whose original
loads also loads, 1 otherwise, 77 (ctest: skipped) when onnxruntime is not installed.
"""
import os
import sys

try:
    import onnxruntime as ort
except ImportError:
    print("SKIP: onnxruntime is not installed (run scripts/setup.sh --python)")
    sys.exit(77)


def loads(path):
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    try:
        ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        return None
    except Exception as e:  # ORT raises several exception types
        return str(e).splitlines()[0][:200]


def main():
    export_dir, originals = sys.argv[1], sys.argv[2]
    files = sorted(f for f in os.listdir(export_dir) if f.endswith(".onnx"))
    if not files:
        print(f"no exported models in {export_dir}")
        return 1
    both = original_fails = 0
    regressions = []
    for f in files:
        suite, case = f[: -len(".onnx")].split("__", 1)
        original = os.path.join(originals, suite, case, "model.onnx")
        if loads(original) is not None:
            original_fails += 1
            continue
        err = loads(os.path.join(export_dir, f))
        if err is None:
            both += 1
        else:
            regressions.append(f"{suite}/{case}: {err}")
    print(f"ONNX Runtime {ort.__version__}: {len(files)} exported models; {both} load like their originals; "
          f"{original_fails} originals do not load in ORT either; {len(regressions)} regressions")
    for r in regressions:
        print("  FAIL", r)
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
