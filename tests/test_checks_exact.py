"""Every finding of the check table (test_checks.CASES) word for word: message, slot, bus
ID, expected and found, as the Prolog's JSON log and ``preflight --json`` carry them, and
the table ``preflight`` prints.

The golden file is regenerated only on purpose: ``CLUSTERJOB_REGEN_GOLDEN=1 pytest
tests/test_checks_exact.py``, then review its diff.
"""

from __future__ import annotations

import json
from pathlib import Path

from test_checks import CASES, check
from test_render_golden import assert_golden

from clusterjob.node.report import render_table, summary_line

GOLDEN = Path(__file__).parent / "golden" / "check-findings.json"


def test_every_finding_of_the_check_table_word_for_word() -> None:
    cases = {}
    for name, (kw, _) in CASES.items():
        report = check(kw)
        cases[name] = {
            "findings": [f.to_dict() for f in report.findings],
            "summary": summary_line(report),
            "table": render_table(report).splitlines(),
        }
    assert_golden(GOLDEN, json.dumps(cases, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
