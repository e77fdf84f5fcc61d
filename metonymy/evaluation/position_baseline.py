"""The position-only partition: what NMI / ARI at keypoints score from where a point lies alone.

NMI and ARI compare ground-truth keypoint groups with the part under each keypoint. A partition
that never looks at the image (k-means over keypoint positions in the frame) already scores high
where the pose barely varies, since a position then says which part it is. That partition, with
as many clusters as the model has foreground parts, fit on the training split's keypoints and
scored on the evaluated ones exactly as a model's parts are (`part_metrics.keypoint_nmi_ari`), is
the chance level of every NMI / ARI table: the strongest trivial baseline, not 0.

Coordinates are normalised by the image the keypoints live in: (x / width, y / height), so a
baseline fit on one split applies to another of the same framing. It uses no label and no pixel.
"""

import dataclasses
from typing import Dict, Optional, Sequence

import numpy as np

from metonymy.evaluation import part_metrics


@dataclasses.dataclass(frozen=True)
class PositionBaseline:
  """k-means centres over normalised keypoint positions.

  Attributes:
    centres: float [C, 2], (x, y) in [0, 1] units of the image.
    num_points: how many visible training keypoints the centres were fit on.
  """
  centres: np.ndarray
  num_points: int

  @property
  def num_clusters(self) -> int:
    return int(self.centres.shape[0])

  def keypoint_part(self, keypoints: np.ndarray, visible: np.ndarray,
                    image_hw: Sequence[int]) -> np.ndarray:
    """int64 [S, M]: the nearest centre of each visible keypoint, -1 where not visible.

    Args:
      keypoints: float [S, M, 2], (x, y) in pixels of an image of size `image_hw`.
      visible: bool [S, M].
      image_hw: (height, width) of that image.
    """
    points = normalise(keypoints, image_hw)
    distance = ((points[..., None, :] - self.centres) ** 2).sum(-1)  # [S, M, C]
    nearest = np.argmin(distance, -1) if self.num_clusters else np.zeros(points.shape[:-1], int)
    return np.where(np.asarray(visible, bool), nearest, part_metrics.INVISIBLE).astype(np.int64)

  def scores(self, keypoints: np.ndarray, visible: np.ndarray, image_hw: Sequence[int], *,
             keypoint_group=None, weights=None) -> Dict[str, float]:
    """NMI / ARI (x100) of this partition at the given keypoints, keyed as `SCALAR_KEYS`."""
    return self.score_parts(self.keypoint_part(keypoints, visible, image_hw),
                            keypoint_group=keypoint_group, weights=weights)

  def score_parts(self, keypoint_part: np.ndarray, *, keypoint_group=None,
                  weights=None) -> Dict[str, float]:
    """`SCALAR_KEYS` from this partition's clusters at keypoints (`keypoint_part`, [S, M]);
    `weights` [S], optional per-sample weights (bootstrap multiplicities).

    The partition has no background cluster, so the background-included and the
    foreground-only variants coincide; both are reported so every model column has its row.
    """
    # The clusters play the K foreground parts; id C (the background) never occurs.
    result = part_metrics.keypoint_nmi_ari(keypoint_part, self.num_clusters,
                                           keypoint_group=keypoint_group, weights=weights)
    nmi, ari = float(result["nmi"]), float(result["ari"])
    return {"parts/position_NMI": nmi, "parts/position_ARI": ari,
            "parts/position_NMI_fg": nmi, "parts/position_ARI_fg": ari}


def normalise(keypoints: np.ndarray, image_hw: Sequence[int]) -> np.ndarray:
  """float64 [..., 2]: (x / width, y / height)."""
  height, width = (float(v) for v in image_hw)
  return np.asarray(keypoints, np.float64) / np.array([width, height])


def fit(keypoints: np.ndarray, visible: np.ndarray, image_hw: Sequence[int], num_clusters: int,
        *, seed: int = 0) -> Optional[PositionBaseline]:
  """k-means (k-means++, 10 restarts) over the visible keypoints' normalised positions.

  Args:
    keypoints: float [S, M, 2] in pixels of images of size `image_hw` (the training split, in
      the frame the evaluation sees it: after the evaluation transforms).
    visible: bool [S, M].
    num_clusters: the model's number of foreground parts K.
    seed: the k-means seed.

  Returns:
    The baseline, or None when there is no visible keypoint to fit on. With fewer distinct
    positions than `num_clusters`, one cluster per distinct position.
  """
  if num_clusters < 1:
    raise ValueError(f"num_clusters must be >= 1, got {num_clusters}")
  keypoints = np.asarray(keypoints, np.float64)
  visible = np.asarray(visible, bool)
  if keypoints.shape[:-1] != visible.shape or keypoints.shape[-1] != 2:
    raise ValueError(f"keypoints {keypoints.shape} must be [S, M, 2] with visible "
                     f"{visible.shape} [S, M]")
  points = normalise(keypoints, image_hw)[visible]
  if not len(points):
    return None
  # Imported here: scikit-learn's import costs a process ~1 s, and most importers never fit.
  from sklearn import cluster
  clusters = min(int(num_clusters), len(np.unique(points, axis=0)))
  kmeans = cluster.KMeans(n_clusters=clusters, n_init=10, random_state=int(seed)).fit(points)
  return PositionBaseline(centres=np.asarray(kmeans.cluster_centers_, np.float64),
                          num_points=int(len(points)))
