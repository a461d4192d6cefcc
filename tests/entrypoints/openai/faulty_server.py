"""``folovllm serve`` with a fault injected into the sampling of every request that asks for
``max_tokens=77`` (from its third token on), for the fault-isolation server tests. Run it with
``--no-engine-process``: the patch lives in this process only."""
import sys

from folovllm.entrypoints.cli import main
from folovllm.worker import model_runner

FAULTY_MAX_TOKENS = 77


def install_fault() -> None:
    original = model_runner.build_sampling_batch

    def build_sampling_batch(rows, *args, **kwargs):
        if any(r.params.max_tokens == FAULTY_MAX_TOKENS and r.num_output_tokens >= 2 for r in rows):
            raise IndexError("injected sampling fault")
        return original(rows, *args, **kwargs)

    model_runner.build_sampling_batch = build_sampling_batch


if __name__ == "__main__":
    install_fault()
    sys.exit(main(sys.argv[1:]))
