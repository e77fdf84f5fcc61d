"""What the demo (metonymy/demo/) and the Table-3 job (metonymy/table3/) are both made of: runs of
the project's own jobs on the synthetic parts world, from one stand-in backbone.

  subjobs     the probe and train jobs as sub-runs (launcher.launch on a `Workdir.sub` handle),
              given the world as their dataset, and the readers of what a train run logged
  stand_in    the stand-in for DINO: a tiny ViT pretrained on the world's attributes (reused,
              shipped in metonymy/assets/, or pretrained here)
  references  what the runs' numbers are read against: the constant predictor's mAP, and what
              the part-shaping priors charge the true parts
  text        numbers as text, the same way in every report

Neither job imports the other: both import this package.
"""
