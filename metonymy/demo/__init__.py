"""The demo job (`job = "demo"`): the paper's story end to end on the synthetic parts world, at a
size that runs on a CPU in minutes.

  python -m metonymy.main --config=configs/demo.py --workdir=DIR                    # mode "story"
  python -m metonymy.main --config=configs/demo_correlation_sweep.py --workdir=DIR  # the sweep

Modes (config.mode): "story" (story.py: a stand-in backbone, its leakage benchmark, part
discovery from it, a report and README's blocks), "correlation_sweep" (sweep.py: PS against the
world's cross-part correlation, which tells leakage from real correlation) and "stand_in"
(stand_in.py: remake the stand-in shipped in metonymy/assets/).
"""

from typing import Dict

from metonymy.demo import story
from metonymy.demo import sweep
from metonymy.runs import stand_in


def run(config, workdir) -> Dict:
  mode = config.get("mode", "story")
  if mode == "story":
    return story.run_story(config, workdir)
  if mode == "correlation_sweep":
    return sweep.run_sweep(config, workdir)
  if mode == "stand_in":
    return stand_in.run_stand_in(config, workdir)
  raise ValueError(f"config.mode must be 'story', 'correlation_sweep' or 'stand_in', got "
                   f"{mode!r}")
