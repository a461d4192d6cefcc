"""docs/benchmarks.md is generated from the saved results: no figure in it is typed by hand."""
import importlib.util
from pathlib import Path


def test_benchmarks_page_matches_its_results():
    spec = importlib.util.spec_from_file_location("bench_report", Path("scripts/bench_report.py"))
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    assert report.render_docs() == Path("docs/benchmarks.md").read_text(), (
        "docs/benchmarks.md differs from its template + results: run "
        "`.venv/bin/python scripts/bench_report.py --write-docs`")
