"""Hugging Face ViT / DINOv2 / RAD-DINO layouts against transformers, on random weights.

References are built offline (no hub), randomized, saved with `save_pretrained` (hub key names)
and, where transformers 5 names differ in memory, as a bare `.safetensors` of `state_dict()`.
Parity: max |flax - torch| <= 1e-4 x max |torch| on `last_hidden_state` (after the final
layernorm) at the native and another resolution, and on the early-masked forward.
"""

import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import torch_reference as ref

torch = ref.torch

transformers = pytest.importorskip("transformers")

from metonymy import converters as checkpoints  # noqa: E402
from metonymy.converters import hf_vit  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_PARTS = 3
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
# Small models for the bookkeeping tests (a ViT-B/14 at depth 2 for the parity ones).
TINY = dict(hidden_size=64, num_attention_heads=2, num_hidden_layers=1, image_size=56,
            patch_size=14, attn_implementation="eager")


def _build(model, seed):
  """Eval-mode reference with noisy parameters (LayerScale, biases and positions all matter)."""
  ref.randomize_(model, seed=seed)
  return model.eval()


def _save_folder(model, folder, **config_updates):
  model.save_pretrained(folder)
  if config_updates:
    path = os.path.join(folder, "config.json")
    with open(path) as f:
      config = json.load(f)
    config.update(config_updates)
    with open(path, "w") as f:
      json.dump(config, f)
  return str(folder)


def _flax_apply(model, params, images, **kwargs):
  with jax.default_matmul_precision("highest"):
    return jax.jit(lambda p, x: model.apply({"params": p}, x, **kwargs))(params, images)


def _hf_plain(hf_model, images, vit: bool):
  with torch.no_grad():
    kwargs = {"interpolate_pos_encoding": True} if vit else {}
    return hf_model(pixel_values=images, **kwargs).last_hidden_state


def _hf_early(hf_model, images, part_ids, num_prefix: int, vit: bool):
  """The HF model on [prefix copy 0 .. copy K][patches] under the block-diagonal float mask."""
  with torch.no_grad():
    embedded = (hf_model.embeddings(images, interpolate_pos_encoding=True) if vit
                else hf_model.embeddings(images))
    hidden = ref.early_sequence(embedded, num_prefix, NUM_PARTS)
    mask = ref.early_float_mask(part_ids, NUM_PARTS, num_prefix)
    if vit:  # transformers 5 ViTModel has no encoder module: its layers sit on the model.
      for layer in hf_model.layers:
        hidden = layer(hidden, mask)
    else:
      hidden = hf_model.encoder(hidden, attention_mask=mask).last_hidden_state
    return hf_model.layernorm(hidden)


def _check_parity(hf_model, model, params, sizes, early_size, num_prefix, vit, label):
  """Plain forwards at each (batch, h, w) and one early-masked forward; returns rel. errors."""
  errors = {}
  for batch, height, width in sizes:
    images = ref.random_images(batch, height, width, seed=height + width)
    got = ref.flax_tokens(_flax_apply(model, params, ref.nchw_to_nhwc(images)))
    what = f"{label} {height}x{width}"
    errors[what] = ref.assert_close_to_reference(got, _hf_plain(hf_model, images, vit), what)
  batch, height, width = early_size
  images = ref.random_images(batch, height, width, seed=1)
  patch = model.config.patch_size
  part_ids = ref.random_part_ids(batch, (height // patch, width // patch), NUM_PARTS, seed=2)
  out = _flax_apply(model, params, ref.nchw_to_nhwc(images), part_ids=jnp.asarray(part_ids),
                    num_parts=NUM_PARTS)
  want = _hf_early(hf_model, images, part_ids, num_prefix, vit).numpy()
  prefix_len = (NUM_PARTS + 1) * num_prefix
  want_parts = want[:, :prefix_len].reshape(batch, NUM_PARTS + 1, num_prefix, -1)
  what = f"{label} early {height}x{width}"
  errors[what + " part_tokens"] = ref.assert_close_to_reference(
      out["part_tokens"], want_parts, what)
  errors[what + " patch_tokens"] = ref.assert_close_to_reference(
      out["patch_tokens"], want[:, prefix_len:], what)
  for what, error in errors.items():
    print(f"max rel error {what}: {error:.2e}")
  return errors


def _assert_same_tree(a, b):
  flat_a = jax.tree_util.tree_flatten_with_path(a)[0]
  flat_b = dict(jax.tree_util.tree_flatten_with_path(b)[0])
  assert [p for p, _ in flat_a] == list(flat_b)
  for path, value in flat_a:
    np.testing.assert_array_equal(np.asarray(value), np.asarray(flat_b[path]),
                                  err_msg=jax.tree_util.keystr(path))


# ViT-B width, depth 2: the full-size tensors and resize paths at a fraction of the cost.
@pytest.fixture(scope="module")
def dinov2(tmp_path_factory):
  model = _build(transformers.Dinov2Model(transformers.Dinov2Config(
      image_size=518, num_hidden_layers=2, attn_implementation="eager")), seed=0)
  root = tmp_path_factory.mktemp("dinov2")
  return model, _save_folder(model, root / "hf")


@pytest.fixture(scope="module")
def dinov2_reg(tmp_path_factory):
  model = _build(transformers.Dinov2WithRegistersModel(transformers.Dinov2WithRegistersConfig(
      image_size=518, patch_size=14, num_hidden_layers=2, attn_implementation="eager")), seed=1)
  root = tmp_path_factory.mktemp("dinov2_reg")
  return model, _save_folder(model, root / "hf")


@pytest.fixture(scope="module")
def dino_vit(tmp_path_factory):
  # With the pooler, as facebook/dino-vitb16 ships it: the import must drop it.
  model = _build(transformers.ViTModel(transformers.ViTConfig(
      num_hidden_layers=2, attn_implementation="eager"), add_pooling_layer=True), seed=2)
  root = tmp_path_factory.mktemp("dino_vit")
  return model, _save_folder(model, root / "hf")


@pytest.mark.slow
def test_dinov2_hf_matches_transformers(dinov2):
  hf_model, folder = dinov2
  model, params = checkpoints.load_backbone(folder)
  config = model.config
  assert (config.family, config.pos_embed_resize, config.pos_embed_grid) == (
      "dinov2", "size", (37, 37))
  assert (config.num_registers, config.layer_scale, config.norm_eps, config.image_size) == (
      0, True, 1e-6, 518)
  _check_parity(hf_model, model, params, [(1, 518, 518), (2, 224, 224)], (2, 224, 224),
                num_prefix=1, vit=False, label="dinov2/hf")


@pytest.mark.slow
def test_dinov2_registers_hf_matches_transformers(dinov2_reg):
  hf_model, folder = dinov2_reg
  model, params = checkpoints.load_backbone(folder)
  config = model.config
  assert (config.family, config.pos_embed_resize, config.num_registers) == (
      "dinov2", "size_antialias", 4)
  # Downsampling is where antialias matters: 252x308 takes 37x37 to a non-square 18x22 grid, the
  # early-masked run to 16x16.
  _check_parity(hf_model, model, params, [(1, 518, 518), (1, 252, 308)], (2, 224, 224),
                num_prefix=5, vit=False, label="dinov2/hf registers")


@pytest.mark.slow
def test_dino_vit_hf_matches_transformers(dino_vit):
  hf_model, folder = dino_vit
  model, params = checkpoints.load_backbone(folder)
  config = model.config
  assert (config.family, config.pos_embed_resize, config.layer_scale) == ("dino", "size", False)
  assert config.norm_eps == 1e-12  # What HF's ViTConfig (and facebook/dino-vitb16) says.
  # 160x256: a 10x16 grid, down in y and up in x.
  _check_parity(hf_model, model, params, [(2, 224, 224), (1, 160, 256)], (2, 224, 224),
                num_prefix=1, vit=True, label="dino/hf")


@pytest.mark.parametrize("which", ["dinov2", "dinov2_reg", "dino_vit"])
def test_both_namings_convert_identically(which, request, tmp_path):
  """Hub names and transformers-5 in-memory names, with or without config.json, give the same
  import as the save_pretrained folder."""
  hf_model, folder = request.getfixturevalue(which)
  want_config, want_params, want_layout = checkpoints.convert_checkpoint(folder)
  hub = shutil.copy(os.path.join(folder, "model.safetensors"), tmp_path / "hub.safetensors")
  in_memory = ref.save_state_dict(hf_model.state_dict(), str(tmp_path / "v5.safetensors"))
  if which != "dino_vit":  # ViT's in-memory names drop the encoder. prefix; DINOv2's keep it.
    assert any(".attention.q_proj." in k for k in hf_model.state_dict())
  v5_folder = shutil.copytree(folder, tmp_path / "v5_folder")
  shutil.copy(in_memory, os.path.join(v5_folder, "model.safetensors"))
  for path in (str(hub), in_memory, str(v5_folder)):
    config, params, layout = checkpoints.convert_checkpoint(path)
    assert layout == want_layout
    assert config == want_config, path
    _assert_same_tree(params, want_params)


def test_rad_dino_detected_from_config_and_equal_to_dinov2(dinov2, tmp_path):
  _, folder = dinov2
  rad = shutil.copytree(folder, tmp_path / "rad-dino-copy")
  with open(os.path.join(rad, "config.json")) as f:
    config = json.load(f)
  config["_name_or_path"] = "microsoft/rad-dino"
  with open(os.path.join(rad, "config.json"), "w") as f:
    json.dump(config, f)
  want_config, want_params, _ = checkpoints.convert_checkpoint(folder)
  got_config, got_params, layout = checkpoints.convert_checkpoint(str(rad))
  assert layout == "rad_dino/hf"
  assert got_config.image_mean == (0.5307,) * 3 and got_config.image_std == (0.2583,) * 3
  # Same forward as dinov2/hf (whose parity is tested above): only the labels differ.
  assert got_config == want_config.replace(family="rad_dino", image_mean=got_config.image_mean,
                                           image_std=got_config.image_std)
  _assert_same_tree(got_params, want_params)


@pytest.mark.slow
def test_rad_dino_detection_and_parity_small(tmp_path):
  hf_model = _build(transformers.Dinov2Model(transformers.Dinov2Config(**TINY)), seed=3)
  plain = _save_folder(hf_model, tmp_path / "plain")
  assert checkpoints.convert_checkpoint(plain)[2] == "dinov2/hf"  # No hint: plain DINOv2.
  model, params = checkpoints.load_backbone(plain, family="rad_dino")
  assert model.config.family == "rad_dino" and model.config.image_mean == hf_vit.RAD_DINO_MEAN
  _check_parity(hf_model, model, params, [(2, 56, 56), (1, 84, 70)], (2, 56, 56),
                num_prefix=1, vit=False, label="rad_dino/hf (small)")
  # The processor file alone names it too, and its statistics are what the config records.
  processor = shutil.copytree(plain, tmp_path / "with_processor")
  with open(os.path.join(processor, "preprocessor_config.json"), "w") as f:
    json.dump({"image_mean": [0.5307] * 3, "image_std": [0.2583] * 3}, f)
  assert checkpoints.convert_checkpoint(str(processor))[2] == "rad_dino/hf"
  with open(os.path.join(processor, "preprocessor_config.json"), "w") as f:
    json.dump({"image_mean": [0.5] * 3, "image_std": [0.5] * 3}, f)
  config, _, layout = checkpoints.convert_checkpoint(str(processor))
  assert layout == "dinov2/hf"
  assert config.image_mean == (0.5,) * 3 and config.image_std == (0.5,) * 3
  assert checkpoints.convert_checkpoint(plain)[0].image_mean == IMAGENET[0]


@pytest.mark.parametrize("head", ["dinov2", "vit"])
def test_classification_checkpoint_loads_its_backbone(head, tmp_path):
  if head == "vit":
    hf_model = transformers.ViTForImageClassification(transformers.ViTConfig(
        intermediate_size=128, num_labels=3, **TINY))
  else:
    hf_model = transformers.Dinov2ForImageClassification(
        transformers.Dinov2Config(num_labels=3, **TINY))
  hf_model = _build(hf_model, seed=4)
  model, params = checkpoints.load_backbone(_save_folder(hf_model, tmp_path / "hf"))
  images = ref.random_images(2, 56, 56)
  with torch.no_grad():
    want = getattr(hf_model, head)(pixel_values=images).last_hidden_state
  got = ref.flax_tokens(_flax_apply(model, params, ref.nchw_to_nhwc(images)))
  ref.assert_close_to_reference(got, want, f"{head} classifier backbone")


@pytest.mark.parametrize("with_config", [True, False])
def test_strict_load_names_missing_extra_and_misshaped_keys(with_config, tmp_path):
  from safetensors.torch import load_file, save_file
  hf_model = _build(transformers.Dinov2Model(transformers.Dinov2Config(**TINY)), seed=5)
  folder = _save_folder(hf_model, tmp_path / "hf")
  tensors = load_file(os.path.join(folder, "model.safetensors"))
  del tensors["encoder.layer.0.norm2.bias"]
  tensors["encoder.layer.0.attention.attention.extra.weight"] = torch.zeros(4)
  # A wrongly shaped q weight: the fused reshape must not hide the other two problems.
  tensors["encoder.layer.0.attention.attention.query.weight"] = torch.zeros(64, 32)
  path = (os.path.join(folder, "model.safetensors") if with_config
          else str(tmp_path / "bare.safetensors"))
  save_file(tensors, path)
  with pytest.raises(checkpoints.CheckpointError) as info:
    checkpoints.load_backbone(folder if with_config else path)
  message = str(info.value)
  for key in ("encoder.layer.0.norm2.bias", "encoder.layer.0.attention.attention.extra.weight",
              "encoder.layer.0.attention.attention.query.weight"):
    assert key in message, message


def test_unsupported_swiglu_is_refused(tmp_path):
  hf_model = transformers.Dinov2Model(transformers.Dinov2Config(use_swiglu_ffn=True, **TINY))
  with pytest.raises(checkpoints.CheckpointError, match="SwiGLU"):
    checkpoints.load_backbone(_save_folder(hf_model, tmp_path / "hf"))


@pytest.mark.slow
def test_convert_cli_round_trip(tmp_path):
  hf_model = _build(transformers.Dinov2WithRegistersModel(
      transformers.Dinov2WithRegistersConfig(num_register_tokens=2, **TINY)), seed=6)
  folder = _save_folder(hf_model, tmp_path / "hf")
  out_dir = str(tmp_path / "converted")
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
             JAX_PLATFORMS="cpu")
  result = subprocess.run([sys.executable, "-m", "metonymy.converters", "convert", "--input",
                           folder, "--output", out_dir], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  assert "dinov2/hf" in result.stdout
  direct_model, direct_params = checkpoints.load_backbone(folder)
  model, params = checkpoints.load_backbone(out_dir)
  assert model.config == direct_model.config
  images = ref.nchw_to_nhwc(ref.random_images(2, 84, 56))
  part_ids = jnp.asarray(ref.random_part_ids(2, (6, 4), NUM_PARTS))
  for kwargs in ({}, {"part_ids": part_ids, "num_parts": NUM_PARTS}):
    got = _flax_apply(model, params, images, **kwargs)
    want = _flax_apply(direct_model, direct_params, images, **kwargs)
    for name in ("prefix_tokens", "patch_tokens"):
      np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]))
