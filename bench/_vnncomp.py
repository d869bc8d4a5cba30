"""bench_verify.py's VNN-COMP mode: benchmark folders (an instances.csv
with ONNX networks and VNN-LIB specs beside it) through cypool.verify and
auto_LiRPA's CROWN, on the same thread count, interleaved per instance.

* ``cypool check``: ``cypool.verify.check``, the whole verdict (the
  centre, the bounds, the attack on what they leave open), float64,
  rounding charged.
* ``cypool bounds``: its bounds alone (what CROWN's column measures), and
  in parentheses without the rounding charge: what soundness costs.
* ``CROWN``: auto_LiRPA's ``compute_bounds(method="CROWN")`` on a
  ``torch.nn.Sequential`` built from the same network, float64, the
  specification's rows as its C matrix; a property is proved where every
  disjunct has a row whose lower bound is above its threshold. Its
  BoundedModule is built once per network, outside the timing.
* ``alpha-CROWN``: the same with ``method="CROWN-Optimized"`` (the ReLUs'
  lower slopes optimised, 20 iterations), the bound engine alpha-beta-
  CROWN runs before it branches: what a stronger relaxation proves, and
  at what cost; in a pass of its own after the others. In float32:
  auto_LiRPA 0.7.1's optimised bounds fail in float64 (a float32 buffer
  meets float64 bounds in _update_best_ret).

Every cypool "holds" is attacked again (PGD, 200 steps from 64 points) and
sampled (2,000 points): a counterexample there is printed as an error.
"""
from __future__ import annotations

import os
import statistics
import time
import warnings

import numpy as np

from cypool import verify
from cypool.verify.__main__ import read_instances
from cypool.verify._crown import bounds, output_lower
from cypool.verify._net import Conv, Dense, Reshape, ReLU

from _harness import optional, torch

auto_lirpa = optional("auto_LiRPA")


def to_torch(net):
    """net as a float64 torch.nn.Sequential (None where an op has no plain
    torch layer)."""
    nn = torch.nn
    mods = []
    for op in net.ops:
        if isinstance(op, Dense):
            m = nn.Linear(op.W.shape[1], op.W.shape[0]).double()
            m.weight.data, m.bias.data = torch.from_numpy(op.W.astype(np.float64)), \
                torch.from_numpy(op.bias.astype(np.float64))
        elif isinstance(op, Conv):
            O, C, kh, kw = op.w.shape
            if any(sum(e) for e in op.extra) or not (op.bias == op.bias[:, :1, :1]).all():
                return None
            m = nn.Conv2d(C, O, (kh, kw), op.stride, op.sym, op.dilation).double()
            m.weight.data = torch.from_numpy(op.w.astype(np.float64))
            m.bias.data = torch.from_numpy(op.bias[:, 0, 0].astype(np.float64))
        elif isinstance(op, ReLU):
            m = nn.ReLU()
        elif isinstance(op, Reshape) and len(op.out_shape) == 1:
            m = nn.Flatten()
        else:
            return None
        mods.append(m)
    return nn.Sequential(*mods).eval()


ALPHA_ITERATIONS = 20


def crown_runner(net, alpha=False):
    """f(spec) -> proved, for auto_LiRPA's CROWN on net (alpha: its
    alpha-CROWN, float32); None if unavailable."""
    if auto_lirpa is None or torch is None:
        return None
    model = to_torch(net)
    if model is None:
        return None
    from auto_LiRPA import BoundedModule, BoundedTensor
    from auto_LiRPA.perturbations import PerturbationLpNorm

    dt = torch.float32 if alpha else torch.float64
    opts = {"optimize_bound_args": {"iteration": ALPHA_ITERATIONS}, "verbosity": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bm = BoundedModule(model.to(dt), torch.zeros((1,) + net.input_shape, dtype=dt), device="cpu",
                           bound_opts=opts if alpha else None)

    def run(spec):
        C = np.concatenate([A for A, _ in spec.disjuncts])
        lo = torch.from_numpy(spec.lower.reshape((1,) + net.input_shape)).to(dt)
        hi = torch.from_numpy(spec.upper.reshape((1,) + net.input_shape)).to(dt)
        x = BoundedTensor((lo + hi) / 2, PerturbationLpNorm(x_L=lo, x_U=hi))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lb, _ = bm.compute_bounds(x=(x,), C=torch.from_numpy(C).to(dt)[None],
                                      method="CROWN-Optimized" if alpha else "CROWN", bound_upper=False)
        lb = lb[0].detach().numpy()
        k, proved = 0, True
        for A, b in spec.disjuncts:
            proved &= bool((lb[k:k + len(A)] > b).any())
            k += len(A)
        return proved
    return run


def cypool_bounds(net, spec, charge=True):
    """Whether cypool's bounds alone prove spec (float64; rounding charged
    unless charge is False)."""
    _, relax, charge = bounds(net, spec.lower, spec.upper, charge=charge)
    C = np.concatenate([A for A, _ in spec.disjuncts])
    lb = output_lower(net, relax, charge, C, spec.lower, spec.upper)
    k, proved = 0, True
    for A, b in spec.disjuncts:
        proved &= bool((lb[k:k + len(A)] > b).any())
        k += len(A)
    return proved


PAUSE = 0.2  # between two peers: longer than numpy BLAS's 0.1 s of spinning after a product


def _timed(f, *args):
    time.sleep(PAUSE)
    t = time.perf_counter()
    out = f(*args)
    return out, time.perf_counter() - t


def run_folder(folder, threads, limit=None):
    """Every instance of folder's instances.csv through each peer; returns
    the folder's row for the table, and prints any unsound verdict."""
    rows = read_instances(os.path.join(folder, "instances.csv"))[:limit]
    nets, crowns, alphas = {}, {}, {}
    counts = {"holds": 0, "violated": 0, "unknown": 0}
    t_check, t_bounds, t_uncharged, t_crown, t_alpha = [], [], [], [], []
    crown_proved, alpha_proved, bounds_proved, uncharged_proved, errors = 0, 0, 0, 0, 0
    for net_path, spec_path, _ in rows:
        if net_path not in nets:
            nets[net_path] = verify.load_onnx(net_path).with_threads(threads)
            crowns[net_path] = crown_runner(nets[net_path])
            alphas[net_path] = crown_runner(nets[net_path], alpha=True)
            spec0 = verify.read_vnnlib(spec_path)
            for s in (spec0 if isinstance(spec0, list) else [spec0]):  # first calls: plans, imports
                verify.check(nets[net_path], s)
                for peer in (crowns[net_path], alphas[net_path]):
                    if peer is not None:
                        peer(s)
        net, crown = nets[net_path], crowns[net_path]
        spec = verify.read_vnnlib(spec_path)
        res, t = _timed(verify.check, net, spec)
        counts[res.status] += 1
        t_check.append(t)
        specs = spec if isinstance(spec, list) else [spec]
        ok, t = _timed(lambda: all(cypool_bounds(net, s) for s in specs))
        bounds_proved += ok
        t_bounds.append(t)
        ok, t = _timed(lambda: all(cypool_bounds(net, s, charge=False) for s in specs))
        uncharged_proved += ok
        t_uncharged.append(t)
        if crown is not None:
            ok, t = _timed(lambda: all(crown(s) for s in specs))
            crown_proved += ok
            t_crown.append(t)
        if res.status == "holds":
            for s in specs:
                rng = np.random.default_rng(0)
                X = rng.uniform(s.lower, s.upper, (2000, s.n_inputs))
                bad = verify.attack(net, s, steps=200, points=64, seed=1) is not None or any(
                    s.is_counterexample(y) for y in net.forward(X))
                if bad:
                    errors += 1
                    print(f"ERROR: holds, but a counterexample exists: {spec_path}")
    # alpha-CROWN in a pass of its own: interleaved, its second of torch work
    # an instance changed the others' times (CROWN's on mnistfc 9-12 ms, not 14-17)
    for net_path, spec_path, _ in rows:
        alpha = alphas[net_path]
        if alpha is not None:
            spec = verify.read_vnnlib(spec_path)
            ok, t = _timed(lambda: all(alpha(s) for s in (spec if isinstance(spec, list) else [spec])))
            alpha_proved += ok
            t_alpha.append(t)
    return dict(folder=os.path.basename(os.path.normpath(folder)), n=len(rows), counts=counts,
                bounds_proved=bounds_proved, uncharged_proved=uncharged_proved,
                crown_proved=crown_proved if t_crown else None,
                alpha_proved=alpha_proved if t_alpha else None, t_check=t_check, t_bounds=t_bounds,
                t_uncharged=t_uncharged, t_crown=t_crown, t_alpha=t_alpha, errors=errors)


def table(results) -> str:
    def ms(ts):
        return f"{statistics.median(ts) * 1e3:.2f} / {max(ts) * 1e3:.1f}" if ts else "n/a"

    def ratio(a, b):
        return f"{statistics.median(a) / statistics.median(b):.2f}x" if a and b else "n/a"

    def proved(n):
        return "n/a" if n is None else n

    lines = ["| folder (instances) | cypool holds / violated / unknown | proved by cypool's bounds "
             "(uncharged) | by CROWN | by alpha-CROWN | cypool check ms (median / worst) | cypool bounds ms "
             "(uncharged) | CROWN ms | alpha-CROWN ms | CROWN / cypool check | CROWN / cypool bounds |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        c = r["counts"]
        lines.append(
            f"| {r['folder']} ({r['n']}) | {c['holds']} / {c['violated']} / {c['unknown']} | "
            f"{r['bounds_proved']} ({r['uncharged_proved']}) | {proved(r['crown_proved'])} | "
            f"{proved(r['alpha_proved'])} | "
            f"{ms(r['t_check'])} | {ms(r['t_bounds'])} ({statistics.median(r['t_uncharged']) * 1e3:.2f}) | "
            f"{ms(r['t_crown'])} | {ms(r['t_alpha'])} | {ratio(r['t_crown'], r['t_check'])} | "
            f"{ratio(r['t_crown'], r['t_bounds'])} |")
    return "\n".join(lines)


def main(folders, threads, limit=None):
    print("CROWN (auto_LiRPA):", "measured" if auto_lirpa is not None and torch is not None else
          "not installed (see bench/README.md), not measured")
    results = []
    for folder in folders:
        if not os.path.isfile(os.path.join(folder, "instances.csv")):
            print(f"{folder}: no instances.csv, skipped")
            continue
        r = run_folder(folder, threads, limit)
        results.append(r)
        print(f"{r['folder']}: done", flush=True)
    print()
    print(f"### VNN-COMP instances, {threads} thread(s) each, float64 (alpha-CROWN float32)")
    print()
    print(table(results))
    return sum(r["errors"] for r in results)
