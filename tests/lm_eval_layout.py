"""An lm-eval 0.4 output tree written the way ``lm_eval --output_path out --log_samples`` writes it.

``out/<model_name_sanitized>/results_<STAMP>.json`` and ``samples_<TASK>_<STAMP>.jsonl`` per run, STAMP
``datetime.now().isoformat().replace(":", "-")``; the results file holds ``results`` (each task and the
group, the group first, subtasks aliased `` - name``), ``groups``, ``group_subtasks`` (leaf tasks listed
with ``[]``), ``configs``, ``versions``, ``n-shot``, ``higher_is_better``, ``n-samples``, ``config``
(``model_args`` as lm-eval's string), ``task_hashes``, ``model_name`` and the version fields; each samples
line ``doc_id``, ``doc``, ``target``, ``filter``, ``metrics`` and one value per metric. The layout follows the
real 0.4.13 files in ``tests/fixtures/lm_eval`` (one task each) and lm-eval's group output.

The group ``facts`` has three subtasks of 40 documents (120 items); every score is 0 or 1 (``acc``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

TASKS = ("facts_place", "facts_time", "facts_who")
DOCS = 40


def scores(seed: int, p: float) -> dict[str, list[int]]:
    """Per task, one 0/1 score per document, seeded."""
    rng = np.random.default_rng(seed)
    return {t: [int(x) for x in rng.random(DOCS) < p] for t in TASKS}


def flipped_pair(seed: int = 5) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """v54's per-document scores, and v60's: v54's with a seeded set of documents flipped (mostly 1 -> 0)."""
    v54 = scores(seed, 0.8)
    rng = np.random.default_rng(seed + 1)
    v60 = {t: [(1 - x) if (x == 1 and rng.random() < 0.35) or (x == 0 and rng.random() < 0.15) else x
               for x in xs] for t, xs in v54.items()}
    return v54, v60


def _mean_se(xs) -> tuple[float, float]:
    n = len(xs)
    m = sum(xs) / n
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1) / n)


def write_run(out: Path, model: str, stamp: str, per_task: dict[str, list[int]], *, seed: int = 0) -> Path:
    """One run's results and samples files under ``out/<model>/``; returns the results file."""
    folder = out / model
    folder.mkdir(parents=True, exist_ok=True)
    every = [x for t in TASKS for x in per_task[t]]
    g_mean, g_se = _mean_se(every)
    results = {"facts": {"acc,none": g_mean, "acc_stderr,none": g_se, "alias": "facts"}}
    for t in TASKS:
        m, se = _mean_se(per_task[t])
        results[t] = {"alias": f" - {t}", "acc,none": m, "acc_stderr,none": se}
    data = {
        "results": results,
        "groups": {"facts": dict(results["facts"])},
        "group_subtasks": {"facts": list(TASKS), **{t: [] for t in TASKS}},
        "configs": {t: {"task": t, "tag": "facts", "dataset_path": "json", "output_type": "multiple_choice",
                        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
                        "num_fewshot": 0} for t in TASKS},
        "versions": {"facts": 1.0, **{t: 1.0 for t in TASKS}},
        "n-shot": {t: 0 for t in TASKS},
        "higher_is_better": {"facts": {"acc": True}, **{t: {"acc": True} for t in TASKS}},
        "n-samples": {t: {"original": DOCS, "effective": DOCS} for t in TASKS},
        "config": {"model": "hf", "model_args": f"pretrained=base,peft={model},dtype=float32", "batch_size": "4",
                   "batch_sizes": [], "device": "cpu", "limit": None, "bootstrap_iters": 100000, "gen_kwargs": None,
                   "random_seed": seed, "numpy_seed": 1234, "torch_seed": 1234, "fewshot_seed": 1234},
        "git_hash": "8f1e3c2", "date": 1733400000.0, "transformers_version": "4.46.3", "lm_eval_version": "0.4.5",
        "task_hashes": {t: f"{i + 1:064x}" for i, t in enumerate(TASKS)},
        "model_source": "hf", "model_name": "base", "model_name_sanitized": model,
        "system_instruction": None, "system_instruction_sha": None, "fewshot_as_multiturn": False,
        "chat_template": None, "chat_template_sha": None, "total_evaluation_time_seconds": "12.5",
    }
    path = folder / f"results_{stamp}.json"
    path.write_text(json.dumps(data, indent=2))
    for t in TASKS:
        lines = [json.dumps({"doc_id": i, "doc": {"question": f"{t} q{i}", "choices": ["a", "b"], "gold": 0},
                             "target": "0", "arguments": {}, "resps": [], "filtered_resps": [], "filter": "none",
                             "metrics": ["acc"], "doc_hash": f"{i:064x}", "prompt_hash": f"{i + 7:064x}",
                             "target_hash": f"{0:064x}", "acc": float(x)})
                 for i, x in enumerate(per_task[t])]
        (folder / f"samples_{t}_{stamp}.jsonl").write_text("\n".join(lines) + "\n")
    return path
