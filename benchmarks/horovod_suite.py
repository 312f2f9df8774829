"""Run one of Horovod's own test files against a byteps adapter, with only the import changed.

This measures Horovod compatibility as a user would meet it: Horovod's
``test/parallel/<suite>`` (from a Horovod checkout, e.g. tag v0.28.1) with
``import horovod.<framework> as hvd`` replaced by ``import byteps.<framework>
as hvd``, run under ``bpslaunch``. Nothing of Horovod is copied into this
project: the checkout is read at run time, and the copy is written to a
temporary directory.

Each test runs as its own ``bpslaunch`` job (``pytest -k`` on the exact
test), so that one hanging or crashing test cannot take every later test
with it; a test passes when it passes on every rank. The helper module the
suites import (``test/utils/common.py``) imports Horovod's runner for one
thread helper; the copy gets that helper from :mod:`threading` instead.

Usage::

    python benchmarks/horovod_suite.py --horovod /path/to/horovod --suite test_torch.py \\
        --mode np2 --results /tmp/torch_np2.json
    python benchmarks/horovod_suite.py ... --mode ps    # --workers 2 --servers 1

It prints one line per test (pass/fail/skip) and a summary; ``--results``
writes them as JSON for docs/horovod-compatibility.md. ``--whole-file`` runs
the file as Horovod's CI does instead, every test in one job (so a test that
leaves the job broken fails the ones after it), ``--timeout`` then being the
job's; ``--exclude a,b`` deselects tests there.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

MODES = {
    "np2": ["-np", "2"],
    "ps": ["--workers", "2", "--servers", "1"],
}
IMPORTS = {
    "test_torch.py": ("horovod.torch", "byteps.torch"),
    "test_tensorflow.py": ("horovod.tensorflow", "byteps.tensorflow"),
    "test_tensorflow2_keras.py": ("horovod.tensorflow.keras", "byteps.tensorflow.keras"),
    "test_keras.py": ("horovod.keras", "byteps.keras"),
    "test_mxnet1.py": ("horovod.mxnet", "byteps.mxnet"),
    "test_mxnet2.py": ("horovod.mxnet", "byteps.mxnet"),
}
#: Horovod's own helpers some suites import besides the framework module: the same few lines, written here.
HELPERS = {
    "from horovod.tensorflow.util import _executing_eagerly":
        "def _executing_eagerly():\n    import tensorflow\n    return tensorflow.executing_eagerly()",
    "from horovod.common.util import is_version_greater_equal_than":
        "def is_version_greater_equal_than(ver, target):\n"
        "    from packaging import version\n    return version.parse(ver) >= version.parse(target)",
    "import horovod.keras as hvd_keras": "import byteps.keras as hvd_keras",
}
IN_THREAD = '''
import threading as _threading


def in_thread(target, args=(), name=None, daemon=True, silent=False):
    """Start ``target(*args)`` on a daemon thread (stands in for Horovod's runner helper)."""
    thread = _threading.Thread(target=target, args=args, name=name, daemon=daemon)
    thread.start()
    return thread
'''


def prepare(horovod: pathlib.Path, suite: str, into: pathlib.Path) -> pathlib.Path:
    """Copy the suite (import changed) and its helper module into ``into``; returns the suite's path."""
    old, new = IMPORTS[suite]
    # The import line, at any indentation (base_test_mxnet.py imports inside a try), in the suite and its bases.
    pattern = re.compile(rf"^(\s*)import {re.escape(old)} as hvd$", flags=re.M)
    changes = 0
    parallel = horovod / "test" / "parallel"
    for path in [parallel / suite, *sorted(parallel.glob("base_test_*.py"))]:
        text, count = pattern.subn(rf"\1import {new} as hvd", path.read_text())
        changes += count
        for line, replacement in HELPERS.items():
            text = text.replace(line, replacement)
        (into / path.name).write_text(text)
    if not changes:
        raise SystemExit(f"{suite}: no line 'import {old} as hvd' to change in it or its base_test module")
    common = (horovod / "test" / "utils" / "common.py").read_text()
    common = common.replace("from horovod.runner.util.threads import in_thread", IN_THREAD)
    (into / "common.py").write_text(common)
    return into / suite


def collect(python: str, suite_path: pathlib.Path) -> List[str]:
    out = subprocess.run([python, "-m", "pytest", "--collect-only", "-q", str(suite_path)],
                         capture_output=True, text=True, cwd=suite_path.parent)
    ids = [line.split("::")[-1] for line in out.stdout.splitlines() if line.startswith(f"{suite_path.name}::")]
    if not ids:
        raise SystemExit(f"collected no tests from {suite_path}:\n{out.stdout}\n{out.stderr}")
    return ids


def outcome(report_dir: pathlib.Path, ranks: int) -> str:
    """pass/skip/fail from each rank's junit report ('fail' if any rank failed or wrote none)."""
    results = []
    for rank in range(ranks):
        path = report_dir / f"rank{rank}.xml"
        if not path.exists():
            return "fail"
        text = path.read_text()
        if "<failure" in text or "<error" in text:
            results.append("fail")
        elif "<skipped" in text:
            results.append("skip")
        else:
            results.append("pass")
    if "fail" in results:
        return "fail"
    return "skip" if "skip" in results else "pass"


def _launch(python: str, mode: str, pytest: str, cwd: pathlib.Path, timeout_s: float) -> Tuple[str, Optional[int]]:
    """Run ``pytest`` (a shell command) on every rank of a bpslaunch job in ``mode``: (its output, its exit
    status), the status None when it ran past ``timeout_s`` and was ended."""
    command = [python, "-m", "byteps.launcher", *MODES[mode], "--", "sh", "-c", pytest]
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                cwd=cwd, start_new_session=True)
    try:
        log, _ = launcher.communicate(timeout=timeout_s)
        return log, launcher.returncode
    except subprocess.TimeoutExpired:
        # SIGTERM lets bpslaunch end its job (workers included); the group kill is the last resort.
        launcher.terminate()
        try:
            log, _ = launcher.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            log, _ = launcher.communicate()
        return log or "", None


def run_test(python: str, suite_path: pathlib.Path, test: str, mode: str, timeout_s: float) -> Dict:
    report_dir = pathlib.Path(tempfile.mkdtemp(prefix="hvd-report-"))
    pytest = (f"{python} -m pytest -q -x -p no:cacheprovider {suite_path.name} -k '{test} and not {test}_' "
              f"--junitxml={report_dir}/rank$HOROVOD_RANK.xml")
    start = time.monotonic()
    log, rc = _launch(python, mode, pytest, suite_path.parent, timeout_s)
    if rc is None:
        log, rc = f"timed out after {timeout_s:g} s\n{log}", -1
    result = outcome(report_dir, 2) if rc in (0, 1) else "fail"
    shutil.rmtree(report_dir, ignore_errors=True)
    reason = ""
    if result == "fail":
        errors = [line for line in log.splitlines() if re.search(r"Error|assert|timed out|Exception", line)]
        reason = (errors[-1] if errors else log.strip().splitlines()[-1] if log.strip() else f"exit {rc}")[:300]
    return {"test": test, "result": result, "seconds": round(time.monotonic() - start, 1), "reason": reason}


#: one rank's verdict on one test in a -v log: "[worker 1] test_torch.py::TorchTests::test_x PASSED [ 4%]"
_VERDICT = re.compile(r"^\[worker (\d+)\] \S+::(\w+) (PASSED|FAILED|SKIPPED|ERROR)")


def run_whole_file(python: str, suite_path: pathlib.Path, mode: str, timeout_s: float,
                   excluded: List[str], log_path: Optional[pathlib.Path] = None) -> List[Dict]:
    """The suite as Horovod's CI runs it: every test in one job, one pytest process per rank.

    A test passes when every rank says PASSED (skip: every rank skipped it); a
    test some rank failed or errored in (its tearDown included) fails; tests the job never reached (it
    hung or timed out before them) are ``not run``. ``excluded`` tests are deselected.
    """
    deselect = " ".join(f"--deselect {suite_path.name}::{_test_class(suite_path)}::{test}" for test in excluded)
    report_dir = pathlib.Path(tempfile.mkdtemp(prefix="hvd-report-"))
    pytest = (f"{python} -m pytest -v -p no:cacheprovider {suite_path.name} {deselect} "
              f"--junitxml={report_dir}/rank$HOROVOD_RANK.xml")
    log, rc = _launch(python, mode, pytest, suite_path.parent, timeout_s)
    if rc is None:
        log += f"\ntimed out after {timeout_s:g} s"
    if log_path is not None:
        log_path.write_text(log)
    verdicts: Dict[str, Dict[int, List[str]]] = {}
    for line in log.splitlines():
        found = _VERDICT.match(line)
        if found:
            verdicts.setdefault(found.group(2), {}).setdefault(int(found.group(1)), []).append(found.group(3))
    # Each rank's junit report, where the job got to write it, is the verdict (as in the one-job-per-test mode:
    # TensorFlow's TestCase reports a test that skips in both its modes as PASSED in the -v log).
    for rank in range(2):
        for test, verdict in _junit_verdicts(report_dir / f"rank{rank}.xml").items():
            verdicts.setdefault(test, {})[rank] = [verdict]
    shutil.rmtree(report_dir, ignore_errors=True)
    results = []
    for test in collect(python, suite_path):
        if test in excluded:
            continue
        by_rank = verdicts.get(test, {})
        said = [v for rank in range(2) for v in by_rank.get(rank, [])]
        if len(by_rank) < 2:
            result = "not run" if not by_rank else "fail"
        elif any(v in ("FAILED", "ERROR") for v in said):
            result = "fail"
        elif all(v == "SKIPPED" for v in said):
            result = "skip"
        else:
            result = "pass" if "SKIPPED" not in said else "skip"
        results.append({"test": test, "result": result, "ranks": {str(r): v for r, v in by_rank.items()}})
    tail = log.strip().splitlines()[-1] if log.strip() else ""
    results.append({"test": "(job)", "result": "end", "reason": tail[:300]})
    return results


def _junit_verdicts(path: pathlib.Path) -> Dict[str, str]:
    """test name -> PASSED/FAILED/SKIPPED from one rank's junit report ({} if it wrote none)."""
    if not path.exists():
        return {}
    import xml.etree.ElementTree as ElementTree
    verdicts = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        verdicts[case.get("name")] = ("FAILED" if kinds & {"failure", "error"} else
                                      "SKIPPED" if "skipped" in kinds else "PASSED")
    return verdicts


def _test_class(suite_path: pathlib.Path) -> str:
    found = re.search(r"^class (\w+)\(", suite_path.read_text(), flags=re.M)
    return found.group(1) if found else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--horovod", type=pathlib.Path, required=True, help="a Horovod checkout (e.g. tag v0.28.1)")
    parser.add_argument("--suite", default="test_torch.py", choices=sorted(IMPORTS))
    parser.add_argument("--mode", default="np2", choices=sorted(MODES))
    parser.add_argument("-k", dest="only", default=None, help="run only tests whose name contains this")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per test job")
    parser.add_argument("--results", type=pathlib.Path, default=None)
    parser.add_argument("--whole-file", action="store_true",
                        help="run the whole file in one job, as Horovod's CI does (--timeout is then the job's)")
    parser.add_argument("--exclude", default="", help="with --whole-file: tests to deselect (comma-separated)")
    parser.add_argument("--log", type=pathlib.Path, default=None, help="with --whole-file: write the job's output here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hvd-suite-") as work:
        suite_path = prepare(args.horovod, args.suite, pathlib.Path(work))
        if args.whole_file:
            return _report_whole_file(args, suite_path)
        tests = [t for t in collect(sys.executable, suite_path) if args.only is None or args.only in t]
        results = []
        for test in tests:
            result = run_test(sys.executable, suite_path, test, args.mode, args.timeout)
            results.append(result)
            print(f"{result['result']:4}  {test}  ({result['seconds']} s)  {result['reason']}", flush=True)
    counts = {kind: sum(r["result"] == kind for r in results) for kind in ("pass", "fail", "skip")}
    print(f"{args.suite} {args.mode}: {counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped "
          f"of {len(results)}")
    if args.results:
        args.results.write_text(json.dumps({"suite": args.suite, "mode": args.mode, "counts": counts,
                                            "tests": results}, indent=1))
    return 0


def _report_whole_file(args: argparse.Namespace, suite_path: pathlib.Path) -> int:
    excluded = [t for t in args.exclude.split(",") if t]
    results = run_whole_file(sys.executable, suite_path, args.mode, args.timeout, excluded, args.log)
    for result in results:
        print(f"{result['result']:7}  {result['test']}  {result.get('ranks', result.get('reason', ''))}", flush=True)
    counts = {kind: sum(r["result"] == kind for r in results) for kind in ("pass", "fail", "skip", "not run")}
    print(f"{args.suite} {args.mode}, whole file in one job: {counts['pass']} passed, {counts['fail']} failed, "
          f"{counts['skip']} skipped, {counts['not run']} not run, {len(excluded)} deselected")
    if args.results:
        args.results.write_text(json.dumps({"suite": args.suite, "mode": args.mode, "whole_file": True,
                                            "excluded": excluded, "counts": counts, "tests": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
