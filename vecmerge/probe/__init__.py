"""Function-space evidence vecmerge makes itself: checkpoints teacher-forced on a pinned prompt file.

    prompts.py   the prompt file (JSON Lines: id, prompt or prompt_ids, target or target_ids, task, cluster), bounded,
                 tokenized with the base folder's tokenizer, hashed
    hooks.py     an adapter's exact update ``s * B @ A`` on a loaded base as forward hooks (the weights never written)
    scores.py    per item: loglik, tokens, exact, first_rank; per pair: KL both ways and JS at the target positions
    summary.py   a model's means over items and tasks; a pair's means over items
    space.py     log-likelihood vectors: distances, a 2-D map, the items the models disagree on most
    records.py   metric names, ledger records tied to the adapter's and the prompt file's sha256, the cache
    runner.py    ``run_probe``: what is missing, the batches, the forward passes, the records

transformers is imported only where the base model and its tokenizer are loaded.
"""
