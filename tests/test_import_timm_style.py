"""Parity of the timm-style layouts: DINOv1, MAE, DINOv2 (+registers), original repos and timm.

References are timm models with random weights (depth 2, ViT-B width). The original repos' files
are built by renaming timm's tensors into the original key layout, and their position-table
resize is reproduced by `original_pos_embed` below, a transcription of the original
`interpolate_pos_encoding` (DINOv1 / DINOv2) and of MAE's `interpolate_pos_embed` util.
"""

import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import torch_reference as ref

torch = ref.torch
timm = pytest.importorskip("timm")

from metonymy import converters as checkpoints  # noqa: E402
from metonymy.converters import timm_style  # noqa: E402

NUM_PARTS = 3


def _timm_model(name, native, seed=0, **kwargs):
  model = timm.create_model(name, pretrained=False, depth=2, img_size=native,
                            dynamic_img_size=True, **kwargs).eval()
  ref.randomize_(model, seed)
  return model


def original_pos_embed(table_with_cls, grid_hw, offset, antialias):
  """The original repos' resize of a [1, 1 + M*M, D] table to grid (h, w), cls row first."""
  cls_pos, patch_pos = table_with_cls[:, :1], table_with_cls[:, 1:]
  side = int(math.sqrt(patch_pos.shape[1]))
  if (side, side) == tuple(grid_hw):
    return table_with_cls
  dim = patch_pos.shape[-1]
  h0, w0 = grid_hw
  kwargs = ({"scale_factor": ((h0 + offset) / side, (w0 + offset) / side)} if offset
            else {"size": (h0, w0)})
  patch_pos = torch.nn.functional.interpolate(
      patch_pos.reshape(1, side, side, dim).permute(0, 3, 1, 2), mode="bicubic",
      antialias=antialias, **kwargs)
  return torch.cat([cls_pos, patch_pos.permute(0, 2, 3, 1).reshape(1, -1, dim)], dim=1)


def original_embed(model, x, table_with_cls, registers, offset, antialias):
  """Original DINO/DINOv2/MAE token preparation: [cls + pos0, registers, patches + pos]."""
  patches = model.patch_embed(x)  # timm dynamic models give [B, h, w, D].
  batch, h, w, dim = patches.shape
  tokens = torch.cat([model.cls_token.expand(batch, -1, -1), patches.reshape(batch, h * w, dim)], 1)
  tokens = tokens + original_pos_embed(table_with_cls, (h, w), offset, antialias)
  if registers is not None:
    tokens = torch.cat([tokens[:, :1], registers.expand(batch, -1, -1), tokens[:, 1:]], 1)
  return tokens


def timm_embed(model, x):
  return model._pos_embed(model.patch_embed(x))


def encode(model, tokens, mask=None):
  for block in model.blocks:
    tokens = block(tokens, attn_mask=mask)
  return model.norm(tokens)


def _case(layout, tmp_path):
  """(timm model, checkpoint path, embed fn, native size, other size) for one layout."""
  if layout in ("dino/original", "dino/timm"):
    model = _timm_model("vit_base_patch16_224.dino", 224)
    sd = model.state_dict()
    if layout == "dino/original":
      path = ref.save_state_dict(sd, str(tmp_path / "dino_vitbase16_pretrain.pth"))
      embed = lambda x: original_embed(model, x, model.pos_embed, None, 0.1, False)
    else:
      path = ref.save_state_dict(sd, str(tmp_path / "model.safetensors"))
      embed = lambda x: timm_embed(model, x)
    return model, path, embed, 224, 160
  if layout in ("mae/original", "mae/timm"):
    model = _timm_model("vit_base_patch16_224.mae", 224)
    with torch.no_grad():  # MAE's table is the fixed sin-cos one, stored in the file.
      table = timm_style.sincos_2d_table(14, 768).astype(np.float32)
      model.pos_embed[0, 1:] = torch.from_numpy(table)
      model.pos_embed[0, 0] = 0.0
    sd = model.state_dict()
    if layout == "mae/original":
      path = str(tmp_path / "mae_pretrain_vit_base.pth")
      torch.save({"model": {k: v.clone() for k, v in sd.items()}}, path)
      embed = lambda x: original_embed(model, x, model.pos_embed, None, 0.0, False)
    else:
      path = ref.save_state_dict(sd, str(tmp_path / "model.safetensors"))
      embed = lambda x: timm_embed(model, x)
    return model, path, embed, 224, 160
  if layout in ("dinov2/original", "dinov2/timm"):
    model = _timm_model("vit_base_patch14_dinov2", 518)
    sd = dict(model.state_dict())
    if layout == "dinov2/original":
      sd["mask_token"] = torch.zeros(1, 768)
      path = ref.save_state_dict(sd, str(tmp_path / "dinov2_vitb14_pretrain.pth"))
      embed = lambda x: original_embed(model, x, model.pos_embed, None, 0.1, False)
    else:
      path = ref.save_state_dict(sd, str(tmp_path / "model.safetensors"))
      embed = lambda x: timm_embed(model, x)
    return model, path, embed, 518, 224
  if layout in ("dinov2_reg/original", "dinov2_reg/timm"):
    model = _timm_model("vit_base_patch14_reg4_dinov2", 518)
    sd = dict(model.state_dict())
    if layout == "dinov2_reg/original":
      # Original keys: register_tokens, and a pos_embed with a CLS row that cls_token lacks.
      cls_pos = 0.3 * torch.randn(1, 1, 768, generator=torch.Generator().manual_seed(5))
      table = torch.cat([cls_pos, sd.pop("pos_embed")], 1)
      sd["pos_embed"] = table
      sd["cls_token"] = sd["cls_token"] - cls_pos
      sd["register_tokens"] = sd.pop("reg_token")
      sd["mask_token"] = torch.zeros(1, 768)
      path = ref.save_state_dict(sd, str(tmp_path / "dinov2_vitb14_reg4_pretrain.pth"))
      cls_token = sd["cls_token"]

      def embed(x):
        patches = model.patch_embed(x)
        batch, h, w, dim = patches.shape
        tokens = torch.cat([cls_token.expand(batch, -1, -1), patches.reshape(batch, h * w, dim)], 1)
        tokens = tokens + original_pos_embed(table, (h, w), 0.0, True)
        return torch.cat([tokens[:, :1], model.reg_token.expand(batch, -1, -1), tokens[:, 1:]], 1)
    else:
      path = ref.save_state_dict(sd, str(tmp_path / "model.safetensors"))
      embed = lambda x: timm_embed(model, x)
    return model, path, embed, 518, 224
  raise ValueError(layout)


LAYOUTS = ["dino/original", "dino/timm", "mae/original", "mae/timm", "dinov2/original",
           "dinov2/timm", "dinov2_reg/original", "dinov2_reg/timm"]


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_parity_plain_and_early(layout, tmp_path):
  model, path, embed, native, other = _case(layout, tmp_path)
  flax_model, params = checkpoints.load_backbone(path)
  assert flax_model.config.family + "/" == layout.replace("_reg", "").split("/")[0] + "/"
  _, _, detected = checkpoints.convert_checkpoint(path)
  assert detected == layout.replace("_reg", "")
  apply = jax.jit(lambda p, x: flax_model.apply({"params": p}, x))
  num_prefix = flax_model.config.num_prefix
  for size in (native, other):
    x = ref.random_images(1, size, size, seed=size)
    with torch.no_grad():
      expected = encode(model, embed(x))
    ref.assert_close_to_reference(ref.flax_tokens(apply(params, ref.nchw_to_nhwc(x))), expected,
                                  f"{layout} at {size}")
  # Early masking against the same reference blocks run with the same block mask.
  size = other
  grid = (size // flax_model.config.patch_size,) * 2
  x = ref.random_images(2, size, size, seed=1)
  part_ids = ref.random_part_ids(2, grid, NUM_PARTS)
  with torch.no_grad():
    sequence = ref.early_sequence(embed(x), num_prefix, NUM_PARTS)
    expected = encode(model, sequence, ref.early_float_mask(part_ids, NUM_PARTS, num_prefix))
  out = flax_model.apply({"params": params}, ref.nchw_to_nhwc(x), part_ids=jnp.asarray(part_ids),
                         num_parts=NUM_PARTS)
  got = np.concatenate([np.asarray(out["prefix_tokens"]), np.asarray(out["patch_tokens"])], 1)
  ref.assert_close_to_reference(got, expected, f"{layout} early-masked")


def test_resize_matrices_match_torch_interpolate():
  """Each resize mode equals torch.nn.functional.interpolate, up- and down-sampling."""
  from metonymy.models import pos_embed
  table = torch.randn(1, 37 * 37, 8, generator=torch.Generator().manual_seed(0))
  grid = table.reshape(1, 37, 37, 8).permute(0, 3, 1, 2)
  for new in ((16, 16), (16, 23), (40, 44)):
    expected = {
        "scale_offset": torch.nn.functional.interpolate(
            grid, scale_factor=((new[0] + 0.1) / 37, (new[1] + 0.1) / 37), mode="bicubic"),
        "size": torch.nn.functional.interpolate(grid, size=new, mode="bicubic", align_corners=False),
        "size_antialias": torch.nn.functional.interpolate(grid, size=new, mode="bicubic",
                                                          antialias=True),
    }
    for mode, want in expected.items():
      got = pos_embed.resize_grid_embedding(jnp.asarray(table.numpy()), (37, 37), new, mode)
      want = want.permute(0, 2, 3, 1).reshape(1, -1, 8).numpy()
      np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, err_msg=f"{mode} {new}")


def _tiny_state(tmp_path):
  model = timm.create_model("vit_base_patch16_224.dino", pretrained=False, depth=1).eval()
  return dict(model.state_dict())


def test_bad_checkpoint_lists_missing_unexpected_and_mismatched(tmp_path):
  sd = _tiny_state(tmp_path)
  del sd["blocks.0.norm2.bias"]
  sd["blocks.0.attn.extra_thing"] = torch.zeros(3)
  sd["blocks.0.mlp.fc1.bias"] = torch.zeros(5)
  sd["blocks.0.attn.qkv.weight"] = torch.zeros(7, 768)  # A fused tensor that cannot be reshaped.
  path = ref.save_state_dict(sd, str(tmp_path / "broken.pth"))
  with pytest.raises(checkpoints.CheckpointError) as info:
    checkpoints.load_backbone(path)
  message = str(info.value)
  for key in ("blocks.0.norm2.bias", "blocks.0.attn.extra_thing", "blocks.0.mlp.fc1.bias",
              "blocks.0.attn.qkv.weight"):
    assert key in message
  assert "missing" in message and "unexpected" in message and "shape" in message


def test_unknown_family_and_missing_file_errors(tmp_path):
  path = ref.save_state_dict(_tiny_state(tmp_path), str(tmp_path / "ok.pth"))
  with pytest.raises(checkpoints.CheckpointError, match="Unknown family 'dinov9'"):
    checkpoints.load_backbone(path, family="dinov9")
  with pytest.raises(checkpoints.CheckpointError, match="not found"):
    checkpoints.load_backbone(str(tmp_path / "nope.pth"))
  (tmp_path / "junk.txt").write_text("hello")
  with pytest.raises(checkpoints.CheckpointError, match="unknown checkpoint format"):
    checkpoints.load_backbone(str(tmp_path / "junk.txt"))


def test_training_checkpoint_wrappers_are_unwrapped(tmp_path):
  sd = _tiny_state(tmp_path)
  path = str(tmp_path / "dino_full.pth")
  torch.save({"teacher": {f"module.backbone.{k}": v for k, v in sd.items()},
              "epoch": 100}, path)
  config, params, layout = checkpoints.convert_checkpoint(path)
  assert layout == "dino/original" and config.depth == 1


@pytest.mark.slow
def test_convert_cli_round_trip(tmp_path):
  sd = _tiny_state(tmp_path)
  path = ref.save_state_dict(sd, str(tmp_path / "dino.pth"))
  out_dir = str(tmp_path / "converted")
  result = subprocess.run([sys.executable, "-m", "metonymy.converters", "convert", "--input", path,
                           "--output", out_dir, "--image-size", "160"],
                          capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
  assert result.returncode == 0, result.stderr
  assert "dino/original" in result.stdout
  direct_model, direct_params = checkpoints.load_backbone(path)
  model, params = checkpoints.load_backbone(out_dir)
  assert model.config.image_size == 160 and model.config == direct_model.config.replace(image_size=160)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(1, 160, 160, 3)), jnp.float32)
  a = model.apply({"params": params}, x)
  b = direct_model.apply({"params": direct_params}, x)
  np.testing.assert_array_equal(np.asarray(a["patch_tokens"]), np.asarray(b["patch_tokens"]))
  bad = subprocess.run([sys.executable, "-m", "metonymy.converters", "convert", "--input",
                        str(tmp_path / "missing.pth"), "--output", out_dir],
                       capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
  assert bad.returncode != 0 and "missing.pth" in bad.stderr


def test_torchscript_archives_are_read_as_state_dicts(tmp_path):
  """OpenAI's CLIP files are TorchScript archives, which torch.load(weights_only=True) refuses."""
  from metonymy.converters import io
  module = torch.jit.script(torch.nn.Linear(3, 4))
  path = str(tmp_path / "scripted.pt")
  module.save(path)
  tensors = io.read_file(path)
  assert sorted(tensors) == ["bias", "weight"]
  np.testing.assert_array_equal(tensors["weight"], module.weight.detach().numpy())
