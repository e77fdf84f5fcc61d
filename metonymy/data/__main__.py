"""Command line: validate a dataset folder; write the synthetic world as a folder dataset.

  python -m metonymy.data check --dataset cub --root /data/CUB_200_2011
  python -m metonymy.data check --dataset folder --root /data/my_insects   # data/folder.py format
  python -m metonymy.data check --dataset celeba --source tfds --root ~/tensorflow_datasets
  python -m metonymy.data export-synthetic --root /tmp/synthetic_folder --examples 200
  python -m metonymy.data make-fixture --dataset cub --root /tmp/cub_fixture   # also celeba, chexpert
  python -m metonymy.data check --dataset chexpert --root /data/CheXpert-v1.0-small \
      --chexpert-uncertainty zeros [--chexpert-frontal-only]
  python -m metonymy.data check --dataset synthetic      # --root is ignored
  python -m metonymy.data world-check --config=configs/demo.py:world=v2 [--config.world.seed=1]

Every listed image must exist; the first 16 of each split are decoded, or all of them with
--all-images (a progress line on stderr; every bad file is listed at the end, not only the first).
Human-readable lines first; the last stdout line is one JSON object (base.CheckReport.to_dict()).
A missing or malformed file exits with status 1 and the message on stderr.

export-synthetic writes the first N examples of each split (train, val, test) of the synthetic
world in the folder format (PNG images and part masks), a worked example of that format; read
back with --dataset folder they are the built-in source's examples bit for bit.

world-check measures whether a synthetic world hosts the claims it tests (the position
baseline, where a part's evidence is, the masking mechanism on a backbone that learned the world,
what the priors charge the truth); its flags are metonymy/world_check.py's.

make-fixture writes a miniature CUB, CelebA or CheXpert (+ CheXlocalize) in the official layout
(data/fixtures.py: noise images, a few dozen rows), so that a real dataset's configs run end to
end in seconds before the dataset is downloaded; nothing trained on it means anything.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import time

from metonymy import data
from metonymy.data import base
from metonymy.data import fixtures
from metonymy.data import folder


class _Progress:
  """`decoding <split>: done/total` on stderr, rewritten in place about twice a second."""

  def __init__(self):
    self._last = 0.0

  def __call__(self, split: str, done: int, total: int) -> None:
    now = time.monotonic()
    if done == total or now - self._last > 0.5:
      self._last = now
      print(f"\r  decoding {split}: {done:,}/{total:,} ({100 * done / max(total, 1):.0f}%)",
            end="\n" if done == total else "", file=sys.stderr, flush=True)


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  if argv[:1] == ["world-check"]:
    # An alias of `python -m metonymy.world_check`, run as that command: the world check reads
    # a stand-in and trains probes, a floor above the data readers this package holds.
    return subprocess.call([sys.executable, "-m", "metonymy.world_check", *argv[1:]])
  parser = argparse.ArgumentParser(prog="python -m metonymy.data")
  sub = parser.add_subparsers(dest="command", required=True)
  check = sub.add_parser("check", help="validate a dataset folder; last stdout line is JSON")
  # Listed for --help; it parses its own (absl) flags above: `world-check --help` shows them.
  sub.add_parser("world-check", help="measure whether a synthetic world hosts the claims it "
                 "tests (--config=configs/demo.py[:world=...])")
  check.add_argument("--dataset", required=True, choices=data.names())
  check.add_argument("--root", default=None, help="dataset folder (ignored for synthetic)")
  check.add_argument("--source", default="",
                     help="another on-disk form of the dataset: tfds (celeba from a TFDS "
                          "data_dir given as --root)")
  check.add_argument("--chexpert-uncertainty", default=None, choices=("ignore", "zeros", "ones"),
                     help="CheXpert policy for uncertain (-1) labels")
  check.add_argument("--chexpert-frontal-only", action="store_true",
                     help="CheXpert: count frontal views only")
  check.add_argument("--all-images", action="store_true",
                     help="decode every image (default: the first 16 of each split); lists "
                          "every bad file")
  export = sub.add_parser("export-synthetic",
                          help="write the synthetic world in the folder format (data/folder.py)")
  export.add_argument("--root", required=True, help="output folder (new or empty)")
  export.add_argument("--examples", type=int, default=100, help="examples per split")
  export.add_argument("--image-size", type=int, default=64)
  export.add_argument("--correlation", type=float, default=0.0,
                      help="cross-part attribute correlation of the world")
  fixture = sub.add_parser("make-fixture",
                           help="write a miniature dataset in its official layout (noise pixels), "
                                "to try a real dataset's config before downloading it")
  fixture.add_argument("--dataset", required=True, choices=sorted(fixtures.BUILDERS))
  fixture.add_argument("--root", required=True, help="output folder (new or empty)")
  fixture.add_argument("--images", type=int, default=48, help="images (CUB, CelebA)")
  args = parser.parse_args(argv)

  if args.command == "make-fixture":
    root = pathlib.Path(args.root)
    if root.exists() and any(root.iterdir()):
      print(f"error: --root {root} exists and is not empty", file=sys.stderr)
      return 1
    fixtures.BUILDERS[args.dataset](root, args.images)
    print(f"wrote a miniature {args.dataset} (noise images, the official layout) to {root}; e.g. "
          f"--config=configs/{args.dataset}_single.py:runlocal --config.data.root={root}")
    return 0
  if args.command == "export-synthetic":
    try:
      root = folder.export_synthetic(args.root, args.examples, image_size=args.image_size,
                                     correlation=args.correlation)
    except (FileExistsError, ValueError) as e:
      print(f"error: {e}", file=sys.stderr)
      return 1
    print(f"wrote {args.examples} examples of each of train, val, test to {root}; read them with "
          f"--dataset folder --root {root}")
    return 0
  options_source = {"source": args.source} if args.source else {}
  if args.dataset != "synthetic" and not args.root:
    parser.error(f"--root is required for --dataset {args.dataset}")
  options = {}
  if args.chexpert_uncertainty is not None:
    if args.dataset != "chexpert":
      parser.error("--chexpert-uncertainty only applies to --dataset chexpert")
    options["uncertainty"] = args.chexpert_uncertainty
  if args.chexpert_frontal_only:
    if args.dataset != "chexpert":
      parser.error("--chexpert-frontal-only only applies to --dataset chexpert")
    options["frontal_only"] = True
  if args.all_images:
    if args.dataset == "synthetic":
      parser.error("--all-images does not apply to --dataset synthetic (its images are rendered, "
                   "not read from files)")
    options.update(verify_images=-1, progress=_Progress())
  print(f"checking {args.dataset}" + (f" at {args.root}" if args.dataset != "synthetic" else "")
        + (f" (source {args.source})" if args.source else ""), flush=True)
  try:
    report = data.check(args.dataset, args.root, **options_source, **options)
  except (base.DataError, ValueError, ImportError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  for split, count in report.splits.items():
    print(f"  {split}: {count} examples")
  print(f"  {report.num_attributes} part-localized attributes: "
        + ", ".join(f"{part} {count}" for part, count in report.attribute_groups.items()))
  if report.keypoint_groups:
    print(f"  keypoint groups: {', '.join(report.keypoint_groups)}")
  if args.dataset != "synthetic":
    print(f"  images decoded: {report.images_decoded:,} "
          f"({'all' if args.all_images else 'the first 16 of each split; --all-images for all'}; "
          f"every listed image exists)")
  if report.masks:
    print(f"  images with localization masks: {report.masks}")
  for warning in report.warnings:
    print(f"  warning: {warning}")
  print(json.dumps(report.to_dict()))
  return 0


if __name__ == "__main__":
  sys.exit(main())
