"""``folovllm simulate``: FoloVLLM's own scheduler and KV cache manager on a virtual clock.

The model forward is replaced by a cost model that says how long each step takes
(``cost_model.py``: a linear fit from an engine ``--trace``, or ``roofline.py``: FLOPs and bytes
against a GPU's peaks); requests come from ``bench serve``'s generators; results come out in
``bench serve``'s JSON format. Imports: core, config, request, sampling_params, and bench's
datasets / arrivals / workload / results modules; never the engine, worker or model.
"""
