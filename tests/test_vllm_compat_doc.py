"""docs/vllm-compatibility.md is generated from the code: it fails here when a flag, route, field or
metric changed without the page being regenerated."""
import importlib.util
from pathlib import Path


def test_vllm_compatibility_page_matches_the_code():
    spec = importlib.util.spec_from_file_location("vllm_compat", Path("scripts/vllm_compat.py"))
    compat = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compat)
    assert compat.render_docs() == Path("docs/vllm-compatibility.md").read_text(), (
        "docs/vllm-compatibility.md is out of date: run `.venv/bin/python scripts/vllm_compat.py --write-docs`")
