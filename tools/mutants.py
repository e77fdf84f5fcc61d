"""Mutation smoke check: plants plausible bugs, one at a time, in a temporary copy of the
repository, runs the tests that should catch each, and prints a caught/survived table.

  python tools/mutants.py                      # the quick mutants (CI runs this, ~3 min)
  python tools/mutants.py --all                # and those whose tests take minutes
  python tools/mutants.py ste_hard_gradient    # some, by name
  python tools/mutants.py --list --all

Exits non-zero unless every mutant is caught. A mutant whose target text is missing from the
source (the code moved on) fails the whole run before anything runs: update the mutant, do not
drop it. The targeted tests first run once on the unmutated copy, so a test that already fails
can never count as catching a bug. The working tree itself is never written to.
"""

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COPIED = ("metonymy", "tests", "configs", "colabs", "pyproject.toml")
TIMEOUT_S = 600


@dataclasses.dataclass(frozen=True)
class Mutant:
  name: str
  path: str  # Relative to the repository root.
  edits: Tuple[Tuple[str, str], ...]  # (exact text, replacement); each text must occur once.
  tests: Tuple[str, ...]  # pytest node ids (a file, a test, or one parametrization).
  bug: str
  slow: bool = False  # Its tests take minutes: run with --all (README), not in CI.


MUTANTS: Sequence[Mutant] = (
    # The science's invariants: PS sign, early masking, GELU parity, groupings, STE, soft bias.
    Mutant("ps_sign", "metonymy/evaluation/part_metrics.py",
           (("ps_g = mean_plus - mean_minus", "ps_g = mean_minus - mean_plus"),),
           ("tests/test_evaluation_metrics.py::test_part_specificity_hand_computed",),
           "PS sign swapped"),
    Mutant("last_layer_unmasked", "metonymy/models/vit.py",
           (("    for block in self.blocks:\n      x = block(x, mask, bias, rope, straight_through)",
             "    for i, block in enumerate(self.blocks):\n"
             "      last = i == len(self.blocks) - 1\n"
             "      x = block(x, None if last else mask, bias, rope, straight_through)"),),
           ("tests/test_vit_masking.py",),
           "block mask dropped in the last layer"),
    Mutant("tanh_gelu", "metonymy/models/vit.py",
           (("jax.nn.gelu(x, approximate=False)", "jax.nn.gelu(x, approximate=True)"),),
           ("tests/test_import_timm_style.py::test_parity_plain_and_early",),
           "tanh-approximate GELU in the ViT MLP"),
    Mutant("cub_wing_leg_swap", "metonymy/data/groupings.py",
           (('"leg": ("left leg", "right leg"),', '"leg": ("left wing", "right leg"),'),
            ('"wing": ("left wing", "right wing"),', '"wing": ("left leg", "right wing"),')),
           ("tests/test_data_real.py::test_cub_keypoint_groups_table_s7",),
           "CUB left wing and left leg swapped between Table S7 groups"),
    Mutant("ste_hard_gradient", "metonymy/models/vit.py",
           (("out = jax.lax.stop_gradient(hard) + (soft - jax.lax.stop_gradient(soft))",
             "out = hard + (soft - jax.lax.stop_gradient(soft))"),),
           ("tests/test_ste_gradients.py::test_ste_forward_is_hard_and_gradient_is_soft_in_every_layer",),
           "STE without stop_gradient on the hard branch"),
    Mutant("soft_bias_squared", "metonymy/models/attention_masks.py",
           (("return jnp.log(affinity + eps)[:, None]",
             "return jnp.log(affinity ** 2 + eps)[:, None]"),),
           ("tests/test_ste_gradients.py::test_soft_bias_by_hand_for_real_probabilities",),
           "soft bias uses the squared affinity"),
    # The grouping tables (item 1): a swap that keeps every count, so only the tables written
    # out by hand in the test can see it.
    Mutant("cub_s9_patterns_swapped", "metonymy/data/groupings.py",
           (('("has_back_pattern", "back", _PATTERNS),', '("has_back_pattern", "belly", _PATTERNS),'),
            ('("has_belly_pattern", "belly", _PATTERNS),', '("has_belly_pattern", "back", _PATTERNS),')),
           ("tests/test_data_real.py::test_cub_attribute_parts_table_s9_by_hand",),
           "CUB back and belly patterns swapped between Table S9 parts"),
    Mutant("celeba_s8_hat_ear_swapped", "metonymy/data/groupings.py",
           (('("hat", ("Wearing_Hat",)),', '("hat", ("Wearing_Earrings",)),'),
            ('("ear", ("Wearing_Earrings",)),', '("ear", ("Wearing_Hat",)),')),
           ("tests/test_data_real.py::test_celeba_attribute_parts_table_s8_by_hand",),
           "CelebA Wearing_Hat and Wearing_Earrings swapped between Table S8 parts"),
    Mutant("chexpert_tasks_reordered", "metonymy/data/groupings.py",
           (('"Lung Opacity", "Edema",\n    "Consolidation",',
             '"Lung Opacity", "Consolidation",\n    "Edema",'),),
           ("tests/test_data_real.py::test_chexpert_observations_and_tasks_by_hand",),
           "CheXpert Edema and Consolidation out of CheXlocalize's order"),
    # Losses.
    Mutant("bce_ignores_valid", "metonymy/training/losses.py",
           (("return jnp.sum(losses * valid) / jnp.maximum(jnp.sum(valid), 1.0)",
             "return jnp.mean(losses)"),),
           ("tests/test_losses.py::test_attribute_bce_hand_value_and_valid_mask",),
           "attribute BCE averages over unknown labels too"),
    Mutant("entropy_wrong_axis", "metonymy/training/losses.py",
           (("return jnp.mean(-jnp.sum(maps * jnp.log(jnp.maximum(maps, _TINY)), axis=1))",
             "return jnp.mean(-jnp.sum(maps * jnp.log(jnp.maximum(maps, _TINY)), axis=-1))"),),
           ("tests/test_losses.py::test_pixel_entropy_hand_value_and_finite_gradient_at_zero",),
           "pixel entropy summed over a spatial axis instead of the parts"),
    Mutant("attribute_head_frozen", "metonymy/training/losses.py",
           (("losses = optax.sigmoid_binary_cross_entropy(logits, labels)",
             "losses = optax.sigmoid_binary_cross_entropy(jax.lax.stop_gradient(logits), labels)"),),
           ("tests/test_train.py::test_short_run_lowers_the_loss_and_writes_everything",),
           "a stray stop_gradient: the attribute loss never trains anything", slow=True),
    # Routing.
    Mutant("routing_over_attributes", "metonymy/models/stage1.py",
           (("routing = jax.nn.softmax(scores, axis=-1)", "routing = jax.nn.softmax(scores, axis=1)"),),
           ("tests/test_stage1.py::test_logits_pooling_and_routing_follow_the_equations",),
           "routing softmax over the attributes instead of the parts"),
    # Masks.
    Mutant("prefix_groups_interleaved", "metonymy/models/attention_masks.py",
           (("prefix_groups = jnp.repeat(jnp.arange(num_parts + 1, dtype=jnp.int32), num_prefix)",
             "prefix_groups = jnp.tile(jnp.arange(num_parts + 1, dtype=jnp.int32), num_prefix)"),),
           ("tests/test_vit_masking.py",),
           "prefix copies' group ids interleaved instead of copy-major (wrong with registers)"),
    Mutant("selected_gradient_dropped", "metonymy/models/attention_masks.py",
           (("log_weight = log_selected - jax.lax.stop_gradient(log_selected)",
             "log_weight = jax.lax.stop_gradient(log_selected) - jax.lax.stop_gradient("
             "log_selected)"),),
           ("tests/test_two_stage.py::test_hard_gradient_reaches_the_selected_part_of_each_patch_only[0]",),
           "hard masks' Appendix F gradient silently dropped"),
    # Metrics.
    Mutant("ap_tie_start", "metonymy/evaluation/metrics.py",
           (("  end = _tie_group_end(s)\n  precision_at_end",
             "  end = _tie_group_start(s)\n  precision_at_end"),),
           ("tests/test_evaluation_metrics.py::test_ap_auroc_match_sklearn_with_ties_and_weights",),
           "AP takes the precision at the start of a tie group"),
    Mutant("nmi_ari_swapped", "metonymy/evaluation/part_metrics.py",
           (('{"nmi": 100.0 * nmi, "ari": 100.0 * ari', '{"nmi": 100.0 * ari, "ari": 100.0 * nmi'),),
           ("tests/test_evaluation_metrics.py::test_keypoint_nmi_ari_with_and_without_background",
            "tests/test_evaluation_metrics.py::test_keypoint_nmi_ari_two_points_per_group_hand_computed"),
           "keypoint NMI and ARI reported under each other's names"),
    Mutant("ps_from_auroc", "metonymy/probe/benchmark.py",
           (("mm = metrics.group_mean(ap, attr_group, num_groups)",
             "mm = metrics.group_mean(auc, attr_group, num_groups)"),),
           ("tests/test_probe.py::test_synthetic_world_random_init_vit",),
           "the benchmark's PS computed from AUROC instead of mAP", slow=True),
    Mutant("demo_summary_nmi_fg", "metonymy/demo/story.py",
           (('"nmi_single": single["NMI"],', '"nmi_single": single["NMI_fg"],'),),
           ("tests/test_demo.py::test_tiny_demo_writes_report_and_results",),
           "the demo's summary reports the foreground NMI as NMI", slow=True),
    # A fair single- vs two-stage comparison (Table 3): one Stage-1 init, a run seed that seeds.
    Mutant("two_stage_init_split", "metonymy/models/two_stage.py",
           (("    rng1, rng2 = rng, jax.random.fold_in(rng, 1)\n",
             "    rng1, rng2 = jax.random.split(rng)\n"),),
           ("tests/test_two_stage.py::test_both_arms_start_stage1_from_the_same_parameters",),
           "the two-stage model starts Stage 1 from another key than the single-stage model"),
    Mutant("demo_run_seed_dropped", "metonymy/runs/subjobs.py",
           (("  sub.seed = int(seed)\n", ""),),
           ("tests/test_demo.py::test_tiny_demo_seeds_every_sub_job_with_the_run_seed",),
           "the demo's sub-jobs keep their config's seed 0 whatever the run seed", slow=True),
    Mutant("term_gradient_wrong_group", "metonymy/training/objective.py",
           (("  keep = [g == group for g in jax.tree_util.tree_leaves(groups)]",
             "  keep = [g in (group, \"heads\") for g in jax.tree_util.tree_leaves(groups)]"),),
           ("tests/test_objective.py::test_each_term_norm_is_that_terms_own_gradient_at_the_prototypes"
            "[synthetic_single]",),
           "the mechanism's gradient norms take in the heads' gradient too"),
    # A gs:// workdir must stay a URL: os.path would turn it into a local "gs:" folder.
    Mutant("workdir_url_made_local", "metonymy/workdir/layout.py",
           (("  return epath.Path(text if not is_local(text) else os.path.abspath(text))",
             "  return epath.Path(os.path.abspath(text))"),),
           ("tests/test_workdir_layout.py::test_paths_are_absolute_locally_and_urls_stay_urls",),
           "a gs:// workdir is joined as a local path (the ./gs:/bucket folder)"),
    Mutant("paired_by_position", "metonymy/table3/stats.py",
           (("    seeds = sorted(s for v, s in by if v == variant and (baseline, s) in by)",
             "    seeds = [s for v, s in by if v == variant and (baseline, s) in by]"),
            ("      diffs = [by[(variant, s)].get(m) - by[(baseline, s)].get(m) for s in seeds",
             "      diffs = [by[(variant, s)].get(m) - by[(baseline, b)].get(m)\n"
             "               for s, b in zip(seeds, sorted(seeds))")),
           ("tests/test_table3.py::test_paired_differences_pair_by_seed_not_by_position",),
           "two-stage minus single-stage paired by position, not by run seed"),
    # Data transforms.
    Mutant("flip_pairs_not_swapped", "metonymy/data/transforms.py",
           (("      order[a], order[b] = b, a\n", "      order[a], order[b] = a, b\n"),),
           ("tests/test_data_pipeline.py::test_flip_swaps_pairs_and_their_segmentation_labels",),
           "horizontal flip keeps left/right keypoints unswapped"),
    Mutant("keypoints_untransposed", "metonymy/data/transforms.py",
           (("moved = points @ forward[:2, :2].T + forward[:2, 2]",
             "moved = points @ forward[:2, :2] + forward[:2, 2]"),),
           ("tests/test_data_pipeline.py::test_keypoint_dot_segmentation_and_masks_move_together",),
           "keypoints moved by the transposed affine matrix"),
    # Checkpoint mapping.
    Mutant("proj_not_transposed", "metonymy/converters/mapping.py",
           (('"out_kernel": np.ascontiguousarray(proj_weight.T.reshape(',
             '"out_kernel": np.ascontiguousarray(proj_weight.reshape('),),
           ("tests/test_import_timm_style.py::test_parity_plain_and_early",),
           "torch attention output projection imported without its transpose"),
    Mutant("qkv_heads_interleaved", "metonymy/converters/mapping.py",
           (("qkv_weight.T.reshape(width, 3, num_heads, head_dim)",
             "qkv_weight.T.reshape(width, 3, head_dim, num_heads).swapaxes(2, 3)"),),
           ("tests/test_import_timm_style.py::test_parity_plain_and_early",),
           "torch fused qkv split into heads along the wrong axis"),
    Mutant("kmeans_background_least_border", "metonymy/training/prototype_init.py",
           (("np.argsort(-border, kind=\"stable\")", "np.argsort(border, kind=\"stable\")"),),
           ("tests/test_prototype_init.py::"
            "test_the_background_is_the_cluster_holding_the_border_ring",),
           "the k-means start makes the cluster with the least border the background"),
    # Self-supervised pretraining (the stand-in): what the student may see and what it predicts.
    Mutant("mask_token_ignored", "metonymy/models/vit.py",
           (("      patches = jnp.where(token_mask[..., None], mask_token.astype(self.dtype), patches)",
             "      patches = patches + 0.0 * mask_token.astype(self.dtype)"),),
           ("tests/test_self_supervised.py::test_a_masked_patch_s_pixels_never_reach_the_network",),
           "masked patches enter the student with their pixels"),
    Mutant("ibot_target_masked", "metonymy/training/self_supervised.py",
           (("                           teacher_views.reshape((-1,) + teacher_views.shape[2:]),",
             "                           teacher_views.reshape((-1,) + teacher_views.shape[2:]),\n"
             "                           token_mask=token_mask, mask_token=params.get(\"mask_token\"),"),),
           ("tests/test_self_supervised.py::test_the_ibot_target_is_the_teacher_s_unmasked_view",),
           "the teacher's iBOT targets come from the masked view"),
    Mutant("part_norm_axes_swapped", "metonymy/models/stage1.py",
           (('  axes = (1, 2) if mode == "joint" else (2,)',
             '  axes = (2,) if mode == "joint" else (1, 2)'),),
           ("tests/test_stage1.py::"
            "test_joint_statistics_keep_a_part_s_area_and_per_part_statistics_erase_it",),
           "Stage 1's joint part-embedding statistics taken per part (and the other way round)"),
    Mutant("dino_own_view", "metonymy/training/self_supervised.py",
           (("      if s != t:\n", "      if True:\n"),),
           ("tests/test_self_supervised.py::"
            "test_dino_loss_pairs_every_student_view_with_the_other_teacher_views_only",),
           "DINO pairs a student view with the teacher's own view of it"),
    Mutant("dense_negatives_across_images", "metonymy/training/self_supervised.py",
           (("  keys = _unit(jax.lax.stop_gradient(teacher_tokens))\n",
             "  keys = _unit(jax.lax.stop_gradient(teacher_tokens))\n"
             "  keys = jnp.broadcast_to(keys.reshape(1, -1, keys.shape[-1]),\n"
             "                          (keys.shape[0], keys.shape[0] * keys.shape[1],"
             " keys.shape[-1]))\n"),),
           ("tests/test_self_supervised.py::"
            "test_the_dense_loss_draws_its_negatives_from_the_same_image_only",),
           "the dense term's negatives include the other images' tokens"),
    Mutant("dense_teacher_gets_gradient", "metonymy/training/self_supervised.py",
           (("  keys = _unit(jax.lax.stop_gradient(teacher_tokens))",
             "  keys = _unit(teacher_tokens)"),),
           ("tests/test_self_supervised.py::"
            "test_the_dense_loss_rewards_picking_the_token_at_the_same_image_point",),
           "the dense term's gradient reaches the teacher's tokens"),
    Mutant("geometric_target_centred_on_the_students_place",
           "metonymy/training/self_supervised.py",
           (("    offsets = cell[index][..., None, :] - cell",
             "    offsets = cell[:index.shape[1]][None, :, None, :] - cell"),),
           ("tests/test_self_supervised.py::"
            "test_the_geometric_dense_target_weighs_the_teachers_tokens_by_their_grid_distance",),
           "the geometric target is centred on the student token's place in its own view, not on "
           "the teacher token at its image point"),
    Mutant("stage_seed_ignored", "metonymy/runs/stand_in.py",
           (("  trained = pretrain(model, params, source, transforms, pre, _stage_seed(config, pre),",
             "  trained = pretrain(model, params, source, transforms, pre, _seed(config),"),),
           ("tests/test_pretraining.py::"
            "test_a_stage_seed_reseeds_the_continued_stage_only_and_is_part_of_its_recipe",),
           "a continued stage's own seed (stage_seed) is recorded but not used"),
    Mutant("registers_dropped", "metonymy/models/vit.py",
           (("          dict(params, register_tokens=registers.astype(params[\"cls_token\"].dtype)))",
             "          dict(params, register_tokens=jnp.zeros_like(registers)))"),),
           ("tests/test_vit_registers.py::"
            "test_added_registers_keep_every_weight_and_take_part_in_attention",),
           "the register tokens added to a trained ViT are all alike (zeros), so they learn alike"),
    Mutant("attribute_heads_ignored", "metonymy/training/pretraining.py",
           (("""  trained_heads = HEADS if recipe is None or recipe.attribute_heads == "cls_and_parts" else ("cls",)""",
             "  trained_heads = HEADS"),),
           ("tests/test_pretraining.py::"
            "test_the_attribute_term_trains_through_the_cls_head_alone_when_asked",),
           "attribute_heads=cls still trains the part read-out", slow=True),
    Mutant("correspondence_within_the_same_image", "metonymy/training/self_supervised.py",
           (("    return correspondence_loss(tokens, teacher, jnp.roll(teacher, 1, axis=0), index, inside,",
             "    return correspondence_loss(tokens, teacher, teacher, index, inside,"),
            ("                               target, jnp.roll(target, 1, axis=0))",
             "                               target, target)")),
           ("tests/test_self_supervised.py::"
            "test_the_correspondence_term_compares_each_image_with_another_one_of_the_batch",),
           "the cross-image correspondence term compares each image with itself", slow=True),
    Mutant("dense_pairs_ignore_the_crops", "metonymy/training/self_supervised.py",
           (("""        index, inside = corresponding_tokens(boxes[v], student_grid, seen["global_boxes"][t],
                                             grid)""", """        index, inside = corresponding_tokens(boxes[v], student_grid, boxes[v],
                                             student_grid)"""),),
           ("tests/test_pretraining.py::"
            "test_a_short_dense_pretraining_lowers_its_loss_and_brings_out_the_parts",),
           "the cross-view terms pair each token with the teacher's at its own place in the view",
           slow=True),
    Mutant("allocator_purges_its_pages", "metonymy/allocator.py",
           (('  child.setdefault("MALLOC_CONF", MALLOC_CONF)\n', ''),),
           ("tests/test_allocator.py::test_reexecutes_on_jemalloc_with_the_command_and_an_"
            "environment_that_keeps_its_pages",),
           "jemalloc at its default decay: it purges freed pages, and XLA's steps fault them in "
           "again"),
    Mutant("cluster_target_from_the_student", "metonymy/training/self_supervised.py",
           (("  flat = teacher_tokens.reshape(-1, width)", "  flat = global_tokens.reshape(-1, width)"),),
           ("tests/test_self_supervised.py::test_the_cluster_target_is_the_centroid_of_the_"
            "teacher_s_token_at_the_same_point",),
           "the cluster term's centroids and targets from the student's own tokens: a target "
           "the student meets by not moving"),
)


def _copy_repository(dest: str) -> None:
  ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
  for name in COPIED:
    source = os.path.join(ROOT, name)
    if os.path.isdir(source):
      shutil.copytree(source, os.path.join(dest, name), ignore=ignore)
    else:
      shutil.copy2(source, os.path.join(dest, name))


def _mutated(text: str, mutant: Mutant) -> str:
  for old, new in mutant.edits:
    count = text.count(old)
    if count != 1:
      raise SystemExit(f"mutant {mutant.name}: expected the target text exactly once in "
                       f"{mutant.path}, found it {count} times:\n{old}")
    text = text.replace(old, new)
  return text


def _pytest(copy: str, args: Sequence[str]) -> Tuple[int, str, float]:
  # PYTHONPATH first: the copy's package, not the editable install of the working tree.
  env = dict(os.environ, PYTHONPATH=copy, PYTHONDONTWRITEBYTECODE="1")
  start = time.time()
  proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                         *args], cwd=copy, env=env, capture_output=True, text=True,
                        timeout=TIMEOUT_S)
  return proc.returncode, proc.stdout + proc.stderr, time.time() - start


def _check_imports_from(copy: str) -> None:
  env = dict(os.environ, PYTHONPATH=copy)
  found = subprocess.run([sys.executable, "-c", "import metonymy; print(metonymy.__file__)"],
                         cwd=copy, env=env, capture_output=True, text=True, check=True)
  if not os.path.realpath(found.stdout.strip()).startswith(os.path.realpath(copy)):
    raise SystemExit(f"the copy imports metonymy from {found.stdout.strip()}, not from {copy}")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
  parser.add_argument("--all", action="store_true", help="also the slow mutants")
  parser.add_argument("--list", action="store_true", help="list the mutants and exit")
  args = parser.parse_args(argv)
  by_name = {m.name: m for m in MUTANTS}
  unknown = sorted(set(args.names) - set(by_name))
  if unknown:
    raise SystemExit(f"unknown mutants {unknown}; known: {sorted(by_name)}")
  chosen = ([by_name[n] for n in args.names] if args.names
            else [m for m in MUTANTS if args.all or not m.slow])
  if args.list:
    for m in chosen:
      print(f"{m.name:28s} {m.path:38s} {'slow ' if m.slow else ''}{m.bug}")
    return 0

  start = time.time()
  with tempfile.TemporaryDirectory(prefix="metonymy-mutants-") as copy:
    _copy_repository(copy)
    _check_imports_from(copy)
    originals = {}
    for m in chosen:  # Every target must exist before anything runs.
      with open(os.path.join(copy, m.path)) as f:
        originals[m.path] = f.read()
      _mutated(originals[m.path], m)

    baseline = sorted({test for m in chosen for test in m.tests})
    rc, output, seconds = _pytest(copy, baseline)
    print(f"baseline: the targeted tests on the unmutated copy: rc {rc} ({seconds:.0f} s)")
    if rc != 0:
      print(output[-6000:])
      raise SystemExit("the targeted tests fail without any mutant: fix them first")

    rows = []
    for m in chosen:
      path = os.path.join(copy, m.path)
      with open(path, "w") as f:
        f.write(_mutated(originals[m.path], m))
      try:
        rc, output, seconds = _pytest(copy, m.tests)
      finally:
        with open(path, "w") as f:
          f.write(originals[m.path])
      # rc 1: tests ran and failed. 0: they all passed. Anything else (collection or import
      # error, interrupted) proves nothing about the tests and counts as an error.
      result = {0: "SURVIVED", 1: "caught"}.get(rc, f"error (rc {rc})")
      failed = sum(1 for line in output.splitlines() if line.startswith("FAILED "))
      rows.append((m, result, failed, seconds))
      print(f"  {m.name}: {result} ({seconds:.0f} s)", flush=True)
      if rc not in (0, 1):
        print(output[-4000:])

  print()
  print(f"| mutant | where | bug | targeted tests | result | s |")
  print(f"|---|---|---|---|---|---|")
  for m, result, failed, seconds in rows:
    print(f"| {m.name} | `{m.path}` | {m.bug} | `{' '.join(m.tests)}` | {result} | {seconds:.0f} |")
  caught = sum(result == "caught" for _, result, _, _ in rows)
  print(f"\n{caught}/{len(rows)} caught in {time.time() - start:.0f} s (with the baseline run).")
  return 0 if caught == len(rows) else 1


if __name__ == "__main__":
  sys.exit(main())
