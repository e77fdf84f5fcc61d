"""Command line: validate a dataset folder.

  python -m metonymy.data check --dataset cub --root /data/CUB_200_2011
  python -m metonymy.data check --dataset chexpert --root /data/CheXpert-v1.0-small \
      --chexpert-uncertainty zeros [--chexpert-frontal-only]
  python -m metonymy.data check --dataset synthetic      # --root is ignored

Human-readable lines first; the last stdout line is one JSON object (base.CheckReport.to_dict()).
A missing or malformed file exits with status 1 and the message on stderr.
"""

import argparse
import json
import sys

from metonymy import data
from metonymy.data import base


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m metonymy.data")
  sub = parser.add_subparsers(dest="command", required=True)
  check = sub.add_parser("check", help="validate a dataset folder; last stdout line is JSON")
  check.add_argument("--dataset", required=True, choices=data.names())
  check.add_argument("--root", default=None, help="dataset folder (ignored for synthetic)")
  check.add_argument("--chexpert-uncertainty", default=None, choices=("ignore", "zeros", "ones"),
                     help="CheXpert policy for uncertain (-1) labels")
  check.add_argument("--chexpert-frontal-only", action="store_true",
                     help="CheXpert: count frontal views only")
  args = parser.parse_args(argv)

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
  print(f"checking {args.dataset}" + (f" at {args.root}" if args.dataset != "synthetic" else ""),
        flush=True)
  try:
    report = data.check(args.dataset, args.root, **options)
  except base.DataError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  for split, count in report.splits.items():
    print(f"  {split}: {count} examples")
  print(f"  {report.num_attributes} part-localized attributes: "
        + ", ".join(f"{part} {count}" for part, count in report.attribute_groups.items()))
  if report.keypoint_groups:
    print(f"  keypoint groups: {', '.join(report.keypoint_groups)}")
  if report.masks:
    print(f"  images with localization masks: {report.masks}")
  for warning in report.warnings:
    print(f"  warning: {warning}")
  print(json.dumps(report.to_dict()))
  return 0


if __name__ == "__main__":
  sys.exit(main())
