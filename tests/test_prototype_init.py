"""Stage 1's k-means prototype start (training/prototype_init.py): the background prototype is
the cluster of the border, the centroids are the means of planted clusters, a training run with
`model.prototype_init="kmeans"` starts exactly there, and an unknown init is refused by name."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from metonymy import loading
from metonymy.training import inputs
from metonymy.training import prototype_init
from metonymy.training import trainer
from tests.helpers import compile_cache
from tests import test_train

compile_cache.enable()


def _ring(height, width):
  ring = np.zeros((height, width), bool)
  ring[0], ring[-1], ring[:, 0], ring[:, -1] = True, True, True, True
  return ring


def test_the_background_is_the_cluster_holding_the_border_ring():
  labels = np.ones((2, 6, 6), int)
  labels[:, _ring(6, 6)] = 2
  labels[:, 2:4, 2:4] = 0
  assert list(prototype_init.background_last(labels, 3)) == [0, 1, 2]
  swapped = np.choose(labels, [2, 1, 0])  # now cluster 0 holds the border
  assert list(prototype_init.background_last(swapped, 3)) == [1, 2, 0]


def test_kmeans_prototypes_are_the_planted_means_with_the_background_last():
  rng = np.random.default_rng(0)
  num_parts, dim = 3, 6
  means = rng.normal(size=(num_parts + 1, dim)) * 5  # well apart; the last is the background
  ids = np.full((8, 8), num_parts)
  ids[1:4, 1:7], ids[4:7, 1:4], ids[4:7, 4:7] = 0, 1, 2
  ids = np.broadcast_to(ids, (20, 8, 8))
  features = means[ids] + 0.01 * rng.normal(size=ids.shape + (dim,))
  prototypes = prototype_init.kmeans_prototypes(features.astype(np.float32), num_parts, seed=0)
  assert prototypes.shape == (num_parts + 1, dim) and prototypes.dtype == np.float32
  np.testing.assert_allclose(prototypes[-1], means[-1], atol=0.01)
  nearest = [int(np.argmin(((means - p) ** 2).sum(-1))) for p in prototypes[:-1]]
  assert sorted(nearest) == list(range(num_parts))
  np.testing.assert_allclose(prototypes[:-1], means[nearest], atol=0.01)


def test_several_background_prototypes_are_the_border_clusters_last():
  labels = np.zeros((2, 6, 6), int)
  labels[:, _ring(6, 6)] = 3
  labels[:, 0, :] = 1  # the top row: a second border cluster, smaller than cluster 3's share
  labels[:, 2:4, 2:4] = 2
  assert list(prototype_init.background_last(labels, 4, num_background=2)) == [0, 2, 1, 3]
  assert list(prototype_init.background_last(labels, 4)) == [0, 1, 2, 3]
  rng = np.random.default_rng(1)
  means = rng.normal(size=(5, 6)) * 5  # parts 0-2, then two background clusters
  ids = np.full((8, 8), 4)
  ids[:, :4] = 3
  ids[2:6, 2:6] = np.array([[0, 0, 1, 1]] * 2 + [[2, 2, 2, 2]] * 2)
  ids = np.broadcast_to(ids, (20, 8, 8))
  features = (means[ids] + 0.01 * rng.normal(size=ids.shape + (6,))).astype(np.float32)
  prototypes = prototype_init.kmeans_prototypes(features, 3, seed=0, num_background=2)
  assert prototypes.shape == (5, 6)
  nearest = [int(np.argmin(((means - p) ** 2).sum(-1))) for p in prototypes]
  assert sorted(nearest[:3]) == [0, 1, 2] and sorted(nearest[3:]) == [3, 4]


def test_with_prototypes_replaces_stage1s_in_a_single_or_two_stage_tree():
  single = {"prototypes": jnp.zeros((3, 2)), "norm": {"scale": jnp.ones(2)}}
  new = np.arange(6, dtype=np.float32).reshape(3, 2)
  replaced = prototype_init.with_prototypes(single, new)
  np.testing.assert_array_equal(replaced["prototypes"], new)
  assert replaced["norm"] is single["norm"]
  two_stage = {"stage1": single, "stage2": {"head": jnp.ones(1)}}
  replaced = prototype_init.with_prototypes(two_stage, new)
  np.testing.assert_array_equal(replaced["stage1"]["prototypes"], new)
  assert replaced["stage2"] is two_stage["stage2"]
  with pytest.raises(ValueError, match=r"\(2, 2\)"):
    prototype_init.with_prototypes(single, new[:2])


@pytest.mark.parametrize("model, match", [
    ({"prototype_init": "k-means"}, "prototype_init='k-means'"),
    ({"prototype_init": "kmeans", "prototype_init_images": 0}, "prototype_init_images >= 1"),
])
def test_an_unknown_init_or_no_images_is_refused_by_name(model, match):
  with pytest.raises(ValueError, match=match):
    prototype_init.check(ml_collections.ConfigDict(model))


@pytest.mark.slow
def test_a_run_starts_its_prototypes_at_the_kmeans_centroids(tmp_path):
  config = test_train._config(num_steps=2)  # pylint: disable=protected-access
  config.model.prototype_init = "kmeans"
  config.model.prototype_init_images = 16
  config.optimizer.learning_rates.prototypes = 0.0  # the checkpoint then holds the start
  trainer.run(config, tmp_path / "run")
  trained = loading.load_trained_part_model(tmp_path / "run")
  train_source, _ = inputs.sources(config.data)
  features = prototype_init.patch_features(prototype_init.stage1_of(trained.model),
                                           trained.frozen, train_source, config.data, 16)
  expected = prototype_init.kmeans_prototypes(features, trained.num_parts, config.seed)
  np.testing.assert_array_equal(np.asarray(trained.params["prototypes"]), expected)
  # The model's own init is elsewhere: the start above is the k-means one, not a coincidence.
  size = config.data.image_size
  uniform = trained.model.init(jax.random.PRNGKey(config.seed), jnp.zeros((1, size, size, 3)))
  assert not np.allclose(np.asarray(uniform["prototypes"]), expected)
