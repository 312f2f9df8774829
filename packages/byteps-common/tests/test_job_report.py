"""The job report: each process's figures written at exit, one summary line made of them."""

from __future__ import annotations

import os

import pytest

from byteps.common.job_report import ProcessReport, read_reports, summarize, write_report


def test_reports_round_trip_and_sort_workers_first(tmp_path):
    reports = [ProcessReport("server", 1, 3.0, bytes_received=300), ProcessReport("worker", 1, 2.0, 4, 1.0, 10, 20),
               ProcessReport("server", 0, 3.0, bytes_received=100), ProcessReport("worker", 0, 2.0, 5, 1.0, 30, 40)]
    for report in reports:
        write_report(str(tmp_path), report)
    assert sorted(os.listdir(tmp_path)) == ["server-0.json", "server-1.json", "worker-0.json", "worker-1.json"]
    assert read_reports(str(tmp_path)) == [reports[3], reports[1], reports[2], reports[0]]


def test_summary_names_rounds_mean_round_time_bytes_and_the_servers_share():
    reports = [ProcessReport("worker", 0, 9.0, rounds=100, busy_s=4.0, bytes_sent=2_000_000, bytes_received=2_000_000),
               ProcessReport("worker", 1, 9.0, rounds=99, busy_s=5.0, bytes_sent=4_000_000, bytes_received=2_000_000),
               ProcessReport("server", 0, 9.5, bytes_received=4_500_000),
               ProcessReport("server", 1, 9.5, bytes_received=1_500_000)]
    assert summarize(reports, 10.04) == (
        "job done in 10.0 s, 2 workers, 100 rounds (mean 50.0 ms), each pushed 3.00 MB and pulled 2.00 MB, "
        "servers' share of the bytes 75% / 25%")


def test_summary_of_a_job_without_servers_or_reports():
    workers = [ProcessReport("worker", r, 1.0, rounds=3, busy_s=0.3) for r in range(2)]
    assert summarize(workers, 1.0) == "job done in 1.0 s, 2 workers, 3 rounds (mean 100.0 ms), " \
                                      "summed in shared memory (no servers)"
    assert summarize([], 2.5) == "job done in 2.5 s"


def test_no_folder_writes_nothing_and_an_unwritable_one_never_fails_the_job(tmp_path, caplog):
    write_report(None, ProcessReport("worker", 0, 1.0))
    write_report(str(tmp_path / "missing" / "folder"), ProcessReport("worker", 0, 1.0))
    assert "could not write the job report" in caplog.text


@pytest.mark.parametrize("text", ["{not json", '{"role": "worker"}', '{"role": "worker", "rank": 0, "x": 1}'])
def test_a_damaged_report_is_skipped(tmp_path, caplog, text):
    (tmp_path / "worker-0.json").write_text(text)
    write_report(str(tmp_path), ProcessReport("worker", 1, 1.0))
    assert [r.rank for r in read_reports(str(tmp_path))] == [1]
    assert "skipped the job report" in caplog.text
