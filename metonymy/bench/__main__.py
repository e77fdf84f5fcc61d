"""python -m metonymy.bench vit --model vit_b16 [--batch-size 8] [--image-size 224] [--num-parts 8]"""

import argparse
import json
import sys


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m metonymy.bench")
  sub = parser.add_subparsers(dest="bench", required=True)
  p = sub.add_parser("vit", help="Flax ViT vs PyTorch reference, plain and early-masked")
  p.add_argument("--model", default="vit_b16", help="vit_b16, vit_s16, vit_b14_reg4, vit_b16_dinov3")
  p.add_argument("--batch-size", type=int, default=8)
  p.add_argument("--image-size", type=int, default=224)
  p.add_argument("--num-parts", type=int, default=8)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--depth", type=int, default=None, help="fewer blocks, for quick runs")
  p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
  p.add_argument("--no-torch", action="store_true", help="Flax only")
  p.add_argument("--json", default=None, help="also write the results here")
  args = parser.parse_args(argv)
  if args.bench == "vit":
    from metonymy.bench import vit as vit_bench
    results = vit_bench.run(args.model, args.batch_size, args.image_size, args.num_parts,
                            args.repeats, args.depth, not args.no_torch, args.threads)
    print(vit_bench.format_table(results))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
