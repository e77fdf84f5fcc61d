"""The trainer's parts: sharding, optimizer, checkpoints, metric writers, periodic evaluation.

The loop itself is `metonymy/train.py` (job "train").
"""
