"""``vecmerge search``: candidates that raise the target's loglik and keep every protected set, found and written."""

from __future__ import annotations

import click

from .app import Ctx, echo, global_options, handled, json_option, main, usage


def _pairs(values, flag: str) -> dict:
    """``NAME=VALUE`` flags as a mapping; a usage error for a malformed or repeated name."""
    out: dict = {}
    for v in values:
        name, eq, rest = v.partition("=")
        if not eq or not name.strip() or not rest.strip():
            usage(f"{flag} {v!r}: give NAME=PROMPTS")
        if name in out:
            usage(f"{flag} {name}: given twice; name each set once")
        out[name.strip()] = rest.strip()
    return out


def _margin(values):
    """``--margin M`` (one for all) or ``--margin NAME=M`` per protected set."""
    if len(values) == 1 and "=" not in values[0]:
        try:
            return float(values[0])
        except ValueError:
            usage(f"--margin {values[0]!r}: give a number (a loglik drop in nats, >= 0) or NAME=M")
    out = {}
    for name, text in _pairs(values, "--margin").items():
        try:
            out[name] = float(text)
        except ValueError:
            usage(f"--margin {name}={text!r}: give a number")
    return out


def _floats(text: str | None, flag: str):
    if text is None:
        return None
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        usage(f"{flag} {text!r}: give numbers separated by commas, e.g. 0,0.9,0.99")


@main.command()
@click.option("--base", required=True, help="The backbone expression (the adapter you step from).")
@click.option("--dir", "dirs", multiple=True, required=True,
              help="A direction expression (repeatable), e.g. 't0 - bb'.")
@click.option("--target", multiple=True, required=True, metavar="NAME=PROMPTS",
              help="The prompt set whose mean loglik change is maximised (probe's JSON Lines).")
@click.option("--protect", multiple=True, required=True, metavar="NAME=PROMPTS",
              help="A prompt set that must not regress (repeatable); also the protection's inputs.")
@click.option("--margin", multiple=True, required=True, metavar="M|NAME=M",
              help="The drop allowed per protected set (nats per item): its lower 95% bound >= -M.")
@click.option("--trust-max", type=float, required=True, help="The largest step, relative to the backbone's norm.")
@click.option("--budget", type=int, default=40, show_default=True, help="Candidates to evaluate.")
@click.option("--seed", type=int, default=0, show_default=True, help="The sampler's seed (same seed, same candidates).")
@click.option("--sampler", type=click.Choice(["auto", "grid", "tpe"]), default="auto", show_default=True,
              help="grid (no extra), tpe (optuna's constrained TPE; pip install 'vecmerge[search]'), auto: tpe if "
                   "installed.")
@click.option("--top", "top_k", type=int, default=3, show_default=True, help="Candidates written as PEFT LoRAs.")
@click.option("--depth", is_flag=True, help="Search a depth schedule too (a dose growing or shrinking with the layer).")
@click.option("--types", is_flag=True, help="Search the attention/MLP mix too.")
@click.option("--exclude-choice", "exclude", multiple=True, metavar="REGEX",
              help="Module patterns a candidate may leave out (repeatable; each a yes/no in the space).")
@click.option("--energies", help="Protection energies to search, 0 = none (default 0,0.5,0.9,0.99).")
@click.option("--base-model", type=click.Path(file_okay=False),
              help="The base model folder (default: the workspace's).")
@click.option("--batch", type=int, default=8, show_default=True, help="Items per forward pass.")
@click.option("--out-dir", required=True, type=click.Path(file_okay=False),
              help="Where search.json, front.png and top1..topK go.")
@click.option("--resume", is_flag=True, help="Continue a search the ledger holds (its evaluations are replayed).")
@click.option("--force", is_flag=True, help="Replace outputs vecmerge wrote.")
@json_option
@global_options
@click.pass_obj
@handled
def search(obj: Ctx, base, dirs, target, protect, margin, trust_max, budget, seed, sampler, top_k, depth, types,
           exclude, energies, base_model, batch, out_dir, resume, force, as_json):
    """Search steps from BASE along the directions that raise TARGET's loglik while every PROTECT set stays
    within its margin; write the top candidates.

    Each candidate (coefficients, trust, protection energy, optional depth schedule, attention/MLP mix,
    module exclusions) is the backbone plus exact factored terms, scored through probe's hooks with nothing
    written; every evaluation goes into the ledger under the candidate's recipe hash.
    """
    from .. import commands

    commands.search(obj.ws(), base=base, dirs=list(dirs), target=_pairs(target, "--target"),
                    protect=_pairs(protect, "--protect"), margin=_margin(margin), out_dir=out_dir,
                    trust_max=trust_max, budget=budget, seed=seed, sampler=sampler, top_k=top_k, depth=depth,
                    types=types, exclude=list(exclude), energies=_floats(energies, "--energies"),
                    base_model=base_model, batch=batch, resume=resume, force=force, as_json=as_json, echo=echo,
                    progress=obj.bars())
