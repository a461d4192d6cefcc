"""``folovllm bench load``: each load in a fresh process, a variable's two values alternating, the figures
written; a switch it cannot take, or a model that is not there, is a clear error."""
from __future__ import annotations

import json

import pytest

from folovllm.bench import load
from folovllm.bench.host import make_tiny_llama
from folovllm.entrypoints.cli import main


def test_bench_load_times_each_value_of_a_switch_in_fresh_processes(tmp_path) -> None:
    make_tiny_llama(tmp_path / "tiny")
    model = str(tmp_path / "tiny")
    out = tmp_path / "load.json"
    assert main(["bench", "load", model, "--switch", "FOLOVLLM_HUGE_PAGE_WEIGHTS=off,on", "--rounds", "2",
                 "--max-model-len", "64", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["variable"] == "FOLOVLLM_HUGE_PAGE_WEIGHTS" and result["max_model_len"] == 64
    (figures,) = result["models"].values()
    assert set(figures["runs"]) == {"off", "on"}
    for value in ("off", "on"):
        runs = figures["runs"][value]
        assert len(runs) == 2 and all(r["ready_s"] > 0 and r["peak_rss_mib"] > 50 for r in runs)
        assert figures["median"][value]["ready_s"] == pytest.approx(sorted(r["ready_s"] for r in runs)[0] / 2
                                                                    + sorted(r["ready_s"] for r in runs)[1] / 2)


def test_bench_load_refuses_what_it_cannot_take(tmp_path, capsys) -> None:
    assert main(["bench", "load", str(tmp_path / "absent.gguf")]) == 2
    assert "no such model" in capsys.readouterr().err
    for switch in ("dtype=bfloat16,float32", "FOLOVLLM_GGUF_FAST_LOAD=on", "FOLOVLLM_GGUF_FAST_LOAD=on,maybe"):
        with pytest.raises(ValueError, match="FOLOVLLM_"):
            load.parse_variable_switch(switch)
    assert load.parse_variable_switch(None) == (None, ("",))
