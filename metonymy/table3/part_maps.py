"""Fig. 4's inputs, computed by the job (report.py draws them): the first images the train runs
score, their true parts, and every variant's discovered parts at one run seed, each trained
model reloaded from its workdir."""

from typing import Dict, Optional, Tuple

import numpy as np

from metonymy import loading
from metonymy.evaluation import patch_grid
from metonymy.runs import subjobs
from metonymy.training import inputs
from metonymy.workdir import Workdir


def compute(config, dirs: Dict[Tuple[str, int], Workdir], seed: int,
            num_images: int) -> Optional[Dict]:
  """The figure's arrays at run seed `seed`, N = `num_images`; None when no variant ran at that
  seed or N is 0:

    images           float [N, H, W, 3] in [0, 1], as shown (the eval pipeline's, unnormalized)
    truth            int [N, H, W]: each pixel's true part (K: background), or None when the
                     world has no segmentation
    labels           {variant: int [N, H, W]}: each pixel's discovered part (K: background),
                     in config.variants order
    num_parts        K;  true_part_names: the world's part names;  seed
  """
  variants = [v for v in config.variants if (v, seed) in dirs]
  if not variants or num_images <= 0:
    return None
  trained = {v: loading.load_trained_part_model(dirs[(v, seed)]) for v in variants}
  first = trained[variants[0]]
  mean, std = first.model.backbone.config.image_mean, first.model.backbone.config.image_std
  data = subjobs.with_world(config.single, config.world).data
  source, _ = inputs.sources(data)
  batch = next(iter(inputs.eval_pipeline(source, data, mean, std, num_images)))
  images = np.asarray(batch["image"], np.float32)[:num_images]
  num_parts = int(first.num_parts)
  truth = (np.stack([patch_grid.segmentation_part_labels(source[i]["part_segmentation"], num_parts)
                     for i in range(num_images)])
           if "part_segmentation" in source[0] else None)
  labels = {v: np.asarray(model.pixel_labels(images, mean, std)[0])
            for v, model in trained.items()}
  return {"images": np.clip(images * np.asarray(std) + np.asarray(mean), 0.0, 1.0),
          "truth": truth, "labels": labels, "num_parts": num_parts,
          "true_part_names": list(source.info.part_names), "seed": int(seed)}
