"""Speed, memory and FLOP benchmarks of the models and the input pipeline: `python -m
metonymy.bench vit|probe|two_stage|suite ...` (flags: `--help`). Not the leakage benchmark, which
measures what part features encode (metonymy/probe/); these measure what computing them costs.
Speed is measured here, never in unit tests.

  cost           times (interleaved minima), XLA FLOPs and memory, peak FLOP/s: shared by all
  vit            Flax ViT vs its PyTorch reference, plain and early-masked (command `vit`)
  two_stage      single- vs two-stage model (command `two_stage`; suite section Table S5)
  linear_probes  linear probes at CUB scale (command `probe`)
  early_masking  plain vs early-masked forward, attention vs K and resolution (suite sections)
  pipeline       training input pipeline throughput (suite section)
  options        what a suite run measures, and the random-weight models and inputs it builds
  suite          the suite: every section in one run (command `suite`)
  tables         the suite's printed tables
"""
