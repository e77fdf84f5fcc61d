"""What the world check measures (the package docstring says what and why): the position
baseline, where each part's evidence is, the masking mechanism on a backbone that learned the
world, the part legibility of its tokens and what the priors charge the truth; `run` is job
"world_check"."""

import json
import os
from typing import Dict, Optional

import ml_collections
import numpy as np
from sklearn import linear_model
from sklearn import preprocessing

from metonymy import console
from metonymy import loading
from metonymy.data import pipeline as pipeline_lib
from metonymy.data import synthetic
from metonymy.evaluation import patch_grid
from metonymy.evaluation import position_baseline
from metonymy.models import vit
from metonymy.probe import benchmark
from metonymy.probe import features as features_lib
from metonymy.runs import references
from metonymy.runs import stand_in
from metonymy.runs import subjobs
from metonymy.training import pretraining as pretrain
from metonymy.workdir import layout
from metonymy.workdir import Workdir


QUARTER = 0.25
# The mechanism is present when early masking loses at least this much colour accuracy from a
# quarter of each part, and late masking at least MARGIN less than early masking.
EARLY_GAP, MARGIN = 0.2, 0.1


def contiguous_quarters(part_ids: np.ndarray, num_parts: int, rng: np.random.Generator,
                        fraction: float = QUARTER) -> np.ndarray:
  """int32 [B, h, w]: each part reduced to the ceil(fraction * n) of its n patches nearest a
  random patch of it (ties broken at random); the rest of its patches become background (K)."""
  out = np.full_like(part_ids, num_parts)
  for b in range(part_ids.shape[0]):
    for k in range(num_parts):
      cells = np.argwhere(part_ids[b] == k)
      if not len(cells):
        continue
      keep = max(1, int(np.ceil(fraction * len(cells))))
      centre = cells[rng.integers(len(cells))]
      distance = ((cells - centre) ** 2).sum(1) + rng.uniform(0, 0.5, len(cells))
      chosen = cells[np.argsort(distance)[:keep]]
      out[b, chosen[:, 0], chosen[:, 1]] = k
  return out


def _examples(source, count: int):
  return [source[i] for i in range(min(count, len(source)))]


def position_baseline_scores(train, test, image_size: int, num_parts: int,
                             seed: int) -> Dict[str, float]:
  stack = lambda examples, key: np.stack([e[key] for e in examples])
  size = (image_size, image_size)
  baseline = position_baseline.fit(stack(train, "keypoints"), stack(train, "keypoint_visible"),
                                   size, num_parts, seed=seed)
  scores = baseline.scores(stack(test, "keypoints"), stack(test, "keypoint_visible"), size)
  return {"NMI": scores["parts/position_NMI"], "ARI": scores["parts/position_ARI"]}


def evidence_geometry(test, num_parts: int, patch_size: int,
                      rng: np.random.Generator) -> Optional[Dict[str, list]]:
  """Per part: the share of images where its patches hold some of its evidence pixels, whole
  and in a contiguous quarter. None for a world whose parts show their attributes everywhere."""
  if "part_evidence" not in test[0]:
    return None
  segmentation = np.stack([e["part_segmentation"] for e in test])
  evidence = np.stack([e["part_evidence"] for e in test])
  ids, _ = patch_grid.patch_part_ids(patch_grid.segmentation_part_labels(segmentation, num_parts),
                                num_parts, patch_size)
  quarters = contiguous_quarters(ids, num_parts, rng)
  b, h, w = ids.shape
  whole, quarter, counted = np.zeros(num_parts), np.zeros(num_parts), np.zeros(num_parts)
  for k in range(num_parts):
    pixels = (evidence & (segmentation == k + 1)).reshape(b, h, patch_size, w, patch_size)
    in_patch = pixels.any((2, 4))  # [B, h, w]: the patch holds evidence pixels of part k
    present = (ids == k).any((1, 2))
    counted[k] = present.sum()
    whole[k] = (in_patch & (ids == k)).any((1, 2))[present].sum()
    quarter[k] = (in_patch & (quarters == k)).any((1, 2))[present].sum()
  share = lambda x: (x / np.maximum(counted, 1)).round(3).tolist()
  return {"whole_sees_evidence": share(whole), "quarter_sees_evidence": share(quarter)}


def _features(extractors, params, examples, transforms, part_ids_of, batch_size=64):
  """{masking: float [N, K, D]} of the examples under the part ids `part_ids_of(batch)`."""
  out = {name: [] for name in extractors}
  batches = pipeline_lib.make_pipeline(examples, batch_size=batch_size, train=False,
                                       transforms=transforms, shard_index=0, shard_count=1)
  for batch in batches:
    valid = np.asarray(batch["valid"], bool)
    n = int(valid.sum())
    part_ids, coverage = part_ids_of(batch)
    for name, fn in extractors.items():
      features, _ = fn(params, np.asarray(batch["image"], np.float32), part_ids, coverage)
      out[name].append(np.asarray(features, np.float32)[:n])
  return {name: np.concatenate(chunks) for name, chunks in out.items()}


def mechanism(model, params, vit_config, transforms, train, test, latents_train, latents_test,
              num_parts: int, seed: int) -> Dict:
  """Probe accuracy [masking][region][attribute] -> per-part list and mean; see the docstring.
  `transforms`: the backbone's evaluation transforms (benchmark.eval_transforms)."""
  extractors = features_lib.make_extractors(model, num_parts)
  patch = vit_config.patch_size

  def regions(rng):
    def whole(batch):
      labels = patch_grid.segmentation_part_labels(batch["part_segmentation"], num_parts)
      return patch_grid.patch_part_ids(labels, num_parts, patch)

    def quarter(batch):
      ids, coverage = whole(batch)
      return contiguous_quarters(ids, num_parts, rng), coverage
    return {"whole": whole, "quarter": quarter}

  feats = {}
  for split, examples in (("train", train), ("test", test)):
    rng = np.random.default_rng([seed, len(split)])
    for region, part_ids_of in regions(rng).items():
      for masking, value in _features(extractors, params, examples, transforms,
                                      part_ids_of).items():
        feats[(split, region, masking)] = value
  result: Dict = {"chance": {}}
  for attribute in ("color", "pattern"):  # the strongest trivial probe: the majority class
    majority = []
    for k in range(num_parts):
      y_train = np.array([lat[attribute][k] for lat in latents_train])
      y_test = np.array([lat[attribute][k] for lat in latents_test])
      majority.append(float(np.mean(y_test == np.bincount(y_train).argmax())))
    result["chance"][attribute] = float(np.mean(majority))
  for masking in ("early", "late"):
    for region in ("whole", "quarter"):
      for attribute in ("color", "pattern"):
        accuracy = []
        for k in range(num_parts):
          x_train = feats[("train", region, masking)][:, k]
          x_test = feats[("test", region, masking)][:, k]
          y_train = np.array([lat[attribute][k] for lat in latents_train])
          y_test = np.array([lat[attribute][k] for lat in latents_test])
          scaler = preprocessing.StandardScaler().fit(x_train)
          probe = linear_model.LogisticRegression(C=1.0, max_iter=2000).fit(
              scaler.transform(x_train), y_train)
          accuracy.append(float(probe.score(scaler.transform(x_test), y_test)))
        result.setdefault(masking, {}).setdefault(region, {})[attribute] = {
            "per_part": np.round(accuracy, 3).tolist(), "mean": float(np.mean(accuracy))}
  for masking in ("early", "late"):
    result[masking]["color_gap"] = (result[masking]["whole"]["color"]["mean"]
                                    - result[masking]["quarter"]["color"]["mean"])
  result["present"] = bool(result["early"]["color_gap"] >= EARLY_GAP and
                           result["late"]["color_gap"] <= result["early"]["color_gap"] - MARGIN)
  return result


def _backbone(config, path: str):
  """(model, params, vit_config, description) or None."""
  if path:
    block = ml_collections.ConfigDict(config.backbone.to_dict())
    block.checkpoint = path
    model, params, arch = loading.build_backbone(block)
    return model, params, arch, path
  prefix, _, matches = stand_in.shipped_record(config, config.world)
  if not matches:
    return None
  arch, params, _, _ = pretrain.load_stand_in(prefix)
  return vit.VisionTransformer(arch), params, arch, os.path.relpath(prefix, stand_in.ASSETS)


def check(config, *, backbone: str = "", split: str = "val", train_images: int = 1500,
          images: int = 500, seed: int = 0) -> Dict:
  """Every number of the module docstring, as a dict."""
  if split == "test":
    raise ValueError("--split=test: a world is checked on val; test is for results only.")
  world = synthetic.SyntheticConfig.from_options(**config.world.to_dict())
  train_source = synthetic.SyntheticParts(world, "train")
  test_source = synthetic.SyntheticParts(world, split)
  train, test = _examples(train_source, train_images), _examples(test_source, images)
  num_parts = world.num_parts
  patch = int(config.backbone.arch.patch_size)
  rng = np.random.default_rng(seed)
  out = {"world": config.world.to_dict(), "split": split, "images": len(test),
         "train_images": len(train), "patch_grid": world.image_size // patch,
         "position_baseline": position_baseline_scores(train, test, world.image_size,
                                                       num_parts, seed),
         "evidence": evidence_geometry(test, num_parts, patch, rng)}
  data_cfg = subjobs.with_world(config.single, config.world).data
  data_cfg.eval_split, data_cfg.eval_examples = split, min(images, 256)
  out["priors_of_the_truth"] = references.priors_of_the_truth(data_cfg, patch)
  found = _backbone(config, backbone)
  if found is None:
    out["mechanism"] = None
    out["part_legibility"] = None
    out["backbone"] = None
  else:
    model, params, arch, described = found
    out["backbone"] = described
    transforms = benchmark.eval_transforms(
        arch, subjobs.with_world(config.benchmark, config.world).data)
    out["mechanism"] = mechanism(
        model, params, arch, transforms, train, test,
        [train_source.latents(i) for i in range(len(train))],
        [test_source.latents(i) for i in range(len(test))], num_parts, seed)
    # Its own fit / score split of the checked split's images: nothing of train.
    out["part_legibility"] = pretrain.part_legibility(model, params, test_source, transforms,
                                                      images=images, seed=seed)
  return out


def format_report(out: Dict) -> str:
  world = out["world"]
  lines = [f"world check on {out['split']} ({out['images']} images; fit on {out['train_images']} "
           f"train images): {world.get('image_size')} px, {out['patch_grid']} x "
           f"{out['patch_grid']} patches, world seed {world.get('seed')}",
           f"  position baseline (k-means on keypoint positions, no image): NMI "
           f"{out['position_baseline']['NMI']:.1f}, ARI {out['position_baseline']['ARI']:.1f}"]
  evidence = out["evidence"]
  if evidence is None:
    lines.append("  evidence: every pixel of a part shows its attributes (evidence_fraction 1)")
  else:
    lines.append("  evidence seen per part (whole part | contiguous quarter): " + ", ".join(
        f"{w:.2f} | {q:.2f}" for w, q in zip(evidence["whole_sees_evidence"],
                                             evidence["quarter_sees_evidence"])))
  mech = out["mechanism"]
  if mech is None:
    lines.append("  mechanism: skipped (no backbone given, --backbone or world_check.backbone, "
                 "and no shipped stand-in made by this world's recipe)")
  else:
    lines.append(f"  mechanism probes on {out['backbone']} (accuracy, mean over parts; chance: "
                 f"colour {mech['chance']['color']:.3f}, pattern {mech['chance']['pattern']:.3f}, "
                 f"the majority class of the train split):")
    for masking in ("early", "late"):
      m = mech[masking]
      lines.append(f"    {masking:5s}  colour whole {m['whole']['color']['mean']:.3f} quarter "
                   f"{m['quarter']['color']['mean']:.3f} (gap {m['color_gap']:+.3f}); pattern "
                   f"whole {m['whole']['pattern']['mean']:.3f} quarter "
                   f"{m['quarter']['pattern']['mean']:.3f}")
    lines.append(f"    mechanism present (early gap >= {EARLY_GAP}, late gap at least {MARGIN} "
                 f"smaller): {'yes' if mech['present'] else 'no'}")
  legible = out.get("part_legibility")
  if legible:
    lines.append(f"  part legibility of {out['backbone']}'s patch tokens: a patch's part, logistic "
                 f"probe balanced accuracy {legible['part_probe/balanced_accuracy']:.3f} (chance "
                 f"{legible['part_probe/chance']:.3f}); k-means on the foreground tokens vs the "
                 f"true parts NMI {legible['kmeans_fg/NMI']:.1f}")
  lines.append("  what the paper's priors charge the ground truth: " + ", ".join(
      f"{name} {value:.3f}" for name, value in out["priors_of_the_truth"].items()))
  return "\n".join(lines)



def run(config, workdir) -> Dict:
  """Job "world_check": `check` with the config's `world_check` options; the report is printed
  and written to WORKDIR/report.md, the numbers to WORKDIR/results.json."""
  out = check(config, **config.world_check.to_dict())
  report = format_report(out)
  console.console(report)
  files = Workdir(workdir)
  layout.write_text(files.output("report.md"), report + "\n")
  layout.write_text(files.output(layout.RESULTS_FILE), json.dumps(out, indent=1))
  return out
