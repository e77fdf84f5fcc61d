"""Command line: convert a PyTorch checkpoint once, so later runs need no torch.

  python -m metonymy.converters convert --input dinov2_vitb14_reg4_pretrain.pth \
      --output converted/dinov2_vitb14_reg4 [--family dinov2] [--image-size 224]
  python -m metonymy.converters layouts
"""

import argparse
import sys

from clu import parameter_overview

from metonymy import converters
from metonymy.converters import registry


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m metonymy.converters")
  sub = parser.add_subparsers(dest="command", required=True)
  convert = sub.add_parser("convert", help="PyTorch / safetensors / HF checkpoint -> Orbax folder")
  convert.add_argument("--input", required=True, help=".pth/.pt/.bin/.safetensors or an HF folder")
  convert.add_argument("--output", required=True, help="folder to write arch.json + params/")
  convert.add_argument("--family", default=None,
                       help=f"one of {registry.families()}, optionally family/layout; "
                            "detected from the keys when omitted")
  convert.add_argument("--image-size", type=int, default=None,
                       help="default input resolution recorded in the converted config")
  sub.add_parser("layouts", help="list the supported checkpoint layouts")
  args = parser.parse_args(argv)
  if args.command == "layouts":
    for name, description in registry.describe().items():
      print(f"{name:20s} {description}")
    return 0
  try:
    config, params, layout = converters.convert_checkpoint(args.input, args.family, args.image_size)
  except (converters.CheckpointError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  converters.save_converted(args.output, config, params, source=f"{args.input} ({layout})")
  tokens = (f"{config.num_registers} registers" if hasattr(config, "num_registers") else
            f"no prefix tokens, {getattr(config, 'out_channels', 0)}-channel neck")
  print(f"{args.input}: layout {layout}, {config.depth} blocks, width {config.width}, patch "
        f"{config.patch_size}, {tokens}, "
        f"{parameter_overview.count_parameters(params) / 1e6:.1f}M parameters -> {args.output}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
