"""Chapter 4's exercises: the same pair written again and again at several strengths, the erase
as a projection and a reflection, and the delta rule swept over its tokens more than once."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpt2k3.checks import check_delta_rule_call, check_positive_int, checked
from gpt2k3.experiments import memory
from gpt2k3.ops import delta

__all__ = ["repeated_writes", "erase_matrix", "recurrent_passes", "passes_to_least_squares"]


def repeated_writes(beta: float, n_writes: int, d: int = 16, seed: int = 0) -> dict:
    """Exercise 4.1: one pair ``(k, v)``, ``k`` a unit key, written ``n_writes`` times into an
    empty state with strength ``beta``. ``delta.recurrent`` with ``q = k`` returns what the key
    reads after each write; each read's error is ``k S - v`` in units of ``v``."""
    g = torch.Generator().manual_seed(seed)
    k = F.normalize(torch.randn(d, generator=g, dtype=torch.float64), dim=0)
    v = torch.randn(d, generator=g, dtype=torch.float64)
    ks, vs = k.expand(1, 1, n_writes, d), v.expand(1, 1, n_writes, d)
    reads, _ = delta.recurrent(ks, ks, vs, torch.full((1, 1, n_writes), float(beta), dtype=torch.float64))
    err = reads[0, 0] - v
    # every error is a multiple of v: its coefficient, and how far the error is from that line
    coeff = err @ v / (v @ v)
    return {"coefficient": coeff.tolist(), "off_line": (err - coeff[:, None] * v).abs().max().item(),
            "predicted": [-(1 - beta) ** n for n in range(1, n_writes + 1)]}


def erase_matrix(d: int = 8, beta: float = 1.0, key_norm: float = 1.0, seed: int = 0) -> dict:
    """Exercise 4.2: ``E = I - beta k^T k`` for a random key of norm ``key_norm``: its eigenvalues,
    and how far ``E`` is from a projection (``E^2 = E``), from symmetric, and from an involution
    (``E^2 = I``, a reflection)."""
    g = torch.Generator().manual_seed(seed)
    k = key_norm * F.normalize(torch.randn(1, d, generator=g, dtype=torch.float64), dim=-1)
    eye = torch.eye(d, dtype=torch.float64)
    E = eye - beta * k.T @ k
    return {"eigenvalues": torch.linalg.eigvalsh(E).tolist(),
            "along_k": (k @ E @ k.T).item() / (k @ k.T).item(),  # E's eigenvalue along k
            "projection_gap": (E @ E - E).abs().max().item(),
            "symmetry_gap": (E - E.T).abs().max().item(),
            "involution_gap": (E @ E - eye).abs().max().item(),
            "kills_k": (k @ E).abs().max().item()}


def _check_passes(q, k, v, beta, *, initial_state=None, passes: int = 1) -> None:
    check_delta_rule_call(q, k, v, beta, initial_state=initial_state)
    check_positive_int(passes, "passes")


@checked(_check_passes)
def recurrent_passes(q, k, v, beta, *, initial_state=None, passes: int = 1):
    """Exercise 4.3: :func:`gpt2k3.ops.delta.recurrent` swept over the same tokens ``passes``
    times, the state carried from one sweep into the next. With ``beta = 1`` and unit keys each
    write solves one equation ``k_t S = v_t`` exactly, and the sweeps are Kaczmarz's method for
    the system ``K S = V``. ``o`` is the last sweep's."""
    out_dtype, dtype = v.dtype, torch.promote_types(v.dtype, torch.float32)  # state: >= float32
    q, k, v, beta = (x.to(dtype) for x in (q, k, v, beta))
    B, H, T, Dk = k.shape
    S = k.new_zeros(B, H, Dk, v.shape[-1]) if initial_state is None else initial_state.to(dtype)
    o = torch.empty_like(v)
    for t in [*range(q.shape[2])] * passes:  # every token again, `passes` times over
        q_t, k_t, v_t = q[:, :, t], k[:, :, t], v[:, :, t]  # (B, H, D)
        v_old = (k_t.unsqueeze(-2) @ S).squeeze(-2)  # what the state returns for k_t now
        u = beta[:, :, t, None] * (v_t - v_old)  # write only the correction
        S = S + k_t.unsqueeze(-1) * u.unsqueeze(-2)  # outer product k_t^T u
        o[:, :, t] = (q_t.unsqueeze(-2) @ S).squeeze(-2)
    return o.to(out_dtype), S


def passes_to_least_squares(d: int, n: int, passes, beta: float = 1.0, seed: int = 0) -> dict:
    """Exercise 4.3: ``n`` random unit keys and standard-normal values in a ``d x d`` state: the
    mean recall error after each number of sweeps in ``passes`` at write strength ``beta``, the
    least-squares state's, and how far the swept state is from the least-squares (minimum-norm)
    one."""
    g = torch.Generator().manual_seed(seed)
    keys = memory.random_unit_keys(n, d, generator=g, dtype=torch.float64)
    values = torch.randn(n, d, generator=g, dtype=torch.float64)
    k, v = keys[None, None], values[None, None]
    b = torch.full((1, 1, n), float(beta), dtype=torch.float64)
    S_ls = memory.write_least_squares(keys, values)
    rows = []
    for p in passes:
        _, S = recurrent_passes(k, k, v, b, passes=p)
        err = ((keys @ S[0, 0] - values).norm(dim=-1) / values.norm(dim=-1)).mean().item()
        rows.append({"passes": p, "error": err, "to_least_squares": (S[0, 0] - S_ls).abs().max().item()})
    ls_err = ((keys @ S_ls - values).norm(dim=-1) / values.norm(dim=-1)).mean().item()
    return {"rows": rows, "least_squares_error": ls_err}
