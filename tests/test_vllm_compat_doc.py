"""docs/vllm-compatibility.md is generated from the code: it fails here when a flag, route, field or
metric changed without the page being regenerated."""
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def compat() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_compat", Path("scripts/vllm_compat.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def page(compat: ModuleType) -> str:
    return compat.render_docs()


def test_vllm_compatibility_page_matches_the_code(page: str):
    assert page == Path("docs/vllm-compatibility.md").read_text(), (
        "docs/vllm-compatibility.md is out of date: run `.venv/bin/python scripts/vllm_compat.py --write-docs`")


def test_no_metric_the_server_registers_is_reported_missing(compat: ModuleType, page: str):
    section = page.split("## Prometheus metrics", 1)[1].split("\n## ", 1)[0]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
             if line.startswith("| `")]
    status = {row[0].strip("`"): row[1] for row in cells}
    served = compat.served_metrics()  # the families the server's app registers, under its default prefix
    assert "vllm:num_requests_running" in served and status["vllm:num_requests_running"] == "yes"
    listed = served & status.keys()
    assert len(listed) > 1, f"the table names none of the served series {sorted(served)}"
    assert {name: status[name] for name in listed if status[name] != "yes"} == {}
    # a served series' FoloVLLM cell is the name it is served under
    assert all(row[2] == f"`{row[0].strip('`')}`" for row in cells if row[0].strip("`") in served)
