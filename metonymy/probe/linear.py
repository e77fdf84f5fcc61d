"""Linear attribute probes, one per part, trained as one vectorized problem (paper Sec. 3.0.1).

For every part k a linear layer l^k: R^D -> R^A is trained on all A attributes with binary cross
entropy and an L2 penalty (weight decay) lambda, each (part, attribute) column on its own:

  L_ka(w, b) = 1/n_a sum_s v_sa [softplus(z_ska) - y_sa z_ska] + lambda/2 ||w||^2,
  z_ska = w . x^k_s + b,   n_a = sum_s v_sa (v = label validity).

This is the objective of an L2-regularized logistic regression (scikit-learn's
`LogisticRegression(C = 1 / (lambda n_a))`), solved to a tolerance rather than by a fixed number
of SGD epochs, so the probe is a function of the data and lambda alone.

Solver. Features are standardized (train mean / std per part and dimension) and rotated into the
eigenbasis of their covariance, where the data Hessian is approximately c_ka diag(e_k) (c_ka the
mean logistic curvature of the column). An L-BFGS per column, with that diagonal as its initial
inverse Hessian and a per-column Armijo step, then converges in tens of iterations; every
iteration is one batched forward and one backward matmul over all K x A columns at once (jit).
The intercept is unpenalized. The penalty is rotation-invariant, so the rotated problem is the
standardized problem exactly; weights are mapped back to raw features at the end.

Weight decay is chosen on a validation split: the path of lambdas runs from strong to weak, each
warm-started from the previous solution, and stops early once validation mAP has stopped improving
(`patience`); per part (default) or for all parts at once, the lambda with the best validation mAP
(over all attributes) is kept. No refit on train + val.
"""

import dataclasses
import functools
import time
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from metonymy.evaluation import metrics


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
  """How probes are trained (config block `probe`, config_lib.linear_probe)."""
  weight_decays: Tuple[float, ...] = (1.0, 1e-1, 1e-2, 1e-3, 1e-4)
  max_iters: int = 60  # L-BFGS iterations per weight decay (each: one forward + backward)
  # Stop when every column's approximate Newton decrement g^T H0^-1 g / 2 (about its distance to
  # the optimal loss, in mean-BCE units) is below this. 1e-4 moves validation mAP by < 1e-4.
  tol: float = 1e-4
  memory: int = 8  # L-BFGS history
  select: str = "per_part"  # "per_part" or "shared" weight decay
  # Stop the weight-decay path once validation mAP has not improved for this many consecutive
  # weight decays (on every part; 0 = run the whole path).
  patience: int = 1

  def __post_init__(self):
    if not self.weight_decays or any(w <= 0 for w in self.weight_decays):
      raise ValueError(f"probe.weight_decays must be positive, got {self.weight_decays}")
    if self.select not in ("per_part", "shared"):
      raise ValueError(f"probe.select must be 'per_part' or 'shared', got {self.select!r}")
    if self.max_iters < 1 or self.memory < 1:
      raise ValueError("probe.max_iters and probe.memory must be >= 1")
    if self.patience < 0:
      raise ValueError(f"probe.patience must be >= 0, got {self.patience}")

  @classmethod
  def from_config(cls, cfg) -> "ProbeConfig":
    return cls(weight_decays=tuple(float(w) for w in cfg.weight_decays),
               max_iters=int(cfg.max_iters), tol=float(cfg.tol), memory=int(cfg.memory),
               select=str(cfg.select), patience=int(cfg.patience))


@dataclasses.dataclass
class Probes:
  """K trained probes on raw features: logits = einsum('skd,kda->ska', x, weights) + bias."""
  weights: np.ndarray  # float32 [K, D, A]
  bias: np.ndarray  # float32 [K, A]
  weight_decay: np.ndarray  # float [K], the chosen lambda per part
  val_map: np.ndarray  # float [L, K], validation mAP of every lambda run on the path
  iterations: np.ndarray  # int [L], L-BFGS iterations run per lambda
  path: np.ndarray  # float [L], the lambdas run (strong to weak; the path may stop early)
  seconds: float

  def logits(self, x: np.ndarray) -> np.ndarray:
    """x [S, K, D] -> float32 [S, K, A]."""
    return np.asarray(_logits(jnp.asarray(x, jnp.float32), jnp.asarray(self.weights),
                              jnp.asarray(self.bias)))


@jax.jit
def _logits(x, w, b):
  return jnp.einsum("skd,kda->ska", x, w) + b[None]


# ------------------------------------------------------------------------------------------------
# The solver. Coordinates: Wa [K, D + 1, A], rows 0..D-1 the weights in the rotated standardized
# basis, row D the intercept. Xt [K, S, D] are the rotated standardized features (part-major, so
# each part is one plain matmul).


def _objective(wa, xt, y, v, inv_n, lam):
  """Loss [K, A], gradient [K, D + 1, A], mean curvature [K, A] of every column."""
  d = xt.shape[-1]
  w, b = wa[:, :d], wa[:, d]
  z = jnp.einsum("ksd,kda->ksa", xt, w) + b[:, None, :]
  data = (v * (jax.nn.softplus(z) - y * z)).sum(1) * inv_n
  loss = data + 0.5 * lam * (w * w).sum(1)
  p = jax.nn.sigmoid(z)
  r = v * (p - y) * inv_n
  grad = jnp.concatenate([jnp.einsum("ksd,ksa->kda", xt, r) + lam * w, r.sum(1)[:, None]], 1)
  curvature = (v * p * (1 - p)).sum(1) * inv_n
  return loss, grad, curvature


def _precondition(curvature, eig, lam):
  """Diagonal inverse-Hessian guess [K, D + 1, A]: 1 / (c_ka e_kj + lambda), 1 / c_ka (bias)."""
  c = jnp.maximum(curvature, 1e-4)[:, None, :]
  weights = 1.0 / (c * eig[:, :, None] + lam)
  return jnp.concatenate([weights, 1.0 / c], 1)


def _two_loop(grad, s_mem, y_mem, rho, ptr, h0):
  """L-BFGS direction -H grad per column; memory slots with rho = 0 are no-ops."""
  m = s_mem.shape[0]

  def first(i, carry):
    q, alphas = carry
    j = (ptr - 1 - i) % m
    alpha = rho[j] * (s_mem[j] * q).sum(1)
    return q - alpha[:, None] * y_mem[j], alphas.at[j].set(alpha)

  # Unrolled: m is small and static, and XLA compiles the unrolled loops faster.
  q, alphas = jax.lax.fori_loop(0, m, first, (grad, jnp.zeros(rho.shape, grad.dtype)),
                                unroll=True)
  r = h0 * q

  def second(i, r):
    j = (ptr + i) % m
    beta = rho[j] * (y_mem[j] * r).sum(1)
    return r + (alphas[j] - beta)[:, None] * s_mem[j]

  return -jax.lax.fori_loop(0, m, second, r, unroll=True)


@functools.partial(jax.jit, donate_argnums=(0,))
def _step(state, xt, y, v, inv_n, lam, eig):
  wa, loss, grad, curvature, step, s_mem, y_mem, rho, ptr = state
  h0 = _precondition(curvature, eig, lam)
  direction = _two_loop(grad, s_mem, y_mem, rho, ptr, h0)
  slope = (grad * direction).sum(1)
  # Fall back to the preconditioned gradient where the quasi-Newton direction is not a descent one.
  steepest = -h0 * grad
  direction = jnp.where((slope < 0)[:, None], direction, steepest)
  slope = jnp.where(slope < 0, slope, (grad * steepest).sum(1))
  trial = wa + step[:, None] * direction
  t_loss, t_grad, t_curv = _objective(trial, xt, y, v, inv_n, lam)
  ok = (t_loss <= loss + 1e-4 * step * slope) & jnp.isfinite(t_loss)
  s = jnp.where(ok[:, None], trial - wa, 0.0)
  yv = jnp.where(ok[:, None], t_grad - grad, 0.0)
  sy = (s * yv).sum(1)
  new_rho = jnp.where(sy > 1e-12, 1.0 / jnp.where(sy > 1e-12, sy, 1.0), 0.0)
  s_mem, y_mem, rho = s_mem.at[ptr].set(s), y_mem.at[ptr].set(yv), rho.at[ptr].set(new_rho)
  keep = lambda new, old: jnp.where(ok[:, None] if new.ndim == 3 else ok, new, old)
  wa, loss = keep(trial, wa), keep(t_loss, loss)
  grad, curvature = keep(t_grad, grad), keep(t_curv, curvature)
  step = jnp.where(ok, 1.0, step * 0.25)
  decrement = 0.5 * (grad * _precondition(curvature, eig, lam) * grad).sum(1)
  state = (wa, loss, grad, curvature, step, s_mem, y_mem, rho, (ptr + 1) % s_mem.shape[0])
  return state, jnp.max(decrement)


@jax.jit
def _init_state(wa, xt, y, v, inv_n, lam, memory_like):
  loss, grad, curvature = _objective(wa, xt, y, v, inv_n, lam)
  m = memory_like.shape[0]
  zeros = jnp.zeros((m,) + wa.shape, wa.dtype)
  return (wa, loss, grad, curvature, jnp.ones(loss.shape, wa.dtype), zeros, zeros,
          jnp.zeros((m,) + loss.shape, wa.dtype), jnp.asarray(0, jnp.int32))


@jax.jit
def _rotated_logits(xt, wa):
  """Rotated features [K, S, D] and coordinates [K, D + 1, A] -> logits [S, K, A]."""
  d = xt.shape[-1]
  return jnp.einsum("ksd,kda->ska", xt, wa[:, :d]) + wa[:, d][None]


@jax.jit
def _standardize_rotate(x, mean, scale, basis):
  """x [S, K, D] -> rotated standardized [K, S, D]."""
  z = (x - mean[None]) / scale[None]
  return jnp.einsum("skd,kde->kse", z, basis)


@jax.jit
def _moments(x):
  """Per part: mean [K, D], std [K, D], covariance eigenpairs of the standardized features."""
  mean = x.mean(0)
  std = x.std(0)
  scale = jnp.where(std > 1e-6 * jnp.maximum(jnp.max(std, axis=1, keepdims=True), 1e-30), std, 1.0)
  z = (x - mean[None]) / scale[None]
  cov = jnp.einsum("skd,ske->kde", z, z) / x.shape[0]
  eig, basis = jnp.linalg.eigh(cov)
  return mean, scale, jnp.maximum(eig, 0.0), basis


def _validation_map(logits: np.ndarray, labels: np.ndarray, valid: np.ndarray) -> np.ndarray:
  """Mean AP over attributes of every part: [K] (NaN-skipping)."""
  ap = metrics.per_attribute(metrics.average_precision, logits, labels, valid)
  with np.errstate(invalid="ignore"):
    return np.nanmean(np.where(np.isfinite(ap), ap, np.nan), axis=1)


def train_probes(train_x: np.ndarray, train_y: np.ndarray, train_valid: Optional[np.ndarray],
                 val_x: np.ndarray, val_y: np.ndarray, val_valid: Optional[np.ndarray],
                 config: ProbeConfig = ProbeConfig(), log=None) -> Probes:
  """Trains the K probes and picks weight decay on the validation split.

  Args:
    train_x: float [S, K, D] part features; train_y: {0, 1} [S, A]; train_valid: bool [S, A] or
      None (all labels valid). val_*: the same for the validation split.
    config: ProbeConfig.
    log: optional callable(str) for progress lines.

  Returns:
    Probes on raw features.
  """
  start = time.perf_counter()
  train_x = np.asarray(train_x, np.float32)
  val_x = np.asarray(val_x, np.float32)
  if train_x.ndim != 3 or val_x.ndim != 3 or train_x.shape[1:] != val_x.shape[1:]:
    raise ValueError(f"features must be [S, K, D] with the same K, D: train {train_x.shape}, "
                     f"val {val_x.shape}")
  s, k, d = train_x.shape
  a = np.shape(train_y)[1]
  if np.shape(train_y) != (s, a) or np.shape(val_y) != (val_x.shape[0], a):
    raise ValueError(f"labels must be [S, A]: train {np.shape(train_y)}, val {np.shape(val_y)}")
  v = np.ones((s, a), np.float32) if train_valid is None else np.asarray(train_valid, np.float32)
  y = np.asarray(train_y, np.float32)
  n = v.sum(0)
  inv_n = jnp.asarray(1.0 / np.maximum(n, 1.0), jnp.float32)[None]  # [1, A]

  x = jnp.asarray(train_x)
  mean, scale, eig, basis = _moments(x)
  xt = _standardize_rotate(x, mean, scale, basis)
  xt_val = _standardize_rotate(jnp.asarray(val_x), mean, scale, basis)
  del x
  y_j, v_j = jnp.asarray(y)[None], jnp.asarray(v)[None]  # [1, S, A], broadcast over parts

  # Cold start: zero weights, intercept at the log-odds of the training prevalence.
  prevalence = np.clip((y * v).sum(0) / np.maximum(n, 1.0), 1e-4, 1 - 1e-4)
  wa = np.zeros((k, d + 1, a), np.float32)
  wa[:, d] = np.log(prevalence / (1 - prevalence))
  wa = jnp.asarray(wa)
  memory_like = jnp.zeros((config.memory,))

  lambdas = sorted(config.weight_decays, reverse=True)
  solutions, val_maps, iterations = [], [], []
  best_so_far, stale = None, 0
  for lam in lambdas:
    lam_j = jnp.asarray(lam, jnp.float32)
    state = _init_state(wa, xt, y_j, v_j, inv_n, lam_j, memory_like)
    it = 0
    for it in range(1, config.max_iters + 1):
      state, decrement = _step(state, xt, y_j, v_j, inv_n, lam_j, eig)
      if float(decrement) < config.tol:
        break
    wa = state[0]
    val_logits = np.asarray(_rotated_logits(xt_val, wa))
    val_map = _validation_map(val_logits, val_y, val_valid)
    solutions.append(np.asarray(wa))
    val_maps.append(val_map)
    iterations.append(it)
    if log:
      log(f"probe lambda={lam:g}: {it} iterations, decrement {float(decrement):.2e}, "
          f"val mAP per part {np.round(val_map, 4).tolist()}")
    score = np.where(np.isfinite(val_map), val_map, -np.inf)
    if config.select == "shared":
      score = np.full_like(score, score.mean())
    if best_so_far is None or np.any(score > best_so_far):
      best_so_far = score if best_so_far is None else np.maximum(best_so_far, score)
      stale = 0
    else:
      stale += 1
      if config.patience and stale >= config.patience:
        break

  lambdas = lambdas[:len(solutions)]
  val_maps = np.stack(val_maps)  # [L, K]
  filled = np.where(np.isfinite(val_maps), val_maps, -np.inf)
  if config.select == "per_part":
    best = np.argmax(filled, axis=0)  # [K]
  else:
    best = np.full(k, int(np.argmax(filled.mean(1))))
  chosen = np.stack([solutions[best[j]][j] for j in range(k)])  # [K, D + 1, A]

  # Back to raw features: z = ((x - mean) / scale) Q w + b.
  basis_np, scale_np, mean_np = np.asarray(basis), np.asarray(scale), np.asarray(mean)
  w_std = np.einsum("kde,kea->kda", basis_np, chosen[:, :d])
  weights = w_std / scale_np[:, :, None]
  bias = chosen[:, d] - np.einsum("kd,kda->ka", mean_np, weights)
  return Probes(weights=weights.astype(np.float32), bias=bias.astype(np.float32),
                weight_decay=np.asarray([lambdas[i] for i in best]), val_map=val_maps,
                iterations=np.asarray(iterations), path=np.asarray(lambdas),
                seconds=time.perf_counter() - start)
