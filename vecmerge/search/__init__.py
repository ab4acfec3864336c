"""Constrained search (DESIGN.md section 9): candidates that raise a target sub-score and keep the protected ones.

    space.py      the space, a candidate's parameters, its ``project`` recipe and recipe hash
    candidate.py  a candidate's update as exact concatenated factors for probe's hooks (nothing written)
    evaluate.py   forward passes, the paired per-item changes, the objective and the constraints, the ledger
    optimize.py   the samplers (a seeded grid; optuna's constrained TPE when installed) and the loop
    front.py      the feasible candidates' Pareto front and the top K
    engine.py     a search from start to finish (the ledger is the only thing it writes)
"""
