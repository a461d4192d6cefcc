"""``folovllm serve`` with a fault injected into the launch of any step that samples for a request asking for
``max_tokens=77``, once two launches have sampled for it (its third token on). Run it with
``--no-engine-process``: the patch lives in this process only."""
import sys
from collections import Counter

from folovllm.entrypoints.cli import main
from folovllm.worker.model_runner import ModelRunner

FAULTY_MAX_TOKENS = 77


def install_fault() -> None:
    original = ModelRunner.launch
    faulty: set[str] = set()
    sampled: Counter[str] = Counter()  # launches that went through, per request (kept decode rows carry no count)

    def launch(self, step, *args, **kwargs):
        faulty.update(r.request_id for r in step.requests
                      if r.sampling is not None and r.sampling.params.max_tokens == FAULTY_MAX_TOKENS)
        ids = [r.request_id for r in step.requests if r.sampling is not None]
        ids += step.decodes.request_ids if step.decodes is not None else []
        if any(rid in faulty and sampled[rid] >= 2 for rid in ids):
            raise IndexError("injected sampling fault")
        launched = original(self, step, *args, **kwargs)
        sampled.update(ids)
        return launched

    ModelRunner.launch = launch


if __name__ == "__main__":
    install_fault()
    sys.exit(main(sys.argv[1:]))
