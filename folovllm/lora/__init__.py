"""LoRA adapters on one base model: requests name them, the worker holds them in slots, each targeted
linear adds its rows' ``x·Aᵀ·Bᵀ·scale`` by slot (``request``, ``adapter``, ``layers``, ``manager``)."""
