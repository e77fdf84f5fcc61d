"""Data: the synthetic parts world and the CUB / CelebA / CheXpert sources and pipelines."""
