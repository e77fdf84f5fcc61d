"""metonymy: measuring and removing intra-object leakage ("visual metonymy") in vision transformers."""

__version__ = "0.1.0"
