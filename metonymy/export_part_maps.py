"""`python -m metonymy.export_part_maps` is now `python -m metonymy.probe.export_part_maps`
(the part-map file is the leakage benchmark's input); this alias runs it."""

from metonymy.probe import export_part_maps

if __name__ == "__main__":
  export_part_maps.run()
