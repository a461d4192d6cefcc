"""The FOLOVLLM_* table (folovllm/envs.py): values are checked, switches read as bools, every variable the
package names is declared there, and docs/environment.md shows the table as it is."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from folovllm import envs

PACKAGE = Path(__file__).resolve().parent.parent / "folovllm"


def test_values_are_checked_against_the_declaration(monkeypatch) -> None:
    monkeypatch.delenv("FOLOVLLM_CPU_DECODER", raising=False)
    assert envs.value("FOLOVLLM_CPU_DECODER") == "team"  # the default when unset
    monkeypatch.setenv("FOLOVLLM_CPU_DECODER", "chain")
    assert envs.value("FOLOVLLM_CPU_DECODER") == "chain"
    monkeypatch.setenv("FOLOVLLM_CPU_DECODER", "fast")
    with pytest.raises(ValueError, match="FOLOVLLM_CPU_DECODER='fast'; choose one of modules, direct, chain, team"):
        envs.value("FOLOVLLM_CPU_DECODER")
    with pytest.raises(ValueError, match="not a FoloVLLM environment variable"):
        envs.value("FOLOVLLM_NO_SUCH_THING")


def test_switches_are_bools(monkeypatch) -> None:
    monkeypatch.setenv("FOLOVLLM_CPU_FUSED_OPS", "off")
    assert envs.switch("FOLOVLLM_CPU_FUSED_OPS") is False
    monkeypatch.delenv("FOLOVLLM_CPU_FUSED_OPS")
    assert envs.switch("FOLOVLLM_CPU_FUSED_OPS") is True
    with pytest.raises(ValueError, match="not an on/off switch"):
        envs.switch("FOLOVLLM_CPU_ISA")


def test_every_variable_the_package_names_is_declared() -> None:
    named = {m for path in PACKAGE.rglob("*.py") for m in re.findall(r"FOLOVLLM_[A-Z0-9_]+(?![A-Z0-9_*])", path.read_text())}
    assert named and named <= set(envs.VARIABLES), sorted(named - set(envs.VARIABLES))


def test_a_cap_reaches_torchs_own_variables(monkeypatch) -> None:
    for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FOLOVLLM_CPU_ISA", "avx2")
    envs.cap_torch_kernels()
    assert os.environ["ATEN_CPU_CAPABILITY"] == "avx2" and os.environ["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert os.environ["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")  # set by the user: kept
    envs.cap_torch_kernels()
    assert os.environ["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE"


def test_the_environment_page_shows_the_table() -> None:
    page = (PACKAGE.parent / "docs" / "environment.md").read_text()
    assert envs.describe() in page, "docs/environment.md is stale: paste in `folovllm --help-env`"
