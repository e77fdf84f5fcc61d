"""Job "probe" as the launcher runs it: the leakage benchmark (metonymy/probe/job.py), each
random-init backbone first pretrained when `backbone_pretraining.steps > 0`
(`configs/probe_synthetic.py:trained`). The benchmark itself trains nothing; the pretraining is
a trainer (training/pretraining.py), handed to it from this floor."""

import functools

from metonymy import console
from metonymy.probe import benchmark
from metonymy.probe import job as probe_job
from metonymy.runs import stand_in


def pretrain_random_backbone(config, model, params, vit_config, seed: int):
  """The backbone's parameters after `config.backbone_pretraining` on the benchmark's training
  split (the seed initialised them and orders the data)."""
  pre = config.backbone_pretraining
  source, _, _ = benchmark.open_split(config.data, config.data.train, 0)
  console.console(f"[probe] pretraining the random-init backbone for {int(pre.steps)} steps on "
                  f"{config.data.dataset}/{config.data.train}")
  transforms = benchmark.eval_transforms(vit_config, config.data)
  return stand_in.pretrain(model, params, source, transforms, pre, seed).params


def run(config, workdir):
  prepare = None
  if "backbone_pretraining" in config and int(config.backbone_pretraining.steps) > 0:
    prepare = functools.partial(pretrain_random_backbone, config)
  return probe_job.run(config, workdir, prepare_backbone=prepare)
