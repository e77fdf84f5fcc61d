"""metonymy/table3/compare.py: counterfactual arms against a baseline, paired by run seed."""

import json

import pytest

from metonymy.table3 import compare


def _run(tmp_path, name, nmi_by_seed, world_seed=0, norm="per_part", shares=(0.3, 0.8)):
  """A finished Table-3 workdir with one single-stage row per run seed."""
  rows = [{"variant": "single", "seed": s, "NMI": v, "ARI": v / 2, "NMI_fg": v, "ARI_fg": v / 2,
           "mAP_stage1": 0.3, "max_part_share": shares[0], "background_share": shares[1],
           "background_share_true": 0.8, "coverage": 0.5, "area_ratio": 4.0,
           "object_in_background": 0.25 + v / 1000,
           "grad_norm_start": {"attribute_stage1": 0.1}, "position_NMI": 8.0,
           "position_ARI": 7.0, "position_NMI_fg": 8.0, "position_ARI_fg": 7.0}
          for s, v in nmi_by_seed.items()]
  workdir = tmp_path / name
  workdir.mkdir()
  (workdir / "results.json").write_text(json.dumps({
      "job": "table3", "world": {"seed": world_seed}, "world_seed": world_seed,
      "backbone": {"source": "stand_in_x"}, "seeds": sorted(nmi_by_seed), "rows": rows,
      "chance_mAP": 0.23}))
  (workdir / "config.json").write_text(json.dumps(
      {"job": "table3", "single": {"model": {"embedding_norm": norm}}}))
  return str(workdir)


def test_differences_are_paired_by_run_seed_and_name_the_changed_key(tmp_path):
  base = _run(tmp_path, "base", {0: 10.0, 1: 20.0, 2: 30.0})
  # Listed in another order: pairing must go by seed, not by position.
  arm = _run(tmp_path, "arm", {2: 33.0, 0: 11.0, 1: 22.0}, norm="joint")
  result = compare.compare(compare.read_run(base), [("joint", compare.read_run(arm))])
  paired = result["paired"]["joint"]["NMI"]
  assert paired["differences"] == [1.0, 2.0, 3.0] and paired["mean"] == pytest.approx(2.0)
  assert paired["ci"][0] < 2.0 < paired["ci"][1]
  assert result["summary"]["joint"]["NMI"]["mean"] == pytest.approx(22.0)
  assert result["changes"]["joint"] == ["single.model.embedding_norm: 'per_part' -> 'joint'"]
  # The share of the object in the background channel is summarised and paired like the rest.
  assert result["paired"]["joint"]["object_in_background"]["mean"] == pytest.approx(0.002)
  text = compare.markdown(result)
  assert "+2.0 [" in text and "keypoint position alone" in text and "0.230" in text
  assert "object in the background channel" in text


def test_an_arm_on_another_world_is_refused(tmp_path):
  base = _run(tmp_path, "base", {0: 10.0, 1: 20.0})
  other = _run(tmp_path, "other", {0: 10.0, 1: 20.0}, world_seed=1)
  with pytest.raises(ValueError, match="differs from the baseline in world"):
    compare.compare(compare.read_run(base), [("other", compare.read_run(other))])


def test_a_screen_on_one_seed_reads_that_seed_alone_and_refuses_a_run_without_it(tmp_path,
                                                                                capsys):
  base = _run(tmp_path, "base", {0: 10.0, 1: 20.0, 2: 30.0})
  screen = _run(tmp_path, "screen", {0: 14.0}, norm="joint")
  with pytest.raises(ValueError, match="differs from the baseline in seeds"):
    compare.compare(compare.read_run(base), [("joint", compare.read_run(screen))])
  result = compare.compare(compare.read_run(base), [("joint", compare.read_run(screen))],
                           seeds=[0])
  assert result["paired"]["joint"]["NMI"]["differences"] == [4.0]
  assert result["summary"]["baseline"]["NMI"]["mean"] == pytest.approx(10.0)
  assert result["seeds"] == [0] and result["runs"] == {"baseline": 1, "joint": 1}
  assert result["changes"]["joint"] == ["single.model.embedding_norm: 'per_part' -> 'joint'"]
  with pytest.raises(ValueError, match=r"'joint' has no 'single' row of run seed\(s\) \[1\]"):
    compare.compare(compare.read_run(base), [("joint", compare.read_run(screen))], seeds=[0, 1])
  assert compare.main(["--baseline", base, "--arm", f"joint={screen}", "--seeds", "0"]) == 0
  assert "run seeds [0]" in capsys.readouterr().out


def test_a_run_collapses_on_one_channel_or_a_background_far_from_the_truth():
  assert not compare.collapsed({"max_part_share": 0.5, "background_share": 0.7,
                                "background_share_true": 0.8})
  assert compare.collapsed({"max_part_share": 0.95, "background_share": 0.8,
                            "background_share_true": 0.8})
  assert compare.collapsed({"max_part_share": 0.3, "background_share": 0.6,
                            "background_share_true": 0.8})


def test_the_command_names_a_workdir_that_is_not_a_finished_run(tmp_path, capsys):
  assert compare.main([f"--baseline={tmp_path}"]) == 2
  assert "results.json not found" in capsys.readouterr().err
