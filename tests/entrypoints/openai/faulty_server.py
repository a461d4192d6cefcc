"""``folovllm serve`` with a fault injected into the sampling of every request that asks for
``max_tokens=77`` (from its third token on), for the fault-isolation server tests. Run it with
``--no-engine-process``: the patch lives in this process only."""
import sys

from folovllm.entrypoints.cli import main
from folovllm.worker import model_runner

FAULTY_MAX_TOKENS = 77


def install_fault() -> None:
    original = model_runner._banned_token_ids

    def banned(request):
        if request.params.max_tokens == FAULTY_MAX_TOKENS and request.num_output_tokens >= 2:
            raise IndexError("injected sampling fault")
        return original(request)

    model_runner._banned_token_ids = banned


if __name__ == "__main__":
    install_fault()
    sys.exit(main(sys.argv[1:]))
