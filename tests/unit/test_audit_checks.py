"""``aidawork audit``'s checks are documented one by one, with their severity, on the
operations page; and the command's table reads as one line per problem, then the verdict."""

from __future__ import annotations

import re
from pathlib import Path
from uuid import UUID

from schema.store.audit import CHECKS
from schema.wire.audit import AuditProblem, AuditReport, Severity
from worker.cli.audit import describe

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operations" / "audit.md"
RUN = UUID("723e4fcb-aaf0-45a3-8496-feb86e05eec6")


def test_every_check_is_on_the_operations_page_with_its_severity() -> None:
    documented = dict(re.findall(r"^\| `([a-z_]+)` \| (error|warning) \|", PAGE.read_text(), flags=re.MULTILINE))
    assert documented == {check.code: check.severity.value for check in CHECKS}


def test_check_codes_are_stable_snake_case_names_each_used_once() -> None:
    codes = [check.code for check in CHECKS]
    assert len(set(codes)) == len(codes)
    assert all(re.fullmatch(r"[a-z]+(_[a-z]+)+", code) for code in codes), codes


def test_a_clean_report_is_one_line() -> None:
    assert describe(AuditReport(clean=True, runs_checked=3, problems=[])) == ["3 run(s) checked: clean"]


def test_problems_are_a_table_then_the_verdict_counting_errors_and_warnings() -> None:
    report = AuditReport(clean=False, runs_checked=2, problems=[
        AuditProblem(check="rounds_missing", severity=Severity.ERROR, run_id=RUN, boundary_seq=12, message="gone"),
        AuditProblem(check="owner_running", severity=Severity.ERROR, run_id=None, boundary_seq=None, message="off"),
        AuditProblem(check="call_unfinished", severity=Severity.WARNING, run_id=RUN, boundary_seq=0, message="died"),
    ])
    lines = describe(report)
    assert lines[0].split() == ["SEVERITY", "CHECK", "RUN", "BOUNDARY", "MESSAGE"]
    assert lines[1].split() == ["error", "rounds_missing", str(RUN), "12", "gone"]
    assert lines[2].split() == ["error", "owner_running", "-", "-", "off"]
    assert len({line.index(line.split()[-1]) for line in lines[:4]}) == 1  # the messages line up
    assert lines[-1] == "2 run(s) checked: 2 error(s), 1 warning(s)"
