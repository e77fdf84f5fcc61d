"""The trainer's parts: sharding, optimizer, checkpoints, metric writers, periodic evaluation.

The loop itself is `metonymy/training/trainer.py` (job "train").
"""
