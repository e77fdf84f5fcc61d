"""Parity of the CLIP layouts (clip/openai, clip/hf, clip/timm) with PyTorch references.

References have random weights, ViT-B width and depth 2. HF: `CLIPVisionModelWithProjection`
(eager attention, so a float mask is added to the scores), saved with `save_pretrained`. The
OpenAI state dict is built from the HF reference's tensors by renaming and fusing q/k/v, with a
tiny fake text tower beside it. timm: `vit_base_patch16_clip_quickgelu_224` with a zero-bias
512-way head, which is how timm stores CLIP's projection.

Our tokens are compared with `post_layernorm(last_hidden_state)`: HF's last hidden state is taken
before the final norm, our contract applies it to every token.
"""

import functools

import jax
import numpy as np
import pytest

from tests.helpers import torch_reference as ref

torch = ref.torch
transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")

from metonymy import converters as checkpoints  # noqa: E402
from metonymy.converters import clip as clip_layouts  # noqa: E402
from metonymy.converters import registry  # noqa: E402
from metonymy.converters import timm_style  # noqa: E402
from metonymy.converters.io import CheckpointError, RawCheckpoint  # noqa: E402
from metonymy.models import vit  # noqa: E402

NUM_PARTS = 3
BATCH = 2


@functools.lru_cache(maxsize=None)
def _forward(config: vit.ViTConfig):
  """One jitted forward per architecture, shared by the layouts that convert to the same config."""
  model = vit.VisionTransformer(config)

  def apply(params, images, part_ids=None):
    return model.apply({"params": params}, images, part_ids=part_ids,
                       num_parts=None if part_ids is None else NUM_PARTS)
  return jax.jit(apply)


def _report(what, error):
  print(f"{what}: max |diff| / max |ref| = {error:.2e}")


def _tree_equal(a, b):
  flat_a = jax.tree_util.tree_flatten_with_path(a)[0]
  flat_b = dict(jax.tree_util.tree_flatten_with_path(b)[0])
  assert [p for p, _ in flat_a] == list(flat_b), "parameter trees differ"
  for path, x in flat_a:
    np.testing.assert_array_equal(np.asarray(x), np.asarray(flat_b[path]), err_msg=str(path))


# --- References --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_model():
  config = transformers.CLIPVisionConfig(patch_size=16, num_hidden_layers=2, projection_dim=512)
  model = transformers.CLIPVisionModelWithProjection(config).eval()
  model.set_attn_implementation("eager")
  ref.randomize_(model, seed=1)
  return model


@pytest.fixture(scope="module")
def hf_folder(hf_model, tmp_path_factory):
  path = str(tmp_path_factory.mktemp("clip_hf") / "clip-vit-b16")
  hf_model.save_pretrained(path)
  return path


def _openai_state_dict(hf_model):
  """OpenAI `clip/model.py` names for the HF reference's vision tensors, plus a fake text tower."""
  hf = {k: v.detach().clone() for k, v in hf_model.state_dict().items()}
  v = "vision_model."
  out = {
      "visual.conv1.weight": hf[v + "embeddings.patch_embedding.weight"],
      "visual.class_embedding": hf[v + "embeddings.class_embedding"],
      "visual.positional_embedding": hf[v + "embeddings.position_embedding.weight"],
      "visual.proj": hf["visual_projection.weight"].T.contiguous(),  # OpenAI: x @ proj.
  }
  for ours, theirs in (("ln_pre", "pre_layrnorm"), ("ln_post", "post_layernorm")):
    for p in ("weight", "bias"):
      out[f"visual.{ours}.{p}"] = hf[f"{v}{theirs}.{p}"]
  for i in range(hf_model.config.num_hidden_layers):
    a, b = f"{v}encoder.layers.{i}.", f"visual.transformer.resblocks.{i}."
    for p in ("weight", "bias"):
      out[b + f"attn.in_proj_{p}"] = torch.cat([hf[a + f"self_attn.{n}_proj.{p}"] for n in "qkv"])
      for ours, theirs in (("attn.out_proj", "self_attn.out_proj"), ("ln_1", "layer_norm1"),
                           ("ln_2", "layer_norm2"), ("mlp.c_fc", "mlp.fc1"),
                           ("mlp.c_proj", "mlp.fc2")):
        out[b + f"{ours}.{p}"] = hf[a + f"{theirs}.{p}"]
  # The text tower of a full OpenAI model (tiny shapes: only the names matter).
  text = {"token_embedding.weight": (50, 32), "positional_embedding": (77, 32),
          "transformer.resblocks.0.attn.in_proj_weight": (96, 32),
          "transformer.resblocks.0.ln_1.weight": (32,), "ln_final.weight": (32,),
          "ln_final.bias": (32,), "text_projection": (32, 512), "logit_scale": ()}
  out.update({k: torch.randn(shape) for k, shape in text.items()})
  return out


@pytest.fixture(scope="module")
def openai_file(hf_model, tmp_path_factory):
  return ref.save_state_dict(_openai_state_dict(hf_model),
                             str(tmp_path_factory.mktemp("clip_openai") / "ViT-B-16.pth"))


@pytest.fixture(scope="module")
def timm_model():
  model = timm.create_model("vit_base_patch16_clip_quickgelu_224", pretrained=False, depth=2,
                            num_classes=512, dynamic_img_size=True).eval()
  ref.randomize_(model, seed=2)
  with torch.no_grad():
    model.head.bias.zero_()  # timm's `_convert_openai_clip` stores CLIP's proj with a zero bias.
  return model


@pytest.fixture(scope="module")
def timm_file(timm_model, tmp_path_factory):
  return ref.save_state_dict(timm_model.state_dict(),
                             str(tmp_path_factory.mktemp("clip_timm") / "model.safetensors"))


def _hf_plain(model, x, interpolate):
  with torch.no_grad():
    out = model(pixel_values=x, interpolate_pos_encoding=interpolate)
    return model.vision_model.post_layernorm(out.last_hidden_state), out.image_embeds


def _hf_early(model, x, part_ids):
  """`post_layernorm(encoder(pre_layrnorm([cls x (K+1), patches]), float block mask))`."""
  vm = model.vision_model
  with torch.no_grad():
    h = ref.early_sequence(vm.embeddings(x), 1, NUM_PARTS)
    mask = ref.early_float_mask(part_ids, NUM_PARTS, 1)
    tokens = vm.post_layernorm(vm.encoder(inputs_embeds=vm.pre_layrnorm(h),
                                          attention_mask=mask).last_hidden_state)
    return tokens, model.visual_projection(tokens[:, :NUM_PARTS + 1])


def _timm_early(model, x, part_ids):
  with torch.no_grad():
    h = ref.early_sequence(model._pos_embed(model.patch_embed(x)), 1, NUM_PARTS)
    mask = ref.early_float_mask(part_ids, NUM_PARTS, 1)
    h = model.norm_pre(h)
    for blk in model.blocks:
      h = blk(h, attn_mask=mask)
    tokens = model.norm(h)
    return tokens, model.head(tokens[:, :NUM_PARTS + 1])


def _check_plain(config, params, x, tokens_ref, proj_ref, what):
  out = _forward(config)(params, ref.nchw_to_nhwc(x))
  _report(f"{what} tokens", ref.assert_close_to_reference(ref.flax_tokens(out), tokens_ref, what))
  _report(f"{what} projection",
          ref.assert_close_to_reference(out["projection"], proj_ref, what + " projection"))


def _check_early(config, params, x, tokens_ref, proj_ref, part_ids, what):
  out = _forward(config)(params, ref.nchw_to_nhwc(x), jax.numpy.asarray(part_ids))
  got = np.concatenate([np.asarray(out["prefix_tokens"]), np.asarray(out["patch_tokens"])], 1)
  _report(f"{what} tokens", ref.assert_close_to_reference(got, tokens_ref, what))
  _report(f"{what} projection",
          ref.assert_close_to_reference(out["projection"], proj_ref, what + " projection"))


# --- Hugging Face ------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("size", [224, 160])
def test_hf_matches_reference(hf_model, hf_folder, size):
  config, params, layout = checkpoints.convert_checkpoint(hf_folder)
  assert layout == "clip/hf"
  assert (config.activation, config.norm_eps, config.pos_embed_resize) == (
      "quick_gelu", 1e-5, "size")
  assert (config.ln_pre, config.patch_bias, config.projection_dim) == (True, False, 512)
  assert config.image_mean == clip_layouts.CLIP_MEAN and config.family == "clip"
  x = ref.random_images(BATCH, size, size, seed=size)
  tokens, embeds = _hf_plain(hf_model, x, interpolate=size != 224)
  _check_plain(config, params, x, tokens, embeds, f"clip/hf @{size}")


@pytest.mark.slow
def test_hf_early_masking_matches_reference(hf_model, hf_folder):
  config, params, _ = checkpoints.convert_checkpoint(hf_folder)
  x = ref.random_images(BATCH, 224, 224, seed=3)
  part_ids = ref.random_part_ids(BATCH, (14, 14), NUM_PARTS, seed=3)
  tokens, embeds = _hf_early(hf_model, x, part_ids)
  _check_early(config, params, x, tokens, embeds, part_ids, "clip/hf early @224")


@pytest.mark.slow
def test_hf_clip_model_and_unprefixed_vision_model(hf_model, hf_folder, tmp_path):
  """CLIPModel (text tower ignored) and transformers-5 CLIPVisionModel files (no `vision_model.`
  prefix, exact GELU from config.json) convert to the same tensors."""
  _, expected, _ = checkpoints.convert_checkpoint(hf_folder)
  # Hub files written by transformers 4.x still carry the persistent `position_ids` buffer.
  raw = checkpoints.io.read_checkpoint(hf_folder)
  raw.tensors["vision_model.embeddings.position_ids"] = np.arange(197)[None]
  _tree_equal(checkpoints.convert_raw(raw)[1], expected)
  vision = hf_model.config.to_dict()
  text = transformers.CLIPTextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, vocab_size=49408)
  full = transformers.CLIPModel(transformers.CLIPConfig(
      vision_config=vision, text_config=text.to_dict(), projection_dim=512))
  missing, unexpected = full.load_state_dict(hf_model.state_dict(), strict=False)
  assert not unexpected and all(k.startswith(("text_", "logit_scale")) for k in missing)
  full.save_pretrained(str(tmp_path / "clip_model"))
  config, params, layout = checkpoints.convert_checkpoint(str(tmp_path / "clip_model"))
  assert layout == "clip/hf" and config.activation == "quick_gelu"
  _tree_equal(params, expected)

  gelu = transformers.CLIPVisionModel(transformers.CLIPVisionConfig(
      patch_size=16, num_hidden_layers=2, hidden_act="gelu")).eval()
  gelu.load_state_dict({k[len("vision_model."):]: v for k, v in hf_model.state_dict().items()
                        if k.startswith("vision_model.")})
  gelu.save_pretrained(str(tmp_path / "vision_model"))
  config, params, layout = checkpoints.convert_checkpoint(str(tmp_path / "vision_model"))
  assert layout == "clip/hf" and config.activation == "gelu" and config.projection_dim is None
  _tree_equal(params, {k: v for k, v in expected.items() if k != "projection"})
  x = ref.random_images(BATCH, 224, 224, seed=4)
  with torch.no_grad():
    tokens = gelu.post_layernorm(gelu(pixel_values=x).last_hidden_state)
  out = _forward(config)(params, ref.nchw_to_nhwc(x))
  _report("clip/hf (CLIPVisionModel, gelu) tokens @224",
          ref.assert_close_to_reference(ref.flax_tokens(out), tokens, "clip/hf gelu"))


# --- OpenAI --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_openai_matches_reference(hf_model, hf_folder, openai_file):
  config, params, layout = checkpoints.convert_checkpoint(openai_file)
  assert layout == "clip/openai"
  hf_config, hf_params, _ = checkpoints.convert_checkpoint(hf_folder)
  # Same weights, same architecture and resize: the two layouts must be indistinguishable.
  assert config == hf_config
  _tree_equal(params, hf_params)
  x = ref.random_images(BATCH, 224, 224, seed=5)
  tokens, embeds = _hf_plain(hf_model, x, interpolate=False)
  _check_plain(config, params, x, tokens, embeds, "clip/openai @224")


def test_openai_visual_only_and_strictness(hf_model, openai_file):
  full = checkpoints.io.read_checkpoint(openai_file)
  config, params, _ = checkpoints.convert_raw(full)
  visual = RawCheckpoint({k[len("visual."):]: v for k, v in full.tensors.items()
                          if k.startswith("visual.")}, "visual_only.pth", "torch")
  assert registry.find_layout(visual).full_name == "clip/openai"
  visual_config, visual_params, _ = checkpoints.convert_raw(visual)
  assert visual_config == config
  _tree_equal(visual_params, params)
  # A stray tensor in the image tower is an error, not silently dropped.
  extra = RawCheckpoint(dict(full.tensors, **{"visual.attnpool.weight": np.zeros(3, np.float32)}),
                        "extra.pth", "torch")
  with pytest.raises(CheckpointError, match="unexpected keys"):
    checkpoints.convert_raw(extra)
  missing = RawCheckpoint({k: v for k, v in full.tensors.items() if k != "visual.ln_post.bias"},
                          "missing.pth", "torch")
  with pytest.raises(CheckpointError, match="visual.ln_post.bias"):
    checkpoints.convert_raw(missing)


# --- timm ----------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("size", [224, 288])
def test_timm_matches_reference(timm_model, timm_file, size):
  config, params, layout = checkpoints.convert_checkpoint(timm_file, family="clip")
  assert layout == "clip/timm"
  assert (config.activation, config.pos_embed_resize, config.projection_dim) == (
      "quick_gelu", "size_antialias", 512)
  x = ref.random_images(BATCH, size, size, seed=size)
  with torch.no_grad():
    tokens = timm_model.forward_features(x)
    embeds = timm_model.forward_head(tokens)
  _check_plain(config, params, x, tokens, embeds, f"clip/timm @{size}")


@pytest.mark.slow
def test_timm_early_masking_matches_reference(timm_model, timm_file):
  config, params, _ = checkpoints.convert_checkpoint(timm_file, family="clip")
  x = ref.random_images(BATCH, 224, 224, seed=6)
  part_ids = ref.random_part_ids(BATCH, (14, 14), NUM_PARTS, seed=6)
  tokens, embeds = _timm_early(timm_model, x, part_ids)
  _check_early(config, params, x, tokens, embeds, part_ids, "clip/timm early @224")


def test_timm_detection_and_heads(timm_file):
  raw = checkpoints.io.read_checkpoint(timm_file)
  assert [l.full_name for l in registry.layouts() if l.family == "clip" and l.detect(raw)] == [
      "clip/timm"]
  config, _, _ = checkpoints.convert_raw(raw, "clip/timm_gelu")
  assert config.activation == "gelu"
  # A classifier head (non-zero bias) is not a CLIP projection: dropped, no projection.
  tensors = dict(raw.tensors, **{"head.bias": np.ones_like(raw.tensors["head.bias"])})
  config, params, _ = checkpoints.convert_raw(
      RawCheckpoint(tensors, "ft.safetensors", "safetensors"), "clip")
  assert config.projection_dim is None and "projection" not in params
  # timm_style is registered first and must leave `norm_pre` (CLIP-only) checkpoints to clip.py.
  assert not timm_style._is_timm_style(raw)
  assert registry.find_layout(raw).full_name == "clip/timm"
