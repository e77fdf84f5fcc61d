"""The Table-3 job (`job = "table3"`, configs/synthetic_table3.py): single-stage against two-stage
hard, STE and soft part discovery on one synthetic world, where the true parts are known.

  job        the stand-in, every run, the numbers and the figure's inputs, then the report
  variants   one variant at one run seed: its training config, the train job, the probe job on
             its discovered parts (PS, MPPO), and its row read back from the sub-runs' files
  stats      means and sds per variant; two-stage minus single-stage paired by seed, with 95%
             t intervals
  part_maps  the part-map figure's (Fig. 4) inputs: the trained models reloaded on test images
  report     results.json, report.md (Table 3 and Table S6's columns, the chance level, Stage 2's
             training, the mechanism), the part-map figure and README's block, formatted from
             what the job computed

The arms differ in the model alone: one stand-in, one world, and per run seed the same Stage-1
initialisation, data order, Gumbel noise and budget. The sub-runs, the stand-in and the
reference numbers are metonymy/runs/'s, which the demo uses too.
"""

from typing import Dict

from metonymy.table3 import job


def run(config, workdir) -> Dict:
  return job.run(config, workdir)
