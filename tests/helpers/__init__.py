"""What the tests share and are not tests: the compile cache, the shared runs, the GCS emulator,
the PyTorch reference models."""
