"""Value-aware thinking (SAMem Table 2 analogue): wasted LLM activations vs useful recall.

Reproduce: ``thinkmem bench values --json bench_results/values.json --plot
bench_results/values.png`` (``--quick``: shorter streams, fewer epochs).

Setup per seed: the policy is the shipped ``models/default`` bundle (trained on ``mixed``
streams at 10 Hz; situations here are windows of its own K, a streaming bundle's replayed
from its reset state; the streams are fresh draws) when it loads, else a small
policy trained here (``bench_policy``); the JSON names which. A *learning* stream feeds the
value table online; a separate *test* stream is scored with the table frozen (greedy, no
learning). Situations are taken every 0.5 s. Situation keys join the policy embedding with
its activated labels (``ValueConfig.activation_weight`` = 1, see ``value.py``).

Reward model per (situation kind, label), fixed before any measurement. The kind of a
situation is its ground-truth label set G; an activated label g earns
  * +1.0 when g is in G and not redundant (essential thinking);
  * -0.1 (its token cost, nothing earned) when g is in G but *redundant* for the kind:
      trend when cause is in G (the cause analysis already covers the direction),
      trend when recovery_confirmation is in G,
      information_seeking when visibility_distance_check is in G (the joint check is the
      information to seek), vibration_load_comparison when hazard is in G (the hazard
      analysis covers it);
  * -0.3 when g is not in G (a spurious activation: tokens plus a misleading prompt);
plus N(0, 0.1) judgment noise. Useful thinking = G minus redundant labels.

Methods: ``policy_only`` (every activation kept), ``value_aware`` (value table with TD,
decayed epsilon-greedy while learning, forgetting), ablations ``no_q`` (no temporal-
difference learning: alpha = 1, gamma = 0, the value is the last reward seen), ``no_epsilon``
(eps0 = 0: greedy from the first step) and ``no_forgetting``. Each row reports
``useful_recall`` (useful thinking kept / useful thinking in the test stream),
``wasted_per_1000`` (kept activations earning <= 0 per 1000 situations), ``table_entries``
(valued entries in the table), ``activation_f1`` (kept vs useful), ``archived``.
Targets: value_aware cuts wasted >= 50 % at equal or better useful recall than policy_only;
no_forgetting has more table entries at no better activation F1.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from thinkmem_ros.bench.common import bench_progress, mean_std
from thinkmem_ros.core.metrics import micro_scores
from thinkmem_ros.core.vocabulary import THINKING
from thinkmem_ros.policy.value_table import ValueConfig, ValueTable

SIZES = {
    "full": {"train_s": 1800.0, "learn_s": 1800.0, "test_s": 900.0, "epochs": 20},
    "quick": {"train_s": 600.0, "learn_s": 900.0, "test_s": 450.0, "epochs": 8},
    "tiny": {"train_s": 60.0, "learn_s": 60.0, "test_s": 40.0, "epochs": 1},
}
RATE_HZ = 10.0
WINDOW = 32
STRIDE = 5
SEED_BASE = 7000
REDUNDANT: tuple[tuple[str, str], ...] = (
    ("trend", "cause"), ("trend", "recovery_confirmation"),
    ("information_seeking", "visibility_distance_check"),
    ("vibration_load_comparison", "hazard"))
"""(label, when this label is also needed): the label earns nothing in that kind."""
REWARD_ESSENTIAL, REWARD_REDUNDANT, REWARD_SPURIOUS, REWARD_NOISE = 1.0, -0.1, -0.3, 0.1
METHODS = ("policy_only", "value_aware", "no_q", "no_epsilon", "no_forgetting")


def useful_matrix(truth: np.ndarray, labels: list[str]) -> np.ndarray:
    """Boolean (n, L) useful thinking: ground truth minus the redundant labels."""
    col = {name: i for i, name in enumerate(labels)}
    useful = truth > 0.5
    for label, when in REDUNDANT:
        if label in col and when in col:
            useful[:, col[label]] &= ~(truth[:, col[when]] > 0.5)
    return useful


def reward(truth_row: np.ndarray, useful_row: np.ndarray, g: int,
           rng: np.random.Generator) -> float:
    """Reward of activating column g in a situation (module docstring table)."""
    if useful_row[g]:
        base = REWARD_ESSENTIAL
    elif truth_row[g] > 0.5:
        base = REWARD_REDUNDANT
    else:
        base = REWARD_SPURIOUS
    return float(base + REWARD_NOISE * rng.normal())


def bench_policy(seed: int, size: dict, folder: Path):
    """Train a small policy on mixed streams and export it; returns a PolicyRuntime."""
    import torch

    from thinkmem_ros.core.data import SituationSet
    from thinkmem_ros.policy.runtime import PolicyRuntime
    from thinkmem_ros.policy.training.export import export_bundle
    from thinkmem_ros.policy.training.train import train_policy
    from thinkmem_ros.world.streams import generate_stream, stream_windows

    torch.set_num_threads(1)
    rng = np.random.default_rng(SEED_BASE + seed)
    parts = [stream_windows(generate_stream("mixed", size["train_s"] / 3, RATE_HZ, rng),
                            WINDOW, stride=2) for _ in range(3)]
    data = SituationSet.concat(parts)
    trained = train_policy(data, "default", seed=seed, epochs=size["epochs"], progress=False)
    export_bundle(trained, folder, model_version=1, frame_rate_hz=RATE_HZ)
    return PolicyRuntime(folder)


def bench_or_default_policy(seed: int, size: dict, folder: Path, use_default: bool):
    """Return the default bundle's runtime when asked and loadable, else a fresh policy."""
    if use_default:
        from thinkmem_ros.core.paths import default_bundle
        from thinkmem_ros.policy.bundle import BundleError
        from thinkmem_ros.policy.runtime import PolicyRuntime
        try:
            runtime = PolicyRuntime(default_bundle())
            if runtime.manifest.frame_rate_hz == RATE_HZ:  # situations use its own K
                return runtime, f"models/default v{runtime.manifest.model_version} " \
                    f"sha256 {runtime.manifest.sha256[:12]}"
        except (BundleError, OSError):
            pass
    return bench_policy(seed, size, folder), "trained here (bench.values.bench_policy)"


def stream_situations(runtime, duration_s: float, rng: np.random.Generator):
    """Windows every STRIDE frames of a fresh mixed stream, with policy output."""
    from thinkmem_ros.world.streams import generate_stream, stream_windows

    stream = generate_stream("mixed", duration_s, RATE_HZ, rng)
    windows = stream_windows(stream, runtime.window, stride=STRIDE,
                             max_events=runtime.max_events)
    pred = runtime.predict(windows.signals, windows.mask, windows.events)
    return stream, windows, pred


ACTIVATION_WEIGHT = 1.0


def _config(method: str, horizon: int) -> ValueConfig:
    base = {"horizon": max(horizon, 1), "activation_weight": ACTIVATION_WEIGHT}
    if method == "no_q":
        base.update(alpha=1.0, gamma=0.0)
    elif method == "no_epsilon":
        base.update(eps0=0.0)
    elif method == "no_forgetting":
        base.update(forgetting=False)
    return ValueConfig(**base)


def learn_table(method: str, labels: list[str], pred, truth: np.ndarray,
                rng: np.random.Generator) -> ValueTable:
    """Online learning over a stream: explore/rerank, observe rewards of kept thinking, TD."""
    n = len(pred.active)
    table = ValueTable(labels, pred.embedding.shape[1], _config(method, n))
    useful = useful_matrix(truth, labels)
    col = {name: i for i, name in enumerate(labels)}
    clusters = [-1] * n
    pending: list[tuple[int, str, float]] = []
    for t in range(n):
        clusters[t] = table.assign(pred.embedding[t], pred.active[t])
        for s_prev, label, r in pending:  # TD with the successor now known
            table.update(s_prev, label, r, clusters[t])
        kept, _ = table.explore(pred.embedding[t], pred.active[t], t, rng)
        pending = [(clusters[t], label, reward(truth[t], useful[t], col[label], rng))
                   for label in kept]
    for s_prev, label, r in pending:
        table.update(s_prev, label, r, None)
    return table


def score(kept: list[list[str]], truth: np.ndarray, labels: list[str]) -> dict[str, float]:
    """useful_recall, wasted_per_1000 and activation F1 of kept activations."""
    col = {name: i for i, name in enumerate(labels)}
    predicted = np.zeros(truth.shape, dtype=bool)
    for row, names in enumerate(kept):
        predicted[row, [col[n] for n in names]] = True
    useful = useful_matrix(truth, labels)
    n = truth.shape[0]
    return {"useful_recall": float((predicted & useful).sum() / max(useful.sum(), 1)),
            "wasted_per_1000": float((predicted & ~useful).sum() * 1000.0 / n),
            "activation_f1": micro_scores(useful, predicted)["f1"]}


def run_seed(seed: int, size: dict, progress=None,
             use_default: bool = True) -> tuple[dict[str, dict[str, float]], str]:
    """All methods on one seed's policy, learning stream and test stream."""
    rng = np.random.default_rng(SEED_BASE + 100 + seed)
    with tempfile.TemporaryDirectory() as tmp:
        runtime, policy_name = bench_or_default_policy(seed, size, Path(tmp) / "bundle",
                                                       use_default)
        labels = runtime.labels
        _, learn_w, learn_p = stream_situations(runtime, size["learn_s"], rng)
        _, test_w, test_p = stream_situations(runtime, size["test_s"], rng)
    out = {"policy_only": {**score(test_p.active, test_w.labels, labels), "table_entries": 0,
                           "archived": 0}}
    for method in METHODS[1:]:
        table = learn_table(method, labels, learn_p, learn_w.labels,
                            np.random.default_rng(SEED_BASE + 200 + seed))
        kept = [table.rerank(e, a).kept
                for e, a in zip(test_p.embedding, test_p.active, strict=True)]
        out[method] = {**score(kept, test_w.labels, labels), "table_entries": table.entries,
                       "archived": int(table.archived.sum()), "clusters": table.n_clusters}
        if progress:
            progress()
    return out, policy_name


def run(quick: bool, seeds: int, size: str | None = None, use_default: bool = True) -> dict:
    """Every method over ``seeds`` seeds; rows hold mean/std of each metric."""
    cfg = SIZES[size or ("quick" if quick else "full")]
    rows: dict[str, list[dict]] = {m: [] for m in METHODS}
    policies = set()
    with bench_progress() as bar:
        task = bar.add_task("values", total=seeds * (len(METHODS) - 1))
        for seed in range(seeds):
            res, policy_name = run_seed(seed, cfg, lambda: bar.update(task, advance=1),
                                        use_default)
            policies.add(policy_name)
            for method, row in res.items():
                rows[method].append(row)
            bar.update(task, description=f"values seed {seed}: wasted "
                       f"{res['policy_only']['wasted_per_1000']:.0f} -> "
                       f"{res['value_aware']['wasted_per_1000']:.0f} /1000")
    results = {m: {k: mean_std([r[k] for r in rows[m]]) for k in rows[m][0]} for m in METHODS}
    base, va = results["policy_only"], results["value_aware"]
    cut = 1.0 - va["wasted_per_1000"]["mean"] / max(base["wasted_per_1000"]["mean"], 1e-9)
    nf = results["no_forgetting"]
    return {"experiment": "values", "metric": "wasted_per_1000", "results": results,
            "summary": {
                "wasted_cut": cut,
                "recall_delta": va["useful_recall"]["mean"] - base["useful_recall"]["mean"],
                "target_wasted_cut_met": bool(cut >= 0.5 and va["useful_recall"]["mean"]
                                              >= base["useful_recall"]["mean"] - 1e-9),
                "forgetting_table_shrink": nf["table_entries"]["mean"]
                - va["table_entries"]["mean"],
                "forgetting_f1_delta": va["activation_f1"]["mean"] - nf["activation_f1"]["mean"],
            },
            "reward_model": {"essential": REWARD_ESSENTIAL, "redundant": REWARD_REDUNDANT,
                             "spurious": REWARD_SPURIOUS, "noise_std": REWARD_NOISE,
                             "redundant_when": [list(p) for p in REDUNDANT]},
            "labels": list(THINKING), "policy": sorted(policies),
            "value_config": {"theta": ValueConfig.theta, "activation_weight": ACTIVATION_WEIGHT,
                             "min_visits": ValueConfig.min_visits, "z": ValueConfig.z}}


def plot(report: dict, path) -> None:
    """Bars of useful recall, wasted per 1000 and table entries per method."""
    from thinkmem_ros.bench.plots import new_figure, save

    fig, axes = new_figure(3, "Value-aware thinking (SAMem Table 2 analogue)")
    res = report["results"]
    methods = [m for m in METHODS if m in res]
    keys = ("useful_recall", "wasted_per_1000", "table_entries")
    for ax, key in zip(np.ravel(axes), keys, strict=True):
        means = [res[m][key]["mean"] for m in methods]
        stds = [res[m][key]["std"] for m in methods]
        ax.bar(range(len(methods)), means, yerr=stds, color="tab:blue")
        ax.set_xticks(range(len(methods)), methods, rotation=30, ha="right")
        ax.set_title(key)
    save(fig, path)
