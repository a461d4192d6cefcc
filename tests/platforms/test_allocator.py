"""The folovllm command's allocator: when it restarts with tcmalloc preloaded, and that it then runs on it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from folovllm.platforms import allocator
from folovllm.platforms.allocator import find_tcmalloc, loaded_allocator, preload_env

LIB = "/opt/lib/libtcmalloc_minimal.so.4"


def test_finds_the_first_installed_library(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    assert find_tcmalloc((str(first), str(second))) is None
    (second / "libtcmalloc.so.4").touch()
    assert find_tcmalloc((str(first), str(second))) == str(second / "libtcmalloc.so.4")
    (first / "libtcmalloc_minimal.so.4").touch()
    assert find_tcmalloc((str(first), str(second))) == str(first / "libtcmalloc_minimal.so.4")


def test_reads_the_allocator_from_the_process_maps(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert loaded_allocator(str(maps)) == "system"
    maps.write_text(maps.read_text() + f"7f02-7f03 r-xp 0 08:01 2 {LIB}\n")
    assert loaded_allocator(str(maps)) == "tcmalloc"
    assert loaded_allocator(str(tmp_path / "missing")) == "system"


@pytest.mark.parametrize("choice,library,has_gpu,preloaded,expected", [
    ("auto", LIB, False, None, LIB),
    ("auto", LIB, False, "/x/other.so", f"{LIB}:/x/other.so"),  # what was preloaded stays
    ("auto", None, False, None, None),  # nothing installed: glibc
    ("auto", LIB, True, None, None),  # a GPU machine: the engine runs there, not on the CPU
    ("tcmalloc", LIB, True, None, LIB),
    ("system", LIB, False, None, None),
    ("auto", LIB, False, LIB, None),  # already tried: a preload the loader refused is not retried
    ("tcmalloc", LIB, False, f"/x/other.so:{LIB}", None),
])
def test_when_the_command_restarts(monkeypatch, choice, library, has_gpu, preloaded, expected) -> None:
    monkeypatch.setenv("FOLOVLLM_CPU_ALLOCATOR", choice)
    env = {"PATH": "/bin"} if preloaded is None else {"PATH": "/bin", "LD_PRELOAD": preloaded}
    result = preload_env(env, library, has_gpu)
    assert (None if result is None else result["LD_PRELOAD"]) == expected
    if result is not None:
        assert result["PATH"] == "/bin"


def test_tcmalloc_asked_for_but_missing_is_an_error(monkeypatch) -> None:
    monkeypatch.setenv("FOLOVLLM_CPU_ALLOCATOR", "tcmalloc")
    with pytest.raises(ValueError, match="libtcmalloc-minimal4"):
        preload_env({}, None, has_gpu=False)


def _allocator_after_restart(choice: str) -> str:
    """A process that does what the folovllm command does first, then says which allocator it runs on."""
    code = ("from folovllm.platforms import allocator; allocator.restart_with_preferred_allocator(); "
            "print(allocator.loaded_allocator())")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"} | {"FOLOVLLM_CPU_ALLOCATOR": choice}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.skipif(sys.platform != "linux" or find_tcmalloc() is None, reason="no tcmalloc installed")
def test_the_restarted_process_runs_on_tcmalloc() -> None:
    assert _allocator_after_restart("tcmalloc") == "tcmalloc"
    assert _allocator_after_restart("system") == "system"


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/maps")
def test_without_a_library_the_process_is_left_alone(monkeypatch) -> None:
    monkeypatch.setattr(allocator, "find_tcmalloc", lambda: None)
    monkeypatch.setattr(allocator.os, "execve", lambda *a: pytest.fail("restarted without a library"))
    monkeypatch.setenv("FOLOVLLM_CPU_ALLOCATOR", "auto")
    allocator.restart_with_preferred_allocator()
    if loaded_allocator() != "tcmalloc":  # (this test process may itself run on tcmalloc)
        assert "allocator: glibc malloc" in allocator.allocator_hint()


@pytest.mark.skipif(sys.platform != "linux", reason="the restart is Linux's")
def test_the_command_says_so_when_tcmalloc_is_asked_for_but_missing(monkeypatch, capsys) -> None:
    from folovllm.entrypoints import cli

    monkeypatch.setattr(allocator, "find_tcmalloc", lambda: None)
    monkeypatch.setattr(allocator, "loaded_allocator", lambda: "system")
    monkeypatch.setattr(allocator.os, "execve", lambda *a: pytest.fail("restarted without a library"))
    monkeypatch.setattr(sys, "argv", ["folovllm", "--help-env"])
    monkeypatch.setenv("FOLOVLLM_CPU_ALLOCATOR", "tcmalloc")
    assert cli.main() == 2
    assert "no tcmalloc library is installed" in capsys.readouterr().err
