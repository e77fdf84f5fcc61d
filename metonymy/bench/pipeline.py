"""How fast training data arrives (`bench suite` section "data"): the Grain training pipeline
over the synthetic world with the standard train augmentations (`training.inputs.train_pipeline`),
and the world's render rate on one core, to tell the two apart."""

import time
from typing import Any, Dict

from metonymy import config_lib
from metonymy.bench.options import Options
from metonymy.data import synthetic
from metonymy.training import inputs


def throughput(options: Options) -> Dict[str, Any]:
  """Examples per second of `options.data_batches` batches after the read-ahead has started, and
  of rendering `options.data_examples` examples alone."""
  config = options.vit_config()
  size = options.image_size
  data_config = config_lib.train_data("synthetic", image_size=size, train_split="train",
                                      eval_split="val", options={"image_size": size},
                                      batch_size=options.batch_size)
  source, _ = inputs.sources(data_config)
  iterator = iter(inputs.train_pipeline(source, data_config, config.image_mean, config.image_std,
                                        options.batch_size, options.seed))
  next(iterator)  # Starts the read-ahead threads.
  start = time.perf_counter()
  for _ in range(options.data_batches):
    next(iterator)
  seconds = time.perf_counter() - start
  world = synthetic.SyntheticConfig(image_size=size)
  return {"image_size": size, "batch_size": options.batch_size, "batches": options.data_batches,
          "worker_count": data_config.worker_count, "read_threads": data_config.read_threads,
          "pipeline_examples_per_second": options.data_batches * options.batch_size / seconds,
          "render_examples_per_second_one_core": synthetic.benchmark_examples_per_second(
              world, num_examples=options.data_examples)}
