"""Stage 1's prototypes started at k-means centroids of the frozen backbone's patch features.

config.model.prototype_init:
  "uniform"  PyTorch's default init of a bias-free 1x1 conv (models/stage1.py), the paper's.
  "kmeans"   k-means with K+1 clusters over the patch features Stage 1 reads (`Stage1.features`)
             of the first `config.model.prototype_init_images` training images, as the
             evaluation sees them (no augmentation). The cluster holding the largest share of
             the patch grid's border ring becomes the background prototype (index K, last);
             the others keep k-means' order. With M background prototypes
             (`config.model.background_prototypes`): K+M clusters, the M with the largest
             border shares last.

Why it exists: on a stand-in whose last-layer tokens do not hold the parts as their dominant
geometry, Stage 1 from the uniform init puts one part on most of the image and its prototypes
barely move at the paper's rates; from the k-means start it begins with every part in use
(docs/experiments.md, "Why Stage 1 finds nothing on v3"). The centroids are a function of the
data, the backbone and the seed only: every process computes the same ones, and a resumed run
recomputes them (like the rest of the step-0 parameters) rather than storing them.
"""

from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from metonymy import console
from metonymy.data import transforms

INITS = ("uniform", "kmeans")


def check(model_config) -> str:
  """The configured init (default "uniform"), refused by name when unknown."""
  init = model_config.get("prototype_init", "uniform")
  if init not in INITS:
    raise ValueError(f"config.model.prototype_init={init!r}: expected one of {INITS}.")
  if init == "kmeans" and int(model_config.get("prototype_init_images", 0)) < 1:
    raise ValueError("config.model.prototype_init='kmeans' needs "
                     "config.model.prototype_init_images >= 1, got "
                     f"{model_config.get('prototype_init_images', 0)}.")
  return init


def patch_features(stage1, frozen, source, data_config, count: int,
                   batch_size: int = 64) -> np.ndarray:
  """float32 [S, h, w, D]: what Stage 1 reads for the first `count` examples of `source`."""
  vit_config = stage1.backbone.config
  prepare = transforms.standard(data_config.image_size, train=False,
                                mean=vit_config.image_mean, std=vit_config.image_std)
  count = min(int(count), len(source))
  if count < 1:
    raise ValueError("The k-means prototype start needs at least one training image; the "
                     "training split is empty.")
  features = jax.jit(stage1.features)
  chunks = []
  for start in range(0, count, batch_size):
    images = np.stack([prepare({"image": source[i]["image"]})["image"]
                       for i in range(start, min(start + batch_size, count))])
    chunks.append(np.asarray(features(frozen, jnp.asarray(images, jnp.float32))))
  return np.concatenate(chunks)


def background_last(labels: np.ndarray, num_clusters: int,
                    num_background: int = 1) -> np.ndarray:
  """Cluster order putting the `num_background` clusters with the largest share of the border
  ring last.

  Args:
    labels: int [S, h, w], a cluster per patch.
    num_clusters: K+M.
    num_background: M.
  Returns:
    int [K+M], a permutation: the foreground clusters in their order, then the background's
    (the border's largest last).
  """
  height, width = labels.shape[1:]
  ring = np.zeros((height, width), bool)
  ring[0], ring[-1], ring[:, 0], ring[:, -1] = True, True, True, True
  border = np.bincount(labels[:, ring].ravel(), minlength=num_clusters)
  # The M largest (ties to the lower index, as argmax), the largest last.
  background = [int(c) for c in np.argsort(-border, kind="stable")[:num_background][::-1]]
  return np.array([c for c in range(num_clusters) if c not in background] + background)


def kmeans_prototypes(features: np.ndarray, num_parts: int, seed: int,
                      num_background: int = 1) -> np.ndarray:
  """float32 [K+M, D]: k-means centroids of `features` [S, h, w, D], the M background
  prototypes last."""
  # Imported here: scikit-learn's import costs a process ~1 s, and most runs never use it.
  from sklearn import cluster
  samples, height, width, dim = features.shape
  flat = np.asarray(features, np.float64).reshape(-1, dim)
  clusters = num_parts + num_background
  kmeans = cluster.KMeans(clusters, n_init=4, random_state=int(seed)).fit(flat)
  order = background_last(kmeans.labels_.reshape(samples, height, width), clusters,
                          num_background)
  return np.asarray(kmeans.cluster_centers_[order], np.float32)


def with_prototypes(params: Dict[str, Any], prototypes) -> Dict[str, Any]:
  """`params` with Stage 1's prototypes replaced: a Stage 1 tree ({"prototypes", ...}) or a
  two-stage one ({"stage1": {...}, "stage2": ...})."""
  if "stage1" in params:
    return dict(params, stage1=with_prototypes(params["stage1"], prototypes))
  if params["prototypes"].shape != prototypes.shape:
    raise ValueError(f"k-means prototypes {prototypes.shape} do not fit Stage 1's "
                     f"{params['prototypes'].shape}")
  return dict(params, prototypes=jnp.asarray(prototypes, params["prototypes"].dtype))


def stage1_of(model):
  """The Stage 1 of a single- or two-stage model."""
  return getattr(model, "stage1", model)


def initial_prototypes(model, frozen, train_source, config) -> Optional[np.ndarray]:
  """The trainer's start for Stage 1's prototypes: None for "uniform" (the model's own init),
  float32 [K+M, D] k-means centroids for "kmeans"."""
  if check(config.model) != "kmeans":
    return None
  features = patch_features(stage1_of(model), frozen, train_source, config.data,
                            config.model.prototype_init_images)
  console.console(f"Stage 1's prototypes start at k-means centroids of {features.shape[0]} "
                  f"training images' patch features (background: the border's cluster).")
  return kmeans_prototypes(features, model.num_parts, config.seed,
                           int(config.model.get("background_prototypes", 1)))
