#!/usr/bin/env python3
"""Checks that a JUnit XML file written by `mpq validate --report X.xml` is accepted by real parsers.

Always parses with Python's xml.etree (a conforming XML 1.0 parser) and checks the JUnit structure
CI systems rely on (testsuites > testsuite > testcase, counts that add up, failure/skipped children);
when junitparser is installed it also loads the file with it and compares the counts.

    python3 tests/validate/junit_check.py report.xml [more.xml ...] [--expect-failures N]

Exit 0 when accepted, 1 with a message otherwise. Without a file argument it makes one itself by
running `mpq validate` (binary from $MPQ_BINARY or build/apps/mpq/mpq) on a model from tests/models,
so it can run as a standalone ctest.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET


def fail(msg):
    print(f"junit_check: {msg}", file=sys.stderr)
    sys.exit(1)


def check_etree(path, expect_failures):
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        fail(f"{path}: not well-formed XML: {e}")
    if root.tag != "testsuites":
        fail(f"root element is <{root.tag}>, expected <testsuites>")
    suites = root.findall("testsuite")
    if not suites:
        fail("no <testsuite>")
    total = failures = skipped = 0
    for s in suites:
        cases = s.findall("testcase")
        nf = sum(1 for c in cases if c.find("failure") is not None)
        ns = sum(1 for c in cases if c.find("skipped") is not None)
        for attr, want in (("tests", len(cases)), ("failures", nf), ("skipped", ns), ("errors", 0)):
            if int(s.get(attr, "-1")) != want:
                fail(f"testsuite {s.get('name')!r}: {attr}={s.get(attr)} but {want} counted")
        for c in cases:
            if not c.get("name") or not c.get("classname"):
                fail("a testcase without name or classname")
            f = c.find("failure")
            if f is not None and not f.get("message"):
                fail(f"testcase {c.get('name')!r}: failure without message")
        total += len(cases)
        failures += nf
        skipped += ns
    if int(root.get("tests", "-1")) != total or int(root.get("failures", "-1")) != failures:
        fail("testsuites totals do not match the testcases")
    if expect_failures is not None and failures != expect_failures:
        fail(f"{failures} failures, expected {expect_failures}")
    return total, failures, skipped


def check_junitparser(path, total, failures, skipped):
    try:
        import junitparser  # noqa: F401
        from junitparser import JUnitXml, Failure, Skipped
    except ImportError:
        return False
    xml = JUnitXml.fromfile(path)
    n = nf = ns = 0
    for suite in xml:
        for case in suite:
            n += 1
            for r in case.result:
                if isinstance(r, Failure):
                    nf += 1
                elif isinstance(r, Skipped):
                    ns += 1
    if (n, nf, ns) != (total, failures, skipped):
        fail(f"junitparser counts {n} tests, {nf} failures, {ns} skipped; xml.etree {total}, {failures}, {skipped}")
    return True


def make_report(tmp):
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    binary = os.environ.get("MPQ_BINARY") or os.path.join(root, "build", "apps", "mpq", "mpq")
    model = os.path.join(root, "tests", "models", "resnet_bn_op13.onnx")
    data = os.path.join(root, "tests", "models", "resnet_bn_op13_data")
    out = os.path.join(tmp, "report.xml")
    # One check passes, one fails (SNR of a model against itself is infinite; max_abs_error < 0 cannot hold).
    r = subprocess.run([binary, "validate", "--reference", model, "--candidate", model, "--data", data,
                        "--min-snr-db", "100", "--max-abs-error", "-1", "--per-layer", "--report", out],
                       capture_output=True, text=True)
    if r.returncode != 1:
        fail(f"mpq validate exited {r.returncode}, expected 1:\n{r.stdout}\n{r.stderr}")
    return out, 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("reports", nargs="*")
    ap.add_argument("--expect-failures", type=int, help="failures each file must hold")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.reports:
            jobs = [(path, args.expect_failures) for path in args.reports]
        else:
            jobs = [make_report(tmp)]
        for path, expect in jobs:
            if not os.path.isfile(path):
                fail(f"{path}: no such file")
            total, failures, skipped = check_etree(path, expect)
            used = check_junitparser(path, total, failures, skipped)
            print(f"junit_check: {path}: {total} testcases, {failures} failures, {skipped} skipped; accepted by xml.etree"
                  + (" and junitparser" if used else " (junitparser not installed)"))


if __name__ == "__main__":
    main()
