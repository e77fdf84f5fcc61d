"""The paper's part groupings (Appendix H, Tables S7-S9) and the datasets' fixed vocabularies.

Nothing here reads files: the loaders (`cub.py`, `celeba.py`, `chexpert.py`) match these tables
against the names they find on disk and raise `base.DataError` when the two disagree.

CUB (Table S9): 248 of the 312 attributes, selected and grouped by their name prefix (the part of
`has_wing_color::blue` before `::`). The 64 left out describe the whole bird: has_size,
has_shape, has_primary_color, has_upperparts_color, has_underparts_color.

Keypoint groups (Table S7) merge by relabelling, not by averaging: every visible original
keypoint stays one point at its own location and takes its group's label, so a group holds a
variable number of points (CUB's head up to 7, its wing and leg up to 2). An example carries a
fixed number M of keypoints (`keypoints [M, 2]`, `keypoint_visible [M]`, so batches stay
rectangular); `DatasetInfo.keypoint_group_ids [M]` names each one's group.

CUB keypoints: the 15 annotated parts, in parts.txt order (M = 15), in 7 groups named like the
attribute parts (Table S7 lists the two eyes as one "eye"; both are head points).

CelebA (Table S8): 32 of the 40 attributes in 8 parts (part names lower-case, "Mouth / Jaw" ->
`mouth`). Landmarks (Table S7): the two eyes stay two points labelled eye, the nose is one point,
and the two mouth corners are averaged into one mouth point, the only averaging the paper does
("left mouth, right mouth (averaged)", Appendix H): M = 4.

CheXpert / CheXlocalize: the 14 CSV observations and the 10 localized tasks. Tasks are named as in
the CSV ("Lung Opacity"); CheXlocalize's JSON calls that one "Airspace Opacity".

Flip pairs index an example's keypoints. Both members of a left/right pair share a group, so a
horizontal flip that does not swap them leaves every label, and so NMI / ARI and the contingency,
unchanged; swapping keeps the names right (the mirrored bird's left wing is the old right wing).
"""

from typing import Dict, Tuple

# ------------------------------------------------------------------------------------------------
# CUB-200-2011

CUB_PARTS: Tuple[str, ...] = ("back", "belly", "breast", "head", "leg", "tail", "wing")

_COLORS = ("black", "blue", "brown", "buff", "green", "grey", "iridescent", "olive", "orange",
           "pink", "purple", "red", "rufous", "white", "yellow")
_PATTERNS = ("multi-colored", "solid", "spotted", "striped")

# Table S9, row by row: (attribute-name prefix, part, value names as the table lists them). The
# loader keeps exactly the attributes whose prefix is here and checks each prefix's values.
CUB_ATTRIBUTE_TABLE: Tuple[Tuple[str, str, Tuple[str, ...]], ...] = (
    ("has_back_color", "back", _COLORS),
    ("has_back_pattern", "back", _PATTERNS),
    ("has_belly_color", "belly", _COLORS),
    ("has_belly_pattern", "belly", _PATTERNS),
    ("has_breast_color", "breast", _COLORS),
    ("has_breast_pattern", "breast", _PATTERNS),
    ("has_bill_color", "head", _COLORS),
    ("has_bill_length", "head", ("about_the_same_as_head", "longer_than_head",
                                 "shorter_than_head")),
    ("has_bill_shape", "head", ("all-purpose", "cone", "curved_(up_or_down)", "dagger", "hooked",
                                "hooked_seabird", "needle", "spatulate", "specialized")),
    ("has_crown_color", "head", _COLORS),
    # CUB has no iridescent eye colour: 14 values, not 15.
    ("has_eye_color", "head", tuple(c for c in _COLORS if c != "iridescent")),
    ("has_forehead_color", "head", _COLORS),
    ("has_head_pattern", "head", ("capped", "crested", "eyebrow", "eyeline", "eyering", "malar",
                                  "masked", "plain", "spotted", "striped", "unique_pattern")),
    ("has_nape_color", "head", _COLORS),
    ("has_throat_color", "head", _COLORS),
    ("has_leg_color", "leg", _COLORS),
    ("has_tail_pattern", "tail", _PATTERNS),
    ("has_tail_shape", "tail", ("fan-shaped_tail", "forked_tail", "notched_tail", "pointed_tail",
                                "rounded_tail", "squared_tail")),
    ("has_under_tail_color", "tail", _COLORS),
    ("has_upper_tail_color", "tail", _COLORS),
    ("has_wing_color", "wing", _COLORS),
    ("has_wing_pattern", "wing", _PATTERNS),
    ("has_wing_shape", "wing", ("broad-wings", "long-wings", "pointed-wings", "rounded-wings",
                                "tapered-wings")),
)

CUB_ATTRIBUTE_PREFIX_PART: Dict[str, str] = {p: part for p, part, _ in CUB_ATTRIBUTE_TABLE}

# Attributes per part, counted by hand from Table S9 (tests recount them from the table above).
CUB_PART_COUNTS: Dict[str, int] = {
    "back": 19, "belly": 19, "breast": 19, "head": 112, "leg": 15, "tail": 40, "wing": 24}
CUB_NUM_ATTRIBUTES = 248
CUB_NUM_RAW_ATTRIBUTES = 312

# Prefixes of the 64 holistic attributes Table S9 leaves out.
CUB_EXCLUDED_PREFIXES: Tuple[str, ...] = (
    "has_primary_color", "has_shape", "has_size", "has_underparts_color", "has_upperparts_color")

# parts/parts.txt, ids 1..15 in order: an example's 15 keypoints, in this order.
CUB_KEYPOINTS: Tuple[str, ...] = (
    "back", "beak", "belly", "breast", "crown", "forehead", "left eye", "left leg", "left wing",
    "nape", "right eye", "right leg", "right wing", "tail", "throat")

# Table S7: group -> the original keypoints that take its label.
CUB_KEYPOINT_MERGE: Dict[str, Tuple[str, ...]] = {
    "back": ("back",),
    "belly": ("belly",),
    "breast": ("breast",),
    "head": ("beak", "crown", "forehead", "left eye", "nape", "right eye", "throat"),
    "leg": ("left leg", "right leg"),
    "tail": ("tail",),
    "wing": ("left wing", "right wing"),
}
CUB_KEYPOINT_GROUPS: Tuple[str, ...] = CUB_PARTS

# Left/right pairs among the 15 keypoints (0-based indices into CUB_KEYPOINTS).
CUB_KEYPOINT_FLIP_PAIRS: Tuple[Tuple[int, int], ...] = (
    (CUB_KEYPOINTS.index("left eye"), CUB_KEYPOINTS.index("right eye")),
    (CUB_KEYPOINTS.index("left leg"), CUB_KEYPOINTS.index("right leg")),
    (CUB_KEYPOINTS.index("left wing"), CUB_KEYPOINTS.index("right wing")),
)

# ------------------------------------------------------------------------------------------------
# CelebA

# The 40 columns of list_attr_celeba.txt, in file order.
CELEBA_RAW_ATTRIBUTES: Tuple[str, ...] = (
    "5_o_Clock_Shadow", "Arched_Eyebrows", "Attractive", "Bags_Under_Eyes", "Bald", "Bangs",
    "Big_Lips", "Big_Nose", "Black_Hair", "Blond_Hair", "Blurry", "Brown_Hair", "Bushy_Eyebrows",
    "Chubby", "Double_Chin", "Eyeglasses", "Goatee", "Gray_Hair", "Heavy_Makeup",
    "High_Cheekbones", "Male", "Mouth_Slightly_Open", "Mustache", "Narrow_Eyes", "No_Beard",
    "Oval_Face", "Pale_Skin", "Pointy_Nose", "Receding_Hairline", "Rosy_Cheeks", "Sideburns",
    "Smiling", "Straight_Hair", "Wavy_Hair", "Wearing_Earrings", "Wearing_Hat", "Wearing_Lipstick",
    "Wearing_Necklace", "Wearing_Necktie", "Young")

CELEBA_PARTS: Tuple[str, ...] = ("hair", "hat", "eye", "eyeglasses", "nose", "mouth", "ear", "neck")

# Table S8, in the table's order; the loader's attribute vector follows this order exactly.
CELEBA_ATTRIBUTE_TABLE: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("hair", ("Bald", "Bangs", "Black_Hair", "Blond_Hair", "Brown_Hair", "Gray_Hair",
              "Receding_Hairline", "Straight_Hair", "Wavy_Hair")),
    ("hat", ("Wearing_Hat",)),
    ("eye", ("Arched_Eyebrows", "Bags_Under_Eyes", "Bushy_Eyebrows", "Narrow_Eyes")),
    ("eyeglasses", ("Eyeglasses",)),
    ("nose", ("Big_Nose", "Pointy_Nose")),
    ("mouth", ("Big_Lips", "Mouth_Slightly_Open", "Smiling", "Wearing_Lipstick", "5_o_Clock_Shadow",
               "Double_Chin", "Goatee", "Mustache", "No_Beard", "Sideburns", "High_Cheekbones",
               "Rosy_Cheeks")),
    ("ear", ("Wearing_Earrings",)),
    ("neck", ("Wearing_Necklace", "Wearing_Necktie")),
)
CELEBA_ATTRIBUTES: Tuple[str, ...] = tuple(a for _, attrs in CELEBA_ATTRIBUTE_TABLE for a in attrs)
CELEBA_ATTRIBUTE_PART: Tuple[int, ...] = tuple(
    CELEBA_PARTS.index(part) for part, attrs in CELEBA_ATTRIBUTE_TABLE for _ in attrs)
CELEBA_PART_COUNTS: Dict[str, int] = {
    "hair": 9, "hat": 1, "eye": 4, "eyeglasses": 1, "nose": 2, "mouth": 12, "ear": 1, "neck": 2}
CELEBA_NUM_ATTRIBUTES = 32
# The 8 holistic attributes Table S8 leaves out.
CELEBA_EXCLUDED: Tuple[str, ...] = (
    "Attractive", "Blurry", "Chubby", "Heavy_Makeup", "Male", "Oval_Face", "Pale_Skin", "Young")

# list_landmarks_align_celeba.txt: 5 (x, y) points in this order.
CELEBA_LANDMARKS: Tuple[str, ...] = ("left eye", "right eye", "nose", "left mouth", "right mouth")
CELEBA_LANDMARK_COLUMNS: Tuple[str, ...] = (
    "lefteye_x", "lefteye_y", "righteye_x", "righteye_y", "nose_x", "nose_y",
    "leftmouth_x", "leftmouth_y", "rightmouth_x", "rightmouth_y")
# An example's 4 keypoints, each the mean of these landmarks: Table S7 averages only the two
# mouth corners.
CELEBA_KEYPOINT_LANDMARKS: Dict[str, Tuple[str, ...]] = {
    "left eye": ("left eye",),
    "right eye": ("right eye",),
    "nose": ("nose",),
    "mouth": ("left mouth", "right mouth"),
}
CELEBA_KEYPOINTS: Tuple[str, ...] = tuple(CELEBA_KEYPOINT_LANDMARKS)
# Table S7: group -> the keypoints that take its label.
CELEBA_KEYPOINT_MERGE: Dict[str, Tuple[str, ...]] = {
    "eye": ("left eye", "right eye"),
    "nose": ("nose",),
    "mouth": ("mouth",),
}
CELEBA_KEYPOINT_GROUPS: Tuple[str, ...] = ("eye", "nose", "mouth")
# Left/right pairs among the 4 keypoints (indices into CELEBA_KEYPOINTS).
CELEBA_KEYPOINT_FLIP_PAIRS: Tuple[Tuple[int, int], ...] = (
    (CELEBA_KEYPOINTS.index("left eye"), CELEBA_KEYPOINTS.index("right eye")),)

# ------------------------------------------------------------------------------------------------
# CheXpert / CheXlocalize

CHEXPERT_OBSERVATIONS: Tuple[str, ...] = (
    "No Finding", "Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Opacity", "Lung Lesion",
    "Edema", "Consolidation", "Pneumonia", "Atelectasis", "Pneumothorax", "Pleural Effusion",
    "Pleural Other", "Fracture", "Support Devices")

# The 10 CheXlocalize tasks in CheXlocalize's own order, named as in the CheXpert CSV. These are
# both the attributes (`attributes[t]`) and the mask tasks (`masks[t]`) of the CheXpert source.
CHEXPERT_TASKS: Tuple[str, ...] = (
    "Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Lesion", "Lung Opacity", "Edema",
    "Consolidation", "Atelectasis", "Pneumothorax", "Pleural Effusion", "Support Devices")
# CSV name -> CheXlocalize JSON name, where they differ.
CHEXLOCALIZE_JSON_NAME: Dict[str, str] = {"Lung Opacity": "Airspace Opacity"}
CHEXLOCALIZE_TASKS: Tuple[str, ...] = tuple(
    CHEXLOCALIZE_JSON_NAME.get(t, t) for t in CHEXPERT_TASKS)
# MPPO has no fixed semantic parts: each task is its own "part" (its ground-truth mask), named in
# lower case with underscores.
CHEXPERT_PARTS: Tuple[str, ...] = tuple(t.lower().replace(" ", "_") for t in CHEXPERT_TASKS)


def cub_attribute_prefix(name: str) -> str:
  """`has_wing_color::blue` -> `has_wing_color`."""
  return name.split("::", 1)[0]


# The 248 CUB attributes in Table S9's order (parts, then prefixes, then values as listed), and
# each one's part index. The loader looks these names up in attributes.txt, so the vector never
# depends on the file's own order.
CUB_ATTRIBUTES: Tuple[str, ...] = tuple(
    f"{prefix}::{value}" for prefix, _, values in CUB_ATTRIBUTE_TABLE for value in values)
CUB_ATTRIBUTE_PART: Tuple[int, ...] = tuple(
    CUB_PARTS.index(part) for _, part, values in CUB_ATTRIBUTE_TABLE for _ in values)


def keypoint_group_ids(merge: Dict[str, Tuple[str, ...]], groups: Tuple[str, ...],
                       keypoints: Tuple[str, ...]) -> Tuple[int, ...]:
  """The group of each keypoint, int [M]: index into `groups` of the group listing it in `merge`.

  Every keypoint must belong to exactly one group and every group hold at least one keypoint.
  """
  group_of = {}
  for g, group in enumerate(groups):
    if not merge[group]:
      raise ValueError(f"keypoint group {group!r} has no keypoint")
    for name in merge[group]:
      if name in group_of:
        raise ValueError(f"keypoint {name!r} is in groups {groups[group_of[name]]!r} and {group!r}")
      group_of[name] = g
  missing = [name for name in keypoints if name not in group_of]
  unknown = sorted(set(group_of) - set(keypoints))
  if missing or unknown:
    raise ValueError(f"keypoint groups do not cover the keypoints: without a group {missing}, "
                     f"not keypoints {unknown}")
  return tuple(group_of[name] for name in keypoints)


# The group (index into *_KEYPOINT_GROUPS) of each of an example's keypoints: DatasetInfo's
# keypoint_group_ids.
CUB_KEYPOINT_GROUP_IDS: Tuple[int, ...] = keypoint_group_ids(
    CUB_KEYPOINT_MERGE, CUB_KEYPOINT_GROUPS, CUB_KEYPOINTS)
CELEBA_KEYPOINT_GROUP_IDS: Tuple[int, ...] = keypoint_group_ids(
    CELEBA_KEYPOINT_MERGE, CELEBA_KEYPOINT_GROUPS, CELEBA_KEYPOINTS)
