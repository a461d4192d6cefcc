"""Tensor parallelism's plumbing: process groups and their collectives, rank processes, the step channel.

``group.py``: one rank's ``TPGroup`` (all-reduce, gather to rank 0, min) over gloo (CPU) or NCCL (CUDA),
built without torch's global default group. ``launch.py``: a rendezvous on a free loopback port and
spawned rank processes. ``channel.py``: rank 0 hands each step's plain ``StepInput`` to the other
ranks. Model layers call the collectives; nothing here imports the model, worker or engine.
"""
