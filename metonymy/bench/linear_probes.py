"""Linear-probe throughput at CUB scale: K probes D -> A trained at once, weight decay chosen on a
validation split, then the test mAP matrix [K, G].

  python -m metonymy.bench probe                 # 6000 train+val x 8 parts x 768 dims -> 248
  python -m metonymy.bench probe --train 1200 --test 600 --dim 128   # quick

The features are random but not trivial: each part's feature is a noisy linear view of a shared
object latent plus a part-specific one, and the attributes (about 10% prevalence, like CUB's) are
thresholded linear functions of the part latents, so every probe has signal, the columns differ in
difficulty, and the solver runs as it would on real features.
"""

import time
from typing import Dict

import numpy as np

from metonymy.evaluation import metrics
from metonymy.probe import linear


def make_problem(num_train: int, num_test: int, num_parts: int, dim: int, num_attributes: int,
                 num_groups: int, seed: int = 0, latent_dim: int = 64, label_noise: float = 0.3,
                 shared_weight: float = 1.0):
  """Features [S, K, D] (train, test), labels [S, A] (train, test) and the attribute groups [A]."""
  rng = np.random.default_rng(seed)
  n = num_train + num_test
  shared = rng.standard_normal((n, latent_dim))
  own = rng.standard_normal((n, num_parts, latent_dim))
  mix = rng.standard_normal((num_parts, 2 * latent_dim, dim)) / np.sqrt(2 * latent_dim)
  latents = np.concatenate([np.broadcast_to(shared[:, None], own.shape), own], -1)
  x = np.einsum("skl,kld->skd", latents, mix) + 0.5 * rng.standard_normal((n, num_parts, dim))
  group = np.arange(num_attributes) % num_groups
  part_of_group = np.arange(num_groups) % num_parts
  teacher = rng.standard_normal((latent_dim, num_attributes)) / np.sqrt(latent_dim)
  score = np.einsum("sal,la->sa", own[:, part_of_group[group]], teacher)
  score += shared_weight * shared @ teacher + label_noise * rng.standard_normal(score.shape)
  y = (score > np.quantile(score, 0.9, axis=0)).astype(np.float32)
  x = x.astype(np.float32)
  return x[:num_train], y[:num_train], x[num_train:], y[num_train:], group


def run(num_train: int = 6000, num_test: int = 5794, num_parts: int = 8, dim: int = 768,
        num_attributes: int = 248, num_groups: int = 7, val_fraction: float = 0.2,
        weight_decays=linear.ProbeConfig.weight_decays, max_iters: int = 60,
        patience: int = linear.ProbeConfig.patience, seed: int = 0) -> Dict:
  x, y, x_test, y_test, group = make_problem(num_train, num_test, num_parts, dim, num_attributes,
                                             num_groups, seed)
  num_val = int(round(val_fraction * num_train))
  config = linear.ProbeConfig(weight_decays=tuple(weight_decays), max_iters=max_iters,
                              patience=patience)
  # Compilation is part of what a user waits for, so it is inside the timing.
  start, cpu_start = time.perf_counter(), time.process_time()
  probes = linear.train_probes(x[num_val:], y[num_val:], None, x[:num_val], y[:num_val], None,
                               config)
  trained = time.perf_counter()
  logits = probes.logits(x_test)
  map_matrix = metrics.map_matrix(logits, y_test, None, group, num_groups)
  end, cpu_end = time.perf_counter(), time.process_time()
  return {
      "shape": {"train": num_train - num_val, "val": num_val, "test": num_test,
                "parts": num_parts, "dim": dim, "attributes": num_attributes},
      "weight_decays": list(config.weight_decays),
      "patience": patience,
      "weight_decays_run": probes.path.tolist(),
      "iterations_per_weight_decay": probes.iterations.tolist(),
      "chosen_weight_decay": probes.weight_decay.tolist(),
      "train_seconds": trained - start,
      "test_map_seconds": end - trained,
      "total_seconds": end - start,
      "total_cpu_seconds": cpu_end - cpu_start,
      "test_map_matrix_mean": float(np.nanmean(map_matrix)),
  }


def format_result(r: Dict) -> str:
  s = r["shape"]
  return (f"probe benchmark: {s['parts']} parts x {s['dim']} dims -> {s['attributes']} attributes, "
          f"train {s['train']} / val {s['val']} / test {s['test']}\n"
          f"  weight decays run {r['weight_decays_run']} (grid {r['weight_decays']}, patience "
          f"{r['patience']}): iterations {r['iterations_per_weight_decay']}, chosen per part "
          f"{r['chosen_weight_decay']}\n"
          f"  train + weight-decay selection {r['train_seconds']:.1f} s, test mAP matrix "
          f"{r['test_map_seconds']:.1f} s, total {r['total_seconds']:.1f} s wall "
          f"({r['total_cpu_seconds']:.1f} s CPU; test mAP {r['test_map_matrix_mean']:.3f})")
