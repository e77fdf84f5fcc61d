"""SAM's image encoder (models/sam_encoder.py) and its layouts (sam/original, sam/hf, sam/timm)
against PyTorch references with random weights.

References, all small (width 64, 4 blocks, window 3 with blocks 1 and 3 global, a 32-channel
neck, trained grid 8 x 8 = 128 px): segment_anything's `ImageEncoderViT` (its state dict under
`image_encoder.` beside a fake prompt encoder, as in `sam_vit_b_01ec64.pth`), Hugging Face
`SamVisionModel` (saved with `save_pretrained`) and timm's `VisionTransformerSAM`. A window of 3
on an 8 x 8 grid makes the windowed blocks pad (to 9 x 9), which SAM does with zero tokens that
stay in the attention.

Resolutions: 128 px (native) and 80 px (a 5 x 5 grid: the global blocks' relative tables go
from 15 to 9 entries, the absolute table from 8 x 8 to 5 x 5). At 80 px segment_anything and HF
resize the relative tables themselves (their own `get_rel_pos`) but add the absolute table
as is, so their table is swapped for torch's `interpolate(bicubic, antialias=True)` of it, which
is what timm does on its own (and timm is run unchanged). The slow tests do the same with the
real ViT-B architectures at 224 px.
"""

import functools
import json
import os

import jax
import numpy as np
import pytest

from tests.helpers import torch_reference as ref

torch = ref.torch
F = torch.nn.functional

from metonymy import converters as checkpoints  # noqa: E402
from metonymy import loading
from metonymy.converters import __main__ as checkpoints_cli  # noqa: E402
from metonymy.converters import registry  # noqa: E402
from metonymy.converters.io import RawCheckpoint  # noqa: E402
from metonymy.models import sam_encoder  # noqa: E402

SMALL = dict(width=64, depth=4, heads=4, mlp=128, window=3, global_blocks=(1, 3), neck=32,
             image=128)
SIZES = (128, 80)
BATCH = 2


@functools.lru_cache(maxsize=None)
def _forward(config: sam_encoder.SamEncoderConfig):
  model = sam_encoder.SamImageEncoder(config)
  return jax.jit(lambda params, images: model.apply({"params": params}, images))


def _report(what, error):
  print(f"{what}: max |diff| / max |ref| = {error:.2e}")


def _resized_abs_table(table, grid):
  """[1, h0, w0, D] -> [1, h, w, D] as timm's resample_abs_pos_embed_nhwc (bicubic, antialias)."""
  return F.interpolate(table.permute(0, 3, 1, 2), size=grid, mode="bicubic",
                       antialias=True).permute(0, 2, 3, 1)


def _compare(config, params, run_reference, size, what):
  """Our patch tokens (and pre-neck tokens, when the reference gives them) against the
  reference's at `size` px; returns the relative errors."""
  images = ref.random_images(BATCH, size, size, seed=size)
  neck, pre_neck = run_reference(images)
  out = _forward(config)(params, ref.nchw_to_nhwc(images))
  grid = size // 16
  errors = [ref.assert_close_to_reference(
      np.asarray(out["patch_tokens"]).reshape(BATCH, grid, grid, -1),
      neck.permute(0, 2, 3, 1), f"{what} patch tokens at {size} px")]
  if pre_neck is not None:
    errors.append(ref.assert_close_to_reference(
        np.asarray(out["pre_neck_tokens"]).reshape(BATCH, grid, grid, -1), pre_neck,
        f"{what} pre-neck tokens at {size} px"))
  assert out["prefix_tokens"].shape == (BATCH, 0, config.out_channels)
  _report(f"{what} at {size} px", max(errors))
  return errors


# --- References ----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _segment_anything_encoder():
  modeling = pytest.importorskip("segment_anything.modeling")
  torch.manual_seed(0)
  encoder = modeling.ImageEncoderViT(
      img_size=SMALL["image"], patch_size=16, embed_dim=SMALL["width"], depth=SMALL["depth"],
      num_heads=SMALL["heads"], mlp_ratio=SMALL["mlp"] / SMALL["width"], out_chans=SMALL["neck"],
      norm_layer=functools.partial(torch.nn.LayerNorm, eps=1e-6), use_rel_pos=True,
      window_size=SMALL["window"], global_attn_indexes=SMALL["global_blocks"]).eval()
  ref.randomize_(encoder, seed=1)
  return encoder


def _run_with_table(encoder, table_owner, images, blocks):
  """Runs `encoder` with its absolute table resized to the images' grid (timm's way), and
  returns (neck output NCHW, last block's output NHWC)."""
  grid = (images.shape[2] // 16, images.shape[3] // 16)
  saved = table_owner.pos_embed
  captured = {}
  hook = blocks[-1].register_forward_hook(lambda m, i, o: captured.update(x=o))
  try:
    if tuple(saved.shape[1:3]) != grid:
      table_owner.pos_embed = torch.nn.Parameter(_resized_abs_table(saved.detach(), grid))
    with torch.no_grad():
      out = encoder(images)
  finally:
    table_owner.pos_embed = saved
    hook.remove()
  out = getattr(out, "last_hidden_state", out)
  last = captured["x"][0] if isinstance(captured["x"], tuple) else captured["x"]
  return out, last


def _original_file(tmp_path_factory):
  encoder = _segment_anything_encoder()
  state = {"image_encoder." + k: v for k, v in encoder.state_dict().items()}
  state["prompt_encoder.pe_layer.positional_encoding_gaussian_matrix"] = torch.randn(2, 64)
  state["mask_decoder.iou_token.weight"] = torch.randn(1, 32)
  path = str(tmp_path_factory.mktemp("sam_original") / "sam_vit_tiny.pth")
  return ref.save_state_dict(state, path)


@pytest.fixture(scope="module")
def original(tmp_path_factory):
  path = _original_file(tmp_path_factory)
  config, params, layout = checkpoints.convert_checkpoint(path)
  return path, config, params, layout


@functools.lru_cache(maxsize=None)
def _hf_model():
  transformers = pytest.importorskip("transformers")
  config = transformers.SamVisionConfig(
      hidden_size=SMALL["width"], num_hidden_layers=SMALL["depth"],
      num_attention_heads=SMALL["heads"], mlp_dim=SMALL["mlp"], output_channels=SMALL["neck"],
      image_size=SMALL["image"], window_size=SMALL["window"],
      global_attn_indexes=list(SMALL["global_blocks"]), attn_implementation="eager")
  torch.manual_seed(0)
  model = transformers.SamVisionModel(config).eval()
  ref.randomize_(model, seed=2)
  return model


def _run_hf(images):
  model = _hf_model()
  encoder = model.vision_encoder
  saved_size = encoder.patch_embed.image_size
  encoder.patch_embed.image_size = tuple(images.shape[2:])  # HF refuses other sizes otherwise.
  try:
    return _run_with_table(model, encoder, images, encoder.layers)
  finally:
    encoder.patch_embed.image_size = saved_size


@functools.lru_cache(maxsize=None)
def _timm_model():
  timm_sam = pytest.importorskip("timm.models.vision_transformer_sam")
  torch.manual_seed(0)
  model = timm_sam.VisionTransformerSAM(
      img_size=SMALL["image"], patch_size=16, embed_dim=SMALL["width"], depth=SMALL["depth"],
      num_heads=SMALL["heads"], mlp_ratio=SMALL["mlp"] / SMALL["width"],
      global_attn_indexes=SMALL["global_blocks"], window_size=SMALL["window"], use_rel_pos=True,
      neck_chans=SMALL["neck"], num_classes=10).eval()
  ref.randomize_(model, seed=3)
  return model


def _run_timm(images):
  model = _timm_model()
  captured = {}
  hook = model.blocks[-1].register_forward_hook(lambda m, i, o: captured.update(x=o))
  with torch.no_grad():
    out = model.forward_features(images)  # timm resizes its absolute table itself.
  hook.remove()
  return out, captured["x"]


# --- Parity --------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", SIZES)
def test_original_layout_matches_segment_anything(original, size):
  _, config, params, layout = original
  assert layout == "sam/original"
  assert (config.window_size, config.global_blocks, config.num_heads) == (3, (1, 3), 4)
  assert (config.norm_eps, config.out_channels, config.pos_embed_grid) == (1e-6, 32, (8, 8))
  encoder = _segment_anything_encoder()
  _compare(config, params, lambda x: _run_with_table(encoder, encoder, x, encoder.blocks), size,
           "sam/original vs segment_anything")


@pytest.mark.parametrize("size", SIZES)
def test_hf_layout_matches_sam_vision_model(tmp_path_factory, size):
  folder = str(tmp_path_factory.mktemp("sam_hf"))
  _hf_model().save_pretrained(folder)
  model, params = checkpoints.load_backbone(folder)
  assert isinstance(model, sam_encoder.SamImageEncoder)
  assert model.config.global_blocks == (1, 3) and model.config.window_size == 3
  _compare(model.config, params, _run_hf, size, "sam/hf vs SamVisionModel")


def test_hf_full_sam_model_layout(tmp_path):
  """A SamModel file: the encoder under `vision_encoder.`, prompt encoder and mask decoder
  beside it, the vision settings nested in config.json's vision_config."""
  from safetensors.torch import save_file
  model = _hf_model()
  state = {k: v.contiguous() for k, v in model.state_dict().items()}
  assert all(k.startswith("vision_encoder.") for k in state)
  state["shared_image_embedding.positional_embedding"] = torch.randn(2, 16)
  state["prompt_encoder.point_embed.0.weight"] = torch.randn(1, 32)
  state["mask_decoder.iou_token.weight"] = torch.randn(1, 32)
  save_file(state, str(tmp_path / "model.safetensors"))
  with open(tmp_path / "config.json", "w") as f:
    json.dump({"model_type": "sam", "vision_config": model.config.to_dict()}, f)
  config, params, layout = checkpoints.convert_checkpoint(str(tmp_path))
  assert layout == "sam/hf" and config.global_blocks == (1, 3)
  _compare(config, params, _run_hf, 128, "sam/hf (SamModel file)")


@pytest.mark.parametrize("size", SIZES)
def test_timm_layout_matches_timm(tmp_path_factory, size):
  path = str(tmp_path_factory.mktemp("sam_timm") / "samvit_tiny.safetensors")
  ref.save_state_dict(_timm_model().state_dict(), path)
  config, params, layout = checkpoints.convert_checkpoint(path)
  assert layout == "sam/timm"
  assert config.norm_eps == 1e-5  # timm builds its blocks' LayerNorms with torch's default.
  _compare(config, params, _run_timm, size, "sam/timm vs timm")


def test_rel_pos_gather_is_sams_get_rel_pos():
  """The resize-and-gather matrix against segment_anything's `get_rel_pos` itself, for tables
  shorter, equal to and longer than 2 * size - 1 (ViT-B at 224 px: 127 -> 27)."""
  image_encoder = pytest.importorskip("segment_anything.modeling.image_encoder")
  rng = np.random.default_rng(0)
  for size, length in ((14, 127), (14, 27), (5, 15), (9, 15), (7, 5), (3, 5)):
    table = rng.normal(size=(length, 8)).astype(np.float32)
    want = image_encoder.get_rel_pos(size, size, torch.from_numpy(table)).numpy()
    got = np.einsum("ijl,lc->ijc", sam_encoder.rel_pos_gather(size, length), table)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6, err_msg=f"size {size}, L {length}")


# --- Loading, detection, the command line --------------------------------------------------------

def test_layouts_are_detected_from_keys_and_listed(original, tmp_path, capsys):
  path, config, _, _ = original
  raw = checkpoints.read_checkpoint(path)
  assert registry.find_layout(raw).full_name == "sam/original"
  # The encoder's own state dict (no `image_encoder.` prefix) is the original layout too.
  bare = {k[len("image_encoder."):]: v for k, v in raw.tensors.items()
          if k.startswith("image_encoder.")}
  assert registry.find_layout(RawCheckpoint(bare, "bare", "torch")).full_name == "sam/original"
  timm_keys = {k.replace("mlp.lin", "mlp.fc"): v for k, v in bare.items()}
  assert registry.find_layout(RawCheckpoint(timm_keys, "t", "safetensors")).full_name == "sam/timm"
  assert checkpoints_cli.main(["layouts"]) == 0
  listed = capsys.readouterr().out
  for layout in ("sam/original", "sam/hf", "sam/timm"):
    assert layout in listed
  # A SAM file is never taken for another family, and another family's never for SAM.
  assert "sam" in registry.families()


def test_convert_then_load_without_torch_gives_the_same_model(original, tmp_path):
  path, config, params, _ = original
  out = str(tmp_path / "converted")
  assert checkpoints_cli.main(["convert", "--input", path, "--output", out,
                               "--image-size", "224"]) == 0
  with open(os.path.join(out, "arch.json")) as f:
    arch = json.load(f)
  assert arch["sam_encoder_config"]["global_blocks"] == [1, 3]
  model, loaded = checkpoints.load_backbone(out)
  assert isinstance(model, sam_encoder.SamImageEncoder)
  assert model.config == config.replace(image_size=224)
  images = np.asarray(ref.nchw_to_nhwc(ref.random_images(1, 96, 96)))
  np.testing.assert_array_equal(_forward(model.config)(loaded, images)["patch_tokens"],
                                _forward(model.config)(params, images)["patch_tokens"])


def test_wrong_file_for_the_family_is_refused_by_name(original, tmp_path):
  path, _, _, _ = original
  raw = checkpoints.read_checkpoint(path)
  broken = dict(raw.tensors)
  del broken["image_encoder.blocks.2.attn.rel_pos_w"]
  broken["image_encoder.blocks.0.extra"] = np.zeros(3, np.float32)
  with pytest.raises(checkpoints.CheckpointError) as e:
    checkpoints.convert_raw(RawCheckpoint(broken, "broken.pth", "torch"), "sam")
  assert "image_encoder.blocks.2.attn.rel_pos_w" in str(e.value)
  assert "image_encoder.blocks.0.extra" in str(e.value)


# --- The benchmark contract ----------------------------------------------------------------------

def test_early_masking_is_refused_with_the_reason(original):
  _, config, params, _ = original
  model = sam_encoder.SamImageEncoder(config)
  images = np.zeros((1, 64, 64, 3), np.float32)
  with pytest.raises(ValueError, match="aggregation token"):
    model.apply({"params": params}, images, part_ids=np.zeros((1, 4, 4), np.int32), num_parts=1)


# --- The real architectures (ViT-B), slow ---------------------------------------------------------

@pytest.mark.slow
def test_vit_b_at_224_matches_segment_anything_and_timm(tmp_path):
  """sam_model_registry["vit_b"] (checkpoint=None) and timm samvit_base_patch16 (pretrained=False)
  at 224 px: the resized tables of the real architecture (global tables 127 -> 27)."""
  sam = pytest.importorskip("segment_anything")
  timm = pytest.importorskip("timm")
  torch.manual_seed(0)
  encoder = sam.sam_model_registry["vit_b"](checkpoint=None).image_encoder.eval()
  ref.randomize_(encoder, seed=4, scale=0.02)
  path = ref.save_state_dict({"image_encoder." + k: v for k, v in encoder.state_dict().items()},
                             str(tmp_path / "sam_vit_b.pth"))
  model, params = checkpoints.load_backbone(path, image_size=224)
  assert model.config == sam_encoder.get_config("sam_vit_b16", image_size=224)
  _compare(model.config, params, lambda x: _run_with_table(encoder, encoder, x, encoder.blocks),
           224, "sam/original ViT-B vs segment_anything")
  timm_model = timm.create_model("samvit_base_patch16", pretrained=False).eval()
  timm_model.load_state_dict({k.replace("mlp.lin", "mlp.fc"): v
                              for k, v in encoder.state_dict().items()}, strict=False)
  path = ref.save_state_dict(timm_model.state_dict(), str(tmp_path / "samvit.safetensors"))
  config, params, layout = checkpoints.convert_checkpoint(path)
  assert layout == "sam/timm" and config.global_blocks == (2, 5, 8, 11)
  images = ref.random_images(1, 224, 224, seed=5)
  with torch.no_grad():
    want = timm_model.forward_features(images)
  got = _forward(config)(params, ref.nchw_to_nhwc(images))["patch_tokens"]
  _report("sam/timm ViT-B vs timm at 224 px", ref.assert_close_to_reference(
      np.asarray(got).reshape(1, 14, 14, -1), want.permute(0, 2, 3, 1), "timm ViT-B"))


def _tiny_synthetic_probe(maskings):
  """The synthetic world's tiny probe job around a random-init tiny SAM encoder (patch 4)."""
  from metonymy import config_lib
  config = config_lib.load_sibling_config(
      os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "x"),
      "probe_synthetic", "tiny")
  config.evaluation.bootstrap = 0
  config.evaluation.overlay_images = 0
  config.features.maskings = maskings
  sam_config = sam_encoder.SamEncoderConfig(
      patch_size=4, width=32, depth=2, num_heads=2, mlp_dim=64, window_size=4, global_blocks=(1,),
      pos_embed_grid=(8, 8), out_channels=16, image_size=32)
  model, params = sam_encoder.init_params(sam_config, jax.random.PRNGKey(0))
  return config, model, params, sam_config


@pytest.mark.slow
def test_benchmark_runs_late_masking_and_refuses_early(tmp_path):
  from metonymy.probe import benchmark
  config, model, params, sam_config = _tiny_synthetic_probe(("late", "early"))
  with pytest.raises(ValueError, match="no aggregation token.*only late masking"):
    benchmark.evaluate("sam", model, params, sam_config, config, seed=0,
                       cache_root=str(tmp_path / "refused"), progress=False)
  assert not (tmp_path / "refused").exists()  # Refused before any feature was extracted.
  config.features.maskings = ("late",)
  results, _ = benchmark.evaluate("sam", model, params, sam_config, config, seed=0,
                                  cache_root=str(tmp_path / "late"), progress=False)
  assert results["maskings"] == ["late"]
  assert 0.0 < results["ps_late"] <= 1.0 and "ps_early" not in results
  assert results["causal_leakage_late"] > 0.0  # Late-masked features see the whole image.
  # Opted into part pooling, early masking runs, and leaks exactly nothing.
  config.features.maskings = ("late", "early")
  pooled = sam_config.replace(part_pooling=True)
  results, _ = benchmark.evaluate("sam-pooled", model.clone(config=pooled), params, pooled, config,
                                  seed=0, cache_root=str(tmp_path / "pooled"), progress=False)
  assert results["causal_leakage_early"] == 0.0
  assert results["causal_leakage_max_abs_change_early"] == 0.0
  assert 0.0 < results["ps_early"] <= 1.0


def test_suite_has_sam_with_late_masking_only():
  from metonymy import config_lib
  from metonymy.probe import job
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  config = config_lib.load_sibling_config(os.path.join(root, "configs", "x"), "probe_suite",
                                          "dataset=cub")
  sam = config.backbones.sam_vit_b16
  assert (sam.preset, sam.family, sam.image_size) == ("sam_vit_b16", "sam", 224)
  assert tuple(job._with_backbone_maskings(config, sam).features.maskings) == ("late",)
  assert tuple(job._with_backbone_maskings(config, config.backbones.dinov2).features.maskings) == (
      "late", "early")
  assert tuple(config.features.maskings) == ("late", "early")  # The suite's own is untouched.


@pytest.mark.slow
def test_random_init_sam_preset_builds_like_the_vits():
  from metonymy import config_lib
  model, params, built = loading.build_backbone(
      config_lib.backbone(preset="sam_tiny_test", image_size=64))
  assert isinstance(model, sam_encoder.SamImageEncoder) and built.image_size == 64
  assert params["blocks_1"]["attn"]["rel_pos_h"].std() > 0.01  # Random tables, not SAM's zeros.
  out = jax.eval_shape(lambda p, x: model.apply({"params": p}, x), params,
                       jax.ShapeDtypeStruct((1, 64, 64, 3), np.float32))
  assert out["patch_tokens"].shape == (1, 16, 32)


# --- Opt-in part pooling (early masking without a CLS) -------------------------------------------

NUM_PARTS = 3


@functools.lru_cache(maxsize=None)
def _pooled_forward(config: sam_encoder.SamEncoderConfig):
  model = sam_encoder.SamImageEncoder(config)
  return jax.jit(lambda params, images, part_ids: model.apply(
      {"params": params}, images, part_ids=part_ids, num_parts=NUM_PARTS))


def test_part_pooling_leaks_nothing_outside_the_part(original):
  """Pixels outside part k's patches replaced by another image's: part k's pooled feature stays
  bit-identical, at 80 px (5 x 5 grid: padded windows, and global blocks). Without the opt-in the
  same call is refused; the plain forward's pooled tokens do change (the check is not vacuous)."""
  _, config, params, _ = original
  pooled_config = config.replace(part_pooling=True)
  size, grid = 80, 5
  images = np.asarray(ref.nchw_to_nhwc(ref.random_images(BATCH, size, size, seed=7)))
  donors = np.asarray(ref.nchw_to_nhwc(ref.random_images(BATCH, size, size, seed=8)))
  part_ids = ref.random_part_ids(BATCH, (grid, grid), NUM_PARTS, seed=3)
  run = _pooled_forward(pooled_config)
  before = np.asarray(run(params, images, part_ids)["part_tokens"])
  assert before.shape == (BATCH, NUM_PARTS + 1, 1, config.out_channels)
  plain = _forward(config)
  for k in range(NUM_PARTS + 1):
    inside = np.kron(part_ids == k, np.ones((16, 16), bool))[..., None]  # [B, H, W, 1] pixels
    mixed = np.where(inside, images, donors)
    after = np.asarray(run(params, mixed, part_ids)["part_tokens"])
    np.testing.assert_array_equal(after[:, k], before[:, k], err_msg=f"part {k} leaked")
    others = [j for j in range(NUM_PARTS + 1) if j != k]
    assert np.abs(after[:, others] - before[:, others]).max() > 1e-3
    late = lambda x: (np.asarray(plain(params, x)["patch_tokens"])
                      * (part_ids == k).reshape(BATCH, -1, 1)).sum(1)
    assert np.abs(late(mixed) - late(images)).max() > 1e-3  # Late masking does leak.
  with pytest.raises(ValueError, match="part_pooling=True"):
    _pooled_forward(config)(params, images, part_ids)


def test_part_pooling_with_one_part_is_the_plain_forward(original):
  """Every patch in part 0: the block-masked forward is SAM's own, padding included."""
  _, config, params, _ = original
  images = np.asarray(ref.nchw_to_nhwc(ref.random_images(BATCH, 80, 80, seed=9)))
  out = _pooled_forward(config.replace(part_pooling=True))(params, images,
                                                            np.zeros((BATCH, 5, 5), np.int32))
  plain = _forward(config)(params, images)
  np.testing.assert_allclose(out["patch_tokens"], plain["patch_tokens"], rtol=0, atol=1e-6)
  np.testing.assert_allclose(out["part_tokens"][:, 0, 0],
                             np.asarray(plain["patch_tokens"]).mean(1), rtol=0, atol=1e-6)
  assert not np.asarray(out["part_tokens"][:, 1:]).any()  # Parts with no patch pool to 0.
