"""Models: the ViT backbone family with early masking (and, later, the part-discovery stages)."""
