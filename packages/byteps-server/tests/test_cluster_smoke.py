"""The cluster rig's smoke run: 2 simulated hosts with capped NICs, a byteps job across them.

benchmarks/cluster/ builds hosts from network namespaces, so this needs
root and `ip netns`; elsewhere it is skipped with the reason. It runs the
rig's own ``--smoke`` mode as a separate process (as `nox -s bench-cluster`
would run the rig), and deletes that process's namespaces whatever happens,
so that the rig cannot rot between benchmark runs.
"""

import os
import pathlib
import signal
import subprocess
import sys

import pytest

from byteps.testkit import kill_group

RIG_DIR = pathlib.Path(__file__).resolve().parents[3] / "benchmarks" / "cluster"
TIMEOUT_S = 60


def _rig():
    if not (RIG_DIR / "run_cluster_bench.py").is_file():
        pytest.skip(f"the cluster rig is not in this checkout ({RIG_DIR})")
    sys.path.insert(0, str(RIG_DIR))
    try:
        import rig
    finally:
        sys.path.remove(str(RIG_DIR))
    return rig


def test_two_hosts_cap_holds_and_byteps_sums():
    rig = _rig()
    try:
        rig.check_privileges()
    except rig.RigError as exc:
        pytest.skip(f"cannot build network namespaces here: {exc}")
    proc = subprocess.Popen([sys.executable, str(RIG_DIR / "run_cluster_bench.py"), "--smoke"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the rig tears itself down on SIGTERM
        try:
            output, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            output, _ = proc.communicate()
        pytest.fail(f"the smoke run took over {TIMEOUT_S} s:\n{output}")
    finally:
        if proc.poll() is None:
            kill_group(proc.pid)
            proc.wait()
        leftovers = rig.delete_rigs_of(proc.pid)
    assert proc.returncode == 0, output
    assert not leftovers, f"the rig left namespaces behind: {leftovers}\n{output}"
    assert "of the cap" in output and "byteps push_pull on 2 hosts (servers co-located): OK" in output, output


def test_refuses_clearly_without_root():
    _rig()
    if os.geteuid() != 0:
        pytest.skip("not root: the refusal itself is what the other test reports")
    # Drop to an unprivileged user for one run: the rig must say why and exit non-zero.
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    if subprocess.run(drop + ["true"], capture_output=True).returncode != 0:
        pytest.skip("setpriv cannot drop privileges here")
    result = subprocess.run(drop + [sys.executable, str(RIG_DIR / "run_cluster_bench.py"), "--smoke"],
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    if "needs root" not in result.stderr and "Permission denied" in result.stderr:
        pytest.skip(f"an unprivileged user cannot run this interpreter or read the rig: {result.stderr.strip()}")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "needs root" in result.stderr


def _measurement(system: str, workload: str, n: int) -> dict:
    return {"system": system, "workload": workload, "n": n, "bytes": 100_000_000,
            "median": 2.0 + n / 10, "min": 1.9 + n / 10, "max": 2.2 + n / 10}


def test_every_system_keeps_its_colour_and_marker_whichever_systems_ran():
    pytest.importorskip("matplotlib")
    _rig()
    sys.path.insert(0, str(RIG_DIR))
    try:
        import jobs
        import report
    finally:
        sys.path.remove(str(RIG_DIR))
    assert set(report.STYLES) == set(jobs.SYSTEMS)
    assert len({style for style in report.STYLES.values()}) == len(report.STYLES)
    # Two panels whose systems differ, as when only three systems ran a model: before, a panel's
    # lines took the default colour cycle in drawing order, so gloo got another system's colour.
    panels = {"100MB": ("byteps", "byteps-1server", "byteps-colocated", "gloo", "mxnet"),
              "bert-base": ("byteps-colocated", "gloo", "mxnet")}
    results = {"settings": {"workloads": list(panels)},
               "calibration": {str(n): {"rate_bits": 500e6} for n in (2, 4)},
               "measurements": [_measurement(system, workload, n) for workload, systems in panels.items()
                                for system in systems for n in (2, 4)]}
    fig = report.figure(results)
    seen = {}
    for ax in fig.axes:
        for container in ax.containers:  # one errorbar per system
            line = container.lines[0]
            seen.setdefault(container.get_label(), set()).add((line.get_color(), line.get_marker()))
    labels = {report.LABELS[system]: system for system in jobs.SYSTEMS}
    assert set(seen) == {report.LABELS[s] for systems in panels.values() for s in systems}
    for label, styles in seen.items():
        assert styles == {report.STYLES[labels[label]]}, label
