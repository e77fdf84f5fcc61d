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
     per part (training/pretraining.py), then, on world v3, continued by a dense self-supervised
     term beside that attribute term (training/self_supervised.py), which gives its last block
     the parts' geometry as DINO's has; image-level labels only, never part masks or keypoints.
     Its pretraining takes several times the demo's budget (docs/experiments.md; its record's
     `seconds`), so the stand-in made by exactly this recipe ships in metonymy/assets/ (one per
     world seed 0-2; `:stand_in` remakes one) and is used when the recipe matches, else it is
     pretrained here, as the demo says. Its own quality on `val` (attribute mAP of its heads,
     k-means of its tokens against the parts) is reported. Saved as a converted backbone folder,
     WORKDIR/backbone, usable as --config.backbone.checkpoint anywhere;
  2. the leakage benchmark of that backbone with ground-truth part masks, late vs early masking
     (job "probe" in WORKDIR/benchmark);
  3. single-stage and two-stage (STE) part discovery from it (job "train" in WORKDIR/single and
     WORKDIR/two_stage_ste);
  4. WORKDIR/report.md and WORKDIR/results.json gathering all of it.

Every block is a full sub-config, so any key can be overridden, e.g.
--config.single.trainer.num_steps=400 or --config.benchmark.evaluation.bootstrap=0.
arg (flags): none for the demo; `tiny`, a smoke run for tests (well under a minute of compute);
`world=v1|v2|v3`, the world (WORLDS below; v3 by default); `stand_in`, step 1 alone: pretrain the
stand-in anew and write it where the demo finds it, metonymy/assets/<stand_in_name>.{npz,json}
(the command that made the shipped files, one per world seed: add --config.world.seed=N; it saves
its state in DIR/pretraining_state every backbone_pretraining.checkpoint_every steps, and the
same command resumes a killed run there); `stand_in_objective=attributes|self_supervised|
attributes_then_dense`, the stand-in's objective (world v3 only: the supervised one; the
self-supervised one, SELF_SUPERVISED below; the supervised one continued by the dense term,
ATTRIBUTES_THEN_DENSE, the default; each shipped for world seeds 0-2, else pretrained first,
which docs/experiments.md times); `registers=N`, the stand-in's register tokens beside CLS from
its first pretraining step (Darcet et al. 2024; DINOv2 with registers has 4), shipped under its
name with `_reg<N>` (`registered_name`); -1 (the default): the objective's own (WORLDS), 0: none;
`dense_stages=N` (attributes_then_dense only), how many times the dense stage runs, each a cycle
of its own (schedule, teacher) continuing the stand-in the one before made (shipped for each N
with `_stage<N>` in its name when N > 1: `staged_name`); -1 (the default): the world's own.
"""

import ml_collections

from metonymy import config_lib

# "full" (the demo) or "tiny" (arg `tiny`) -> (train, val, test) world examples, pretraining
#   steps, training steps of the single-stage and the two-stage model (two-stage steps cost ~6x
#   more: K+1 isolated streams and a trainable ViT), training batch, evaluation examples,
#   bootstrap resamples, causal-leakage images. A world may set its own pretraining and
#   training steps (WORLDS); README's demo block gives the default world's measured time;
#   `tiny` renders at 32 px.
SIZES = {
    "full": dict(depth=4, splits=(8000, 500, 1000), pretrain_steps=3000,
             probe_train=2000, single_steps=1000, two_stage_steps=1000, train_batch=16,
             eval_examples=256, bootstrap=100, leakage_images=128),
    "tiny": dict(image_size=32, depth=2, splits=(96, 48, 64), pretrain_steps=10, probe_train=0,
                 single_steps=3, two_stage_steps=3, train_batch=4, eval_examples=8, bootstrap=10,
                 leakage_images=16),
}
# The worlds (arg `world=`): the resolution and the SyntheticConfig options of pose and evidence
# that differ from the world's defaults. Each world has its own shipped stand-ins
# (`stand_in_name`, one per world seed, in metonymy/assets/).
#   v1: rotation within 30 degrees, every pixel of a part shows its attributes, 48 px (12 x 12
#     patches). Objects at 55-70% of the image per object unit (the world's default is 36-50%):
#     at 48 px the default leaves 89.5% of the patches to the background and the legs under a
#     patch wide. Where a keypoint lies says which part it is (the position-only partition scores
#     about as well as any model), and one patch of a part shows its attributes.
#   v2: the world that can test part discovery (docs/experiments.md, "The world", has the world
#     checks on `val` it was chosen by; `python -m metonymy.data world-check` prints them): the
#     full circle of rotations, objects at 50-65% of the image per object unit, a translation of
#     at least 18% of the image either way (position alone no longer finds the parts), and each
#     part's colour and pattern on a disc of 15% of its area, the rest in a plain tone (a
#     contiguous quarter of a part often misses its evidence, the whole part rarely). 64 px:
#     16 x 16 patches. Its plain tone is one per image, shared by every part: a plain patch does
#     not say which part it is, and the stand-in's patch tokens do not know their part, so
#     nothing can find the parts.
#   v3: v2 with each part's plain region in a muted tone of its own (`plain_tone="part"`; no
#     palette colour, no attribute): a wing looks like a wing whatever its colour, as on real
#     images, while its colour and pattern are still on 15% of it.
WORLDS = {
    "v1": dict(image_size=48, stand_in_name="demo_stand_in_world{seed}",
               options={"scale_range": (0.55, 0.7)}),
    "v2": dict(image_size=64, stand_in_name="demo_stand_in_v2_world{seed}",
               options={"scale_range": (0.5, 0.65), "max_rotation": 180.0,
                        "min_translation": 0.18, "evidence_fraction": 0.15},
               # The stand-in's first third of its pretraining steps on the same world with every
               # pixel of a part showing its attributes: pretrained on v2 alone its loss stays on
               # the constant predictor's plateau (docs/experiments.md, "The world").
               warmup={"share": 1 / 3, "world": {"evidence_fraction": 1.0}}),
    "v3": dict(image_size=64, stand_in_name="demo_stand_in_v3_world{seed}",
               options={"scale_range": (0.5, 0.65), "max_rotation": 180.0,
                        "min_translation": 0.18, "evidence_fraction": 0.15,
                        "plain_tone": "part"},
               # The supervised stand-in: 1,000 warm-up and 4,000 v3 steps (with 2,000 v3 steps
               # the CLS mAP on `val` was still rising; docs/experiments.md).
               pretrain_steps=5000,
               warmup={"share": 1 / 5, "world": {"evidence_fraction": 1.0}},
               # `stand_in_objective=self_supervised`: the stand-in learns as DINOv2 does
               # (SELF_SUPERVISED), shipped under its own name.
               self_supervised=dict(stand_in_name="demo_stand_in_v3_ssl_world{seed}"),
               # `stand_in_objective=attributes_then_dense`: the supervised stand-in, then the
               # dense term (ATTRIBUTES_THEN_DENSE), shipped under its own name. The default: the
               # one stand-in whose last block holds the parts and that leaks as the paper's
               # backbones do (docs/experiments.md, "The stand-in continued").
               attributes_then_dense=dict(stand_in_name="demo_stand_in_v3_dense_world{seed}"),
               stand_in_objective="attributes_then_dense",
               # Part discovery with every prior at PDiscoFormer's weight, as the Table-3 job:
               # on the continued stand-in they find more of the parts than the attribute losses
               # alone and no run collapses; on the supervised stand-in they sent the object into
               # the background (docs/experiments.md, "Stage 1 on the continued stand-in"). 700
               # steps each: at 1,000 the demo ran too close to its 10 minutes. Total
               # variation at a quarter of PDiscoFormer's weight: more of the parts found on
               # `val` in every run seed of world seeds 0 and 1, the background channel nearer
               # the truth's share (docs/experiments.md, "The recipe revised").
               priors="paper", total_variation=0.25, single_steps=700, two_stage_steps=700),
}
# The self-supervised stand-in (training/self_supervised.py), chosen on `val` by the token
# geometry Stage 1 needs (docs/experiments.md, "The stand-in"): the dense within-image term
# alone (DINO, iBOT and masked pixels each moved the last block's geometry away from the parts),
# 400 steps (its val k-means NMI peaked by step 200-400 of a 1,200-step run and then drifted
# down): its steps, rates and the Recipe options that differ from the defaults.
SELF_SUPERVISED = dict(steps=400, batch_size=32, learning_rate=5e-4, weight_decay=0.04,
                       evaluate_every=100,
                       self_supervised={"brightness": 0.35, "dino": 0.0, "ibot": 0.0,
                                        "koleo": 0.0, "dense": 1.0})
WORLD = "v3"  # The world that can test part discovery (issue 27); v1, v2: the record.
PATCH = 4
# Stage 2's ViT learning rate at batch 64 (square-root scaled like every rate). The paper's 2e-6
# (config_lib.part_optimizer) moves the stand-in's ViT by ~7e-4 of its norm over the demo's
# 1,000 steps: only Stage 2's LayerNorm and head learn. Chosen on `val` (docs/experiments.md,
# "Single vs two-stage"): at 1e-4 the ViT moves by ~2e-2 of its norm and Stage 2's val mAP
# rises from 0.632 to 0.649 (3 run seeds; configs/synthetic_table3.py:paper_stage2_rate keeps
# the paper's).
STAGE2_BACKBONE_RATE = 1e-4


def stand_in_pretraining(chosen: dict, size: dict, shipped: bool) -> ml_collections.ConfigDict:
  """The supervised stand-in's pretraining on a world (`chosen`, a WORLDS entry): its steps, with
  its warm-up world's share of them first (the attribute losses' plateau on v3)."""
  pretraining = config_lib.backbone_pretraining(size["pretrain_steps"], batch_size=32,
                                                images=size["splits"][0])
  pretraining.shipped = shipped
  if "warmup" in chosen:
    total_steps = int(pretraining.steps)
    warmup_steps = round(chosen["warmup"]["share"] * total_steps)
    pretraining.steps = total_steps - warmup_steps
    pretraining.warmup_steps = warmup_steps
    pretraining.warmup_world = chosen["warmup"]["world"]
  return pretraining


def world(size: dict, correlation: float = 0.0, seed: int = 0) -> dict:
  """SyntheticConfig options of the demo's world (rendered at the model's resolution). `seed`
  (config.world.seed) draws the species schemes and every example: each step of the demo reads
  this one world."""
  n_train, n_val, n_test = size["splits"]
  return {"image_size": size["image_size"], "correlation": float(correlation), "seed": int(seed),
          **size["world_options"], "splits": {"train": n_train, "val": n_val, "test": n_test}}


def benchmark_config(size: dict, world_options: dict) -> ml_collections.ConfigDict:
  """The probe job of step 2 on `world_options` (config.world): one seed, ground-truth masks;
  backbone.checkpoint is set by the demo to the backbone it pretrained (or given on the command
  line)."""
  image_size = size["image_size"]
  config = ml_collections.ConfigDict()
  config.job = "probe"
  config.seeds = (0,)
  config.allow_random_backbone = False
  config.backbone = config_lib.backbone(checkpoint="", image_size=image_size)
  config.backbone_name = "demo-vit"
  config.data = config_lib.probe_data("synthetic", val="val", max_train=size["probe_train"],
                                      options=world_options)
  config.masks = config_lib.part_masks("ground_truth")
  config.backbone_pretraining = config_lib.backbone_pretraining()
  config.features = config_lib.part_features(batch_size=64, chunk_size=256)
  config.probe = config_lib.linear_probe()
  config.evaluation = config_lib.probe_evaluation(bootstrap=size["bootstrap"],
                                                  leakage_images=size["leakage_images"])
  config.report = ml_collections.ConfigDict({"title": (
      f"synthetic parts world, correlation {world_options['correlation']:g}, the demo's tiny ViT")})
  return config


def training_config(size: dict, world_options: dict, steps: int,
                    variant: str = "") -> ml_collections.ConfigDict:
  """Part discovery on the synthetic world (config_lib.part_discovery: single-stage, or the
  two-stage `variant`), its `runlocal` run at the demo's size on `world_options` (config.world);
  the backbone checkpoint is set by the demo. Losses and K are the recipe's own, the learning
  rates too but Stage 2's ViT's (STAGE2_BACKBONE_RATE; single-stage runs have no such group)."""
  config = config_lib.part_discovery("synthetic", "runlocal", variant)
  image_size = size["image_size"]
  config.backbone.image_size = image_size
  config.data.image_size = image_size
  config.data.options = world_options
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


# The supervised stand-in continued by the dense term beside its attribute term
# (`stand_in_objective=attributes_then_dense`): the attribute stage gives the CLS token and the
# patch tokens the attributes, the dense stage moves the last block's geometry towards the parts
# while the attribute term (its heads continued) keeps the attributes; chosen on `val` by its
# quality curve (docs/experiments.md, "The stand-in continued"). SELF_SUPERVISED's options.
ATTRIBUTES_THEN_DENSE = dict(SELF_SUPERVISED, steps=300, evaluate_every=50, self_supervised=dict(
    SELF_SUPERVISED["self_supervised"], attributes=1.0))
STAND_IN_OBJECTIVES = ("attributes", "self_supervised", "attributes_then_dense")


def registered_name(stand_in_name: str, registers: int) -> str:
  """The shipped name of a stand-in with `registers` register tokens: its name with `_reg<N>`
  before `_world{seed}` (none: the name itself), so stand-ins with and without registers are
  shipped side by side."""
  if not registers:
    return stand_in_name
  return stand_in_name.replace("_world{seed}", f"_reg{registers}_world{{seed}}")


def staged_name(stand_in_name: str, stage: int) -> str:
  """The shipped name of the stand-in made by dense stage `stage` (1: the name itself; N > 1:
  `_stage<N>` before `_world{seed}`), so every stage's stand-in ships beside the one it
  continues."""
  if stage <= 1:
    return stand_in_name
  return stand_in_name.replace("_world{seed}", f"_stage{stage}_world{{seed}}")


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  arg = config_lib.parse_arg(arg, tiny=False, stand_in=False, world=WORLD, stand_in_objective="",
                             registers=-1, dense_stages=-1)
  if arg.world not in WORLDS:
    raise ValueError(f"Config argument world={arg.world!r}: expected one of {sorted(WORLDS)}.")
  chosen = dict(WORLDS[arg.world])
  objective = arg.stand_in_objective or chosen.get("stand_in_objective", "attributes")
  offered = [o for o in STAND_IN_OBJECTIVES if o == "attributes" or o in chosen]
  if objective not in offered:
    raise ValueError(f"Config argument stand_in_objective={objective!r}: expected one of "
                     f"{offered} (world {arg.world}'s stand-ins).")
  supervised_name = chosen["stand_in_name"]
  if objective != "attributes":
    chosen.update(chosen[objective])
  registers = arg.registers if arg.registers >= 0 else chosen.get("registers", 0)
  dense_stages = (arg.dense_stages if arg.dense_stages >= 0
                  else chosen.get("dense_stages", 1) if objective == "attributes_then_dense"
                  else 1)
  if dense_stages < 1 or (dense_stages > 1 and objective != "attributes_then_dense"):
    raise ValueError(f"Config argument dense_stages={arg.dense_stages}: expected 1 or more, and "
                     "more than 1 only with stand_in_objective=attributes_then_dense.")
  size = dict(SIZES["tiny" if arg.tiny else "full"], world_options=chosen["options"])
  if not arg.tiny:  # A world's own stand-in schedule and training budget.
    size.update({k: chosen[k] for k in ("pretrain_steps", "single_steps", "two_stage_steps")
                 if k in chosen})
  size.setdefault("image_size", chosen["image_size"])
  image_size = size["image_size"]
  config = ml_collections.ConfigDict()
  config.job = "demo"
  config.mode = "story"  # "story" (this file) or "correlation_sweep" (demo_correlation_sweep.py)
  # The run seed of every sub-job (prototype init, Gumbel noise, data order and augmentation,
  # the benchmark's bootstrap); the world has its own (world.seed), the stand-in too.
  config.seed = 0
  config.stand_in_seed = 0  # the stand-in's init and pretraining (the shipped ones: 0)
  config.readme = ""  # a README path: rewrite its <!-- demo:results:begin/end --> block
  # Steps 2-3 (the benchmark, the two trainings) side by side in worker processes
  # (metonymy/runs/workers.py); 0: two on a CPU with 2+ cores, one on an accelerator.
  config.run_processes = 0
  config.world_name = arg.world
  # The world, defined once: every sub-job's data.options is this block (runs/subjobs.with_world
  # stamps it in at run time; main refuses an override of a sub-job's copy, naming this one).
  world_options = world(size)
  config.world = ml_collections.ConfigDict(world_options)
  # Step 1: the stand-in for DINO. Ignored when benchmark.backbone.checkpoint is given.
  config.backbone = config_lib.random_backbone(
      patch_size=PATCH, width=64, depth=size["depth"], num_heads=4, mlp_dim=128,
      num_registers=registers, pos_embed_grid=(image_size // PATCH, image_size // PATCH),
      image_size=image_size)
  # Use the stand-in shipped in metonymy/assets/ when it was made by exactly this recipe (arch,
  # seed, pretraining, world); otherwise (or with False) pretrain it here.
  shipped = not (arg.tiny or arg.stand_in)
  if objective == "attributes":
    config.backbone_pretraining = stand_in_pretraining(chosen, size, shipped=shipped)
  else:
    options = dict(SELF_SUPERVISED if objective == "self_supervised" else ATTRIBUTES_THEN_DENSE)
    if arg.tiny:  # Seconds: a few steps, small heads, no local views (half the compile).
      options.update(steps=size["pretrain_steps"], self_supervised=dict(
          options["self_supervised"], local_crops=0, prototypes=32, head_hidden=32))
    config.backbone_pretraining = config_lib.backbone_pretraining(
        images=size["splits"][0], objective="self_supervised", **options)
    config.backbone_pretraining.shipped = shipped
    if objective == "attributes_then_dense":
      # The stage it continues: the world's supervised stand-in (its shipped file when its
      # recipe matches, also when this one is remade with `stand_in`).
      config.backbone_pretraining.start_from = stand_in_pretraining(
          WORLDS[arg.world], size, shipped=not arg.tiny)
      config.backbone_pretraining.start_from.stand_in_name = registered_name(supervised_name,
                                                                             registers)
      for stage in range(2, dense_stages + 1):
        # The same dense stage again from the stand-in the one before made: a fresh schedule and
        # teacher, where one stage's curve had flattened (docs/experiments.md).
        earlier = config.backbone_pretraining.to_dict()
        earlier.update(shipped=not arg.tiny, stand_in_name=staged_name(
            registered_name(chosen["stand_in_name"], registers), stage - 1))
        config.backbone_pretraining.start_from = earlier
  # The shipped stand-ins of this world: metonymy/assets/<name>.{npz,json}, per world seed.
  config.stand_in_name = staged_name(registered_name(chosen["stand_in_name"], registers),
                                     dense_stages)
  # mode "stand_in" writes the pretrained stand-in to this path prefix (.npz + .json).
  config.stand_in_output = ""
  config.benchmark = benchmark_config(size, world_options)
  config.single = training_config(size, world_options, size["single_steps"])
  config.two_stage = training_config(size, world_options, size["two_stage_steps"], "ste")
  if "priors" in chosen:  # The world's part-discovery recipe (otherwise the configs' own).
    for run in (config.single, config.two_stage):
      config_lib.set_priors(run.loss, chosen["priors"], chosen.get("total_variation", -1.0))
  if arg.stand_in:  # Step 1 alone, pretraining anew: how metonymy/assets/ was made.
    config.mode = "stand_in"
    config.stand_in_output = "metonymy/assets/" + config.stand_in_name
  return config
