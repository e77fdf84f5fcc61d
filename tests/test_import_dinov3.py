"""DINOv3 import (issue: dinov3 layouts): original .pth, timm and HF files vs PyTorch references.

References are built offline with random weights: transformers `DINOv3ViTModel` (ViT-B/16 width,
4 registers, depth 2) and timm `vit_base_patch16_dinov3(_qkvb)` (depth 2). The original layout has
no installable reference, so its file is the HF model's tensors renamed to the original keys
(plus a `rope_embed.periods` buffer and a `bias_mask` over a deliberately non-zero k bias), and is
compared with that HF model. Every comparison is `[prefix_tokens, patch_tokens]` (or the early
forward's part and patch tokens) against the reference's final-normed tokens, within
`torch_reference.REL_TOL` of the reference's scale; 224x320 checks the y/x order of the RoPE.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import torch_reference as ref

torch = ref.torch
transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")

from metonymy import converters as checkpoints  # noqa: E402  (after the importorskips)
from metonymy.converters import registry  # noqa: E402
from metonymy.converters.io import CheckpointError, RawCheckpoint  # noqa: E402
from metonymy.models import pos_embed  # noqa: E402
from metonymy.models import vit  # noqa: E402

WIDTH, DEPTH, HEADS, REGISTERS = 768, 2, 12, 4
NUM_PREFIX = 1 + REGISTERS
SIZES = [(224, 224), (224, 320)]  # (H, W); 14x20 patches tell y from x.
BATCH = 2
NUM_PARTS = 3
TIMM_VARIANTS = ["vit_base_patch16_dinov3", "vit_base_patch16_dinov3_qkvb"]


# --- references and files ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_model():
  config = transformers.DINOv3ViTConfig(
      hidden_size=WIDTH, intermediate_size=4 * WIDTH, num_attention_heads=HEADS,
      num_register_tokens=REGISTERS, num_hidden_layers=DEPTH, attn_implementation="eager")
  model = transformers.DINOv3ViTModel(config).eval()
  ref.randomize_(model, seed=0)
  return model


@pytest.fixture(scope="module")
def timm_models():
  models = {}
  for seed, name in enumerate(TIMM_VARIANTS, start=1):
    model = timm.create_model(name, pretrained=False, depth=DEPTH).eval()
    ref.randomize_(model, seed=seed)
    models[name] = model
  return models


def original_periods() -> "torch.Tensor":
  """The original RopePositionEmbedding buffer: base ** (2 i / (head_dim / 2)), float32."""
  head_dim = WIDTH // HEADS
  return 100.0 ** (2 * torch.arange(head_dim // 4, dtype=torch.float32) / (head_dim // 2))


def original_state_dict(hf, periods=None, seed: int = 3):
  """The HF model's tensors under facebookresearch/dinov3 names.

  The k third of `attn.qkv.bias` is random (as an unmasked training buffer would be) and
  `bias_mask` zeroes it, so the conversion must apply the mask to match HF (no k bias).
  """
  sd = {k: v.detach().clone() for k, v in hf.state_dict().items()}
  generator = torch.Generator().manual_seed(seed)
  out = {
      "cls_token": sd["embeddings.cls_token"],
      "storage_tokens": sd["embeddings.register_tokens"],
      "mask_token": torch.zeros(1, WIDTH),  # (1, D) in the original, unlike HF's (1, 1, D).
      "patch_embed.proj.weight": sd["embeddings.patch_embeddings.weight"],
      "patch_embed.proj.bias": sd["embeddings.patch_embeddings.bias"],
      "rope_embed.periods": original_periods() if periods is None else periods,
      "norm.weight": sd["norm.weight"],
      "norm.bias": sd["norm.bias"],
  }
  for i in range(DEPTH):
    h, o = f"model.layer.{i}.", f"blocks.{i}."
    attn = h + "attention."
    out[o + "attn.qkv.weight"] = torch.cat([sd[attn + f"{p}_proj.weight"] for p in "qkv"])
    junk_k_bias = torch.randn(WIDTH, generator=generator)
    out[o + "attn.qkv.bias"] = torch.cat([sd[attn + "q_proj.bias"], junk_k_bias,
                                          sd[attn + "v_proj.bias"]])
    out[o + "attn.qkv.bias_mask"] = torch.cat([torch.ones(WIDTH), torch.zeros(WIDTH),
                                               torch.ones(WIDTH)])
    out[o + "attn.proj.weight"] = sd[attn + "o_proj.weight"]
    out[o + "attn.proj.bias"] = sd[attn + "o_proj.bias"]
    out[o + "ls1.gamma"] = sd[h + "layer_scale1.lambda1"]
    out[o + "ls2.gamma"] = sd[h + "layer_scale2.lambda1"]
    for n in ("norm1", "norm2"):
      out[o + n + ".weight"], out[o + n + ".bias"] = sd[h + n + ".weight"], sd[h + n + ".bias"]
    for ours, theirs in (("fc1", "up_proj"), ("fc2", "down_proj")):
      out[o + f"mlp.{ours}.weight"] = sd[h + f"mlp.{theirs}.weight"]
      out[o + f"mlp.{ours}.bias"] = sd[h + f"mlp.{theirs}.bias"]
  return out


@pytest.fixture(scope="module")
def files(tmp_path_factory, hf_model, timm_models):
  """Every layout's files: {name: path}."""
  root = tmp_path_factory.mktemp("dinov3")
  paths = {}
  hf_dir = str(root / "hf_folder")
  hf_model.save_pretrained(hf_dir)  # Writes the hub names, `layer.i`.
  paths["hf_folder"] = hf_dir
  state = hf_model.state_dict()  # transformers v5 names in memory, `model.layer.i`.
  paths["hf_state_dict"] = ref.save_state_dict(state, str(root / "hf_state_dict.pth"))
  paths["hf_model_prefix"] = ref.save_state_dict(
      {"model." + k: v for k, v in state.items()}, str(root / "hf_model_prefix.safetensors"))
  for name, model in timm_models.items():
    paths[name] = ref.save_state_dict(model.state_dict(), str(root / f"{name}.safetensors"))
  paths["original"] = ref.save_state_dict(original_state_dict(hf_model),
                                          str(root / "dinov3_vitb16_pretrain.pth"))
  return paths


def convert(path, expected_layout):
  """Converts with layout detection and checks which layout was picked."""
  config, params, layout = checkpoints.convert_checkpoint(path)
  assert layout == expected_layout
  return config, params


def flax_apply(config, params, images, **kwargs):
  model = vit.VisionTransformer(config)
  with jax.default_matmul_precision("highest"):  # No TF32 if this ever runs on a GPU.
    return model.apply({"params": jax.tree_util.tree_map(jnp.asarray, params)},
                       ref.nchw_to_nhwc(images), **kwargs)


def hf_tokens(hf, images):
  with torch.no_grad():
    return hf(pixel_values=images).last_hidden_state


def check_config(config, qkv_bias=True):
  assert config.family == "dinov3"
  assert (config.width, config.depth, config.num_heads) == (WIDTH, DEPTH, HEADS)
  assert (config.num_registers, config.pos_embed_grid, config.image_size) == (REGISTERS, None, 224)
  assert config.layer_scale and not config.k_bias and config.qkv_bias == qkv_bias
  assert config.norm_eps == 1e-5 and config.mlp_dim == 4 * WIDTH and config.patch_size == 16
  assert len(config.rope_periods) == WIDTH // HEADS // 4
  assert all(type(p) is float for p in config.rope_periods)


# --- plain forward parity ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_hf_matches_reference(files, hf_model, size):
  config, params = convert(files["hf_folder"], "dinov3/hf")
  check_config(config)
  images = ref.random_images(BATCH, *size, seed=1)
  out = flax_apply(config, params, images)
  error = ref.assert_close_to_reference(ref.flax_tokens(out), hf_tokens(hf_model, images),
                                        f"hf {size}")
  print(f"dinov3/hf {size}: max rel err {error:.2e}")


def test_hf_key_variants_convert_identically(files):
  """In-memory (`model.layer.i`) and `model.`-prefixed state dicts give the hub file's params."""
  config, params = convert(files["hf_folder"], "dinov3/hf")
  for name in ("hf_state_dict", "hf_model_prefix"):
    other_config, other_params = convert(files[name], "dinov3/hf")
    assert other_config == config, name  # A bare file has no config.json: same defaults.
    jax.tree_util.tree_map(np.testing.assert_array_equal, other_params, params)


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("variant", TIMM_VARIANTS)
def test_timm_matches_reference(files, timm_models, variant, size):
  config, params = convert(files[variant], "dinov3/timm")
  check_config(config, qkv_bias=variant.endswith("_qkvb"))
  images = ref.random_images(BATCH, *size, seed=2)
  with torch.no_grad():
    expected = timm_models[variant].forward_features(images)
  out = flax_apply(config, params, images)
  error = ref.assert_close_to_reference(ref.flax_tokens(out), expected, f"{variant} {size}")
  print(f"dinov3/timm {variant} {size}: max rel err {error:.2e}")


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_original_matches_reference(files, hf_model, size):
  config, params = convert(files["original"], "dinov3/original")
  check_config(config)
  images = ref.random_images(BATCH, *size, seed=3)
  out = flax_apply(config, params, images)
  error = ref.assert_close_to_reference(ref.flax_tokens(out), hf_tokens(hf_model, images),
                                        f"original {size}")
  print(f"dinov3/original {size}: max rel err {error:.2e}")


def test_original_masks_the_k_bias(files):
  config, params = convert(files["original"], "dinov3/original")
  raw = torch.load(files["original"], weights_only=True)
  # The file's k third is junk that only the mask removes.
  assert float(raw["blocks.0.attn.qkv.bias"][WIDTH:2 * WIDTH].abs().max()) > 0.1
  assert not config.k_bias
  for i in range(DEPTH):
    np.testing.assert_array_equal(params[f"blocks_{i}"]["attn"]["qkv_bias"][1], 0.0)
  np.testing.assert_array_equal(np.asarray(config.rope_periods, np.float32),
                                raw["rope_embed.periods"].numpy())


@pytest.mark.slow
def test_bf16_periods_are_used_as_stored(tmp_path, hf_model):
  """A periods buffer rounded to bf16 (as released files may hold it) is kept, not recomputed."""
  periods = original_periods().to(torch.bfloat16)
  assert float((periods.float() - original_periods()).abs().max()) > 0.01  # A real difference.
  path = ref.save_state_dict(original_state_dict(hf_model, periods=periods),
                             str(tmp_path / "dinov3_bf16_periods.pth"))
  config, params = convert(path, "dinov3/original")
  assert config.rope_periods == tuple(float(p) for p in periods.float())
  # The forward uses them: match HF run with the same stored periods.
  images = ref.random_images(BATCH, 224, 320, seed=4)
  saved = hf_model.rope_embeddings.inv_freq.clone()
  try:
    hf_model.rope_embeddings.inv_freq.copy_(1.0 / periods.float())
    expected = hf_tokens(hf_model, images)
  finally:
    hf_model.rope_embeddings.inv_freq.copy_(saved)
  out = flax_apply(config, params, images)
  error = ref.assert_close_to_reference(ref.flax_tokens(out), expected, "bf16 periods")
  print(f"dinov3/original bf16 periods: max rel err {error:.2e}")


# --- early-masked forward parity ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_early_masked_matches_hf(files, hf_model, size):
  """part_tokens / patch_tokens vs HF on [prefix copies][patches] with a float block mask."""
  config, params = convert(files["hf_folder"], "dinov3/hf")
  images = ref.random_images(BATCH, *size, seed=5)
  grid = (size[0] // 16, size[1] // 16)
  part_ids = ref.random_part_ids(BATCH, grid, NUM_PARTS, seed=5)
  with torch.no_grad():
    hidden = ref.early_sequence(hf_model.embeddings(images), NUM_PREFIX, NUM_PARTS)
    mask = ref.early_float_mask(part_ids, NUM_PARTS, NUM_PREFIX)
    encoded = hf_model.model(hidden, position_embeddings=hf_model.rope_embeddings(images),
                             attention_mask=mask).last_hidden_state
    expected = hf_model.norm(encoded)
  num_prefix_tokens = (NUM_PARTS + 1) * NUM_PREFIX
  out = flax_apply(config, params, images, part_ids=jnp.asarray(part_ids), num_parts=NUM_PARTS)
  part_error = ref.assert_close_to_reference(
      out["part_tokens"],
      expected[:, :num_prefix_tokens].reshape(BATCH, NUM_PARTS + 1, NUM_PREFIX, WIDTH),
      f"early part_tokens {size}")
  patch_error = ref.assert_close_to_reference(out["patch_tokens"], expected[:, num_prefix_tokens:],
                                              f"early patch_tokens {size}")
  print(f"dinov3/hf early {size}: part {part_error:.2e}, patch {patch_error:.2e}")


# --- detection and refusals --------------------------------------------------------------------


def test_other_layouts_do_not_claim_dinov3(files):
  for name, expected in (("hf_folder", "dinov3/hf"), ("original", "dinov3/original"),
                         (TIMM_VARIANTS[0], "dinov3/timm"), (TIMM_VARIANTS[1], "dinov3/timm")):
    raw = checkpoints.read_checkpoint(files[name])
    claimed = [l.full_name for l in registry.layouts() if l.detect(raw)]
    assert claimed == [expected], (name, claimed)


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.update({"cls_norm.weight": np.ones(WIDTH, np.float32),
                         "cls_norm.bias": np.zeros(WIDTH, np.float32)}), "cls_norm"),
    (lambda t: t.update({"blocks.0.mlp.w1.weight": np.zeros((8, WIDTH), np.float32)}), "SwiGLU"),
    (lambda t: t.pop("blocks.1.ls2.gamma"), "blocks.1.ls2.gamma"),
    (lambda t: t.update({"blocks.0.attn.extra": np.zeros(3, np.float32)}), "unexpected"),
    (lambda t: t.update({"blocks.0.attn.qkv.bias_mask": np.full(3 * WIDTH, np.nan, np.float32)}),
     "non-finite"),
])
def test_original_refuses_what_it_cannot_express(hf_model, edit, message):
  tensors = {k: v.float().numpy() for k, v in original_state_dict(hf_model).items()}
  edit(tensors)
  with pytest.raises(CheckpointError, match=message):
    checkpoints.convert_raw(RawCheckpoint(tensors, "edited.pth", "torch"))


def test_hf_gated_mlp_is_refused(files):
  raw = checkpoints.read_checkpoint(files["hf_folder"])
  raw.tensors["layer.0.mlp.gate_proj.weight"] = np.zeros((4 * WIDTH, WIDTH), np.float32)
  with pytest.raises(CheckpointError, match="gated MLP"):
    checkpoints.convert_raw(raw)


def test_missing_periods_are_computed_in_fp32(hf_model):
  tensors = {k: v.float().numpy() for k, v in original_state_dict(hf_model).items()}
  del tensors["rope_embed.periods"]
  config, _, layout = checkpoints.convert_raw(RawCheckpoint(tensors, "no_periods.pth", "torch"))
  assert layout == "dinov3/original"
  assert config.rope_periods == pos_embed.rope_periods(WIDTH // HEADS)
