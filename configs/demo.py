"""The end-to-end demo on the synthetic parts world: nothing downloaded, under 10 minutes on 2 CPU
cores (README's first command).

  python -m metonymy.main --config=configs/demo.py --workdir=/tmp/metonymy_demo
  python -m metonymy.main --config=configs/demo.py --workdir=/tmp/metonymy_demo \
      --config.readme=README.md          # also rewrites README's results block
  python -m metonymy.main --config=configs/demo.py:tiny --workdir=/tmp/demo_tiny   # seconds

Steps (metonymy/demo/story.py), on the world with cross-part correlation 0, so any power of part j's
feature to predict part k's attributes is leakage:
  1. the stand-in for DINO: a tiny ViT (patch 4, width 64, depth 4; depth 2 for `tiny`)
     pretrained to predict every attribute from its CLS token and from one attention read-out
     per part (probe/pretrain.py; image-level labels only). Its 3,000 steps take ~8 minutes on
     2 CPU cores, so the stand-in made by exactly this recipe ships in metonymy/assets/ (one per
     world seed 0-2; `:stand_in` remakes one) and is used when the recipe matches, else it is
     pretrained here. Its own quality (attribute mAP of its heads on `val`) is reported. Saved as
     a converted backbone folder, WORKDIR/backbone, usable as --config.backbone.checkpoint
     anywhere;
  2. the leakage benchmark of that backbone with ground-truth part masks, late vs early masking
     (job "probe" in WORKDIR/benchmark);
  3. single-stage and two-stage (STE) part discovery from it (job "train" in WORKDIR/single and
     WORKDIR/two_stage_ste);
  4. WORKDIR/report.md and WORKDIR/results.json gathering all of it.

Every block is a full sub-config, so any key can be overridden, e.g.
--config.single.trainer.num_steps=400 or --config.benchmark.evaluation.bootstrap=0.
arg (flags): none for the demo; `tiny`, a smoke run for tests (well under a minute of compute);
`stand_in`, step 1 alone: pretrain the stand-in anew and write it where the demo finds it,
metonymy/assets/demo_stand_in_world<seed>.{npz,json} (the command that made the shipped files,
one per world seed: add --config.world.seed=N).
"""

import ml_collections

from metonymy import config_lib

# "full" (the demo) or "tiny" (arg `tiny`) -> image size, (train, val, test) world examples, pretraining steps, training steps of
#   the single-stage and the two-stage model (two-stage steps cost ~6x more: K+1 isolated
#   streams and a trainable ViT), training batch, evaluation examples, bootstrap resamples,
#   causal-leakage images. The default fits 10 minutes on 2 shared CPU cores with margin
#   (README gives the measured time).
SIZES = {
    "full": dict(image_size=64, depth=4, splits=(8000, 500, 1000), pretrain_steps=3000,
             probe_train=2000, single_steps=1000, two_stage_steps=1000, train_batch=16,
             eval_examples=256, bootstrap=100, leakage_images=128),
    "tiny": dict(image_size=32, depth=2, splits=(96, 48, 64), pretrain_steps=10, probe_train=0,
                 single_steps=3, two_stage_steps=3, train_batch=4, eval_examples=8, bootstrap=10,
                 leakage_images=16),
}
# The world's pose and evidence (docs/experiments.md, "The world", has the world checks on
# `val` they were chosen by; `python -m metonymy.data world-check` prints them). Pose: the full
# circle of rotations, objects at 50-65% of the image per object unit and a translation of at
# least 18% of the image either way, so that where a patch lies does not say which part it is
# (the position-only partition scores NMI 7-9 on world seeds 0-2; 41 on the earlier world with
# rotation within 30 degrees). Evidence: each part shows its colour and pattern on a disc of 15%
# of its area, the rest in a plain tone, so that a mask over a quarter of a part misses its
# evidence about a third of the time while the whole part shows it (0.85-0.99).
SCALE_RANGE = (0.5, 0.65)
MAX_ROTATION = 180.0
MIN_TRANSLATION = 0.18
EVIDENCE_FRACTION = 0.15
PATCH = 4
# Stage 2's ViT learning rate at batch 64 (square-root scaled like every rate). The paper's 2e-6
# (config_lib.part_optimizer) moves the stand-in's ViT by ~7e-4 of its norm over the demo's
# 1,000 steps: only Stage 2's LayerNorm and head learn. Chosen on `val` (docs/experiments.md,
# "Single vs two-stage"): at 1e-4 the ViT moves by ~2e-2 of its norm and Stage 2's val mAP
# rises from 0.632 to 0.649 (3 run seeds; configs/synthetic_table3.py:paper_stage2_rate keeps
# the paper's).
STAGE2_BACKBONE_RATE = 1e-4


def world(image_size: int, splits, correlation: float = 0.0, seed: int = 0) -> dict:
  """SyntheticConfig options of the demo's world (rendered at the model's resolution). `seed`
  (config.world.seed) draws the species schemes and every example: each step of the demo reads
  this one world."""
  n_train, n_val, n_test = splits
  return {"image_size": image_size, "correlation": float(correlation), "seed": int(seed),
          "scale_range": SCALE_RANGE, "max_rotation": MAX_ROTATION,
          "min_translation": MIN_TRANSLATION, "evidence_fraction": EVIDENCE_FRACTION,
          "splits": {"train": n_train, "val": n_val, "test": n_test}}


def benchmark_config(size: dict, correlation: float = 0.0) -> ml_collections.ConfigDict:
  """The probe job of step 2: one seed, ground-truth masks; backbone.checkpoint is set by the
  demo to the backbone it pretrained (or given on the command line)."""
  image_size, splits = size["image_size"], size["splits"]
  config = ml_collections.ConfigDict()
  config.job = "probe"
  config.seeds = (0,)
  config.allow_random_backbone = False
  config.backbone = config_lib.backbone(checkpoint="", image_size=image_size)
  config.backbone_name = "demo-vit"
  config.data = config_lib.probe_data("synthetic", val="val", max_train=size["probe_train"],
                                      options=world(image_size, splits, correlation))
  config.masks = config_lib.part_masks("ground_truth")
  config.backbone_pretraining = config_lib.backbone_pretraining()
  config.features = config_lib.part_features(batch_size=64, chunk_size=256)
  config.probe = config_lib.linear_probe()
  config.evaluation = config_lib.probe_evaluation(bootstrap=size["bootstrap"],
                                                  leakage_images=size["leakage_images"])
  config.report = ml_collections.ConfigDict({
      "title": f"synthetic parts world, correlation {correlation:g}, the demo's tiny ViT"})
  return config


def training_config(config_file: str, name: str, size: dict, steps: int,
                    correlation: float = 0.0) -> ml_collections.ConfigDict:
  """configs/<name>.py's runlocal variant at the demo's size, on the demo's world; the backbone
  checkpoint is set by the demo. Losses and K are the config's own, the learning rates too but
  Stage 2's ViT's (STAGE2_BACKBONE_RATE; single-stage runs have no such group)."""
  config = config_lib.load_sibling_config(config_file, name, "runlocal")
  image_size = size["image_size"]
  config.backbone.image_size = image_size
  config.data.image_size = image_size
  config.data.options = world(image_size, size["splits"], correlation)
  config.data.batch_size = size["train_batch"]
  config.data.eval_batch_size = size["train_batch"]
  config.data.eval_examples = size["eval_examples"]
  config.optimizer.learning_rates.backbone = STAGE2_BACKBONE_RATE
  # Scored on `test`: every choice of the demo's recipe was made looking at `val` only.
  config.data.eval_split = "test"
  config.trainer.num_steps = steps
  config.trainer.log_every_steps = max(1, steps // 6)
  config.trainer.eval_every_steps = steps
  config.trainer.checkpoint_every_steps = steps
  config.trainer.eval_images = 6
  return config


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  arg = config_lib.parse_arg(arg, tiny=False, stand_in=False)
  size = SIZES["tiny" if arg.tiny else "full"]
  image_size = size["image_size"]
  config = ml_collections.ConfigDict()
  config.job = "demo"
  config.mode = "story"  # "story" (this file) or "correlation_sweep" (demo_correlation_sweep.py)
  # The run seed of every sub-job (prototype init, Gumbel noise, data order and augmentation,
  # the benchmark's bootstrap); the world has its own (world.seed), the stand-in too.
  config.seed = 0
  config.stand_in_seed = 0  # the stand-in's init and pretraining (the shipped ones: 0)
  config.readme = ""  # a README path: rewrite its <!-- demo:results:begin/end --> block
  config.world = ml_collections.ConfigDict(world(image_size, size["splits"]))
  # Step 1: the stand-in for DINO. Ignored when benchmark.backbone.checkpoint is given.
  config.backbone = config_lib.random_backbone(
      patch_size=PATCH, width=64, depth=size["depth"], num_heads=4, mlp_dim=128,
      pos_embed_grid=(image_size // PATCH, image_size // PATCH), image_size=image_size)
  config.backbone_pretraining = config_lib.backbone_pretraining(
      size["pretrain_steps"], batch_size=32, images=size["splits"][0])
  # Use the stand-in shipped in metonymy/assets/ when it was made by exactly this recipe (arch,
  # seed, pretraining, world); otherwise (or with False) pretrain it here.
  config.backbone_pretraining.shipped = not (arg.tiny or arg.stand_in)
  # mode "stand_in" writes the pretrained stand-in to this path prefix (.npz + .json).
  config.stand_in_output = ""
  config.benchmark = benchmark_config(size)
  config.single = training_config(__file__, "synthetic_single", size, size["single_steps"])
  config.two_stage = training_config(__file__, "synthetic_ste", size, size["two_stage_steps"])
  if arg.stand_in:  # Step 1 alone, pretraining anew: how metonymy/assets/ was made.
    config.mode = "stand_in"
    config.stand_in_output = "metonymy/assets/demo_stand_in_world{seed}"
  return config
