"""Train the toy trajectories v28, v51, v54e2 and v54 on a tiny random Qwen3 (CPU, no hub).

    python examples/make_trajectories.py --out toy

writes toy/base, toy/{v28,v51,v54e2,v54} and the manifest toy/vecmerge.yaml, ready for
surgery such as v58 = v54 + alpha * (v51 - v28).
"""

import argparse

from vecmerge import make_trajectories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="toy", help="folder to write (default: toy)")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights, data and inits (default: 0)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (default: 2)")
    parser.add_argument("--steps", type=int, default=60, help="training steps of v28 (default: 60)")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank (default: 8)")
    args = parser.parse_args()
    try:
        paths = make_trajectories(
            args.out, seed=args.seed, layers=args.layers, steps=args.steps, rank=args.rank, progress=True
        )
    except ValueError as err:
        parser.error(str(err))
    for name, path in paths.items():
        print(f"{name:6} {path}")
    print(f"manifest {paths['base'].parent / 'vecmerge.yaml'}")


if __name__ == "__main__":
    main()
