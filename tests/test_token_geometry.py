"""The stand-in's image-level read-outs (evaluation/token_geometry.py): the CLS probe reads the CLS
token and the pooled probe the mean of the patch tokens, each blind to what the other holds."""

import numpy as np

from metonymy.evaluation import token_geometry

IMAGES, PATCHES, WIDTH, ATTRIBUTES = 160, 4, 8, 3


def _world(attributes_in: str, seed: int = 0):
  """Images whose index the forward reads back, their attributes written into either the CLS
  token or every patch token, the other holding noise only."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 2, (IMAGES, ATTRIBUTES)).astype(np.float32)
  signal = np.zeros((IMAGES, WIDTH), np.float32)
  signal[:, :ATTRIBUTES] = 2.0 * labels - 1.0
  cls = rng.normal(size=(IMAGES, WIDTH)).astype(np.float32)
  patches = rng.normal(size=(IMAGES, PATCHES, WIDTH)).astype(np.float32)
  if attributes_in == "cls":
    cls += 2.0 * signal
  else:
    patches += 2.0 * signal[:, None]
  images = np.zeros((IMAGES, 8, 8, 3), np.float32)
  images[:, 0, 0, 0] = np.arange(IMAGES)

  def forward(batch):
    index = batch[:, 0, 0, 0].astype(int)
    return {"prefix_tokens": cls[index][:, None], "patch_tokens": patches[index]}

  segmentation = np.zeros((IMAGES, 8, 8), np.int32)
  segmentation[:, :4, :4], segmentation[:, 4:, 4:] = 1, 2  # two parts, two background patches
  return forward, images, segmentation, labels


def _probes(attributes_in):
  forward, images, segmentation, labels = _world(attributes_in)
  result = token_geometry.token_geometry(forward, images, segmentation, 2, 4, attributes=labels,
                                         per_block=False)
  return result["cls_probe/mAP"], result["pooled_probe/mAP"], result["cls_probe/chance"]


def test_the_cls_probe_reads_the_cls_token_and_the_pooled_probe_the_patch_tokens():
  cls, pooled, chance = _probes("cls")
  assert cls > 0.95 and pooled < chance + 0.2, (cls, pooled, chance)
  cls, pooled, chance = _probes("patches")
  assert pooled > 0.95 and cls < chance + 0.2, (cls, pooled, chance)
