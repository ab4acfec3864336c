"""The ``vecmerge`` command: flags in, ``commands`` called, one ``error:`` line out when something is wrong.

Flags build the same Recipe a YAML file does; choices and method options come from ``options`` and
the method registry, so nothing is spelled twice. Errors print one ``error: ...`` line to stderr
(``--debug`` shows the traceback); exit 2 for bad input or usage, 1 for a check that failed, 0
otherwise. Heavy imports (torch) happen inside commands, so ``vecmerge --help`` stays fast.
"""

from __future__ import annotations

import functools
import os
import sys

import click

from . import __version__, methods
from .options import (
    AUDIT_SORT_HELP,
    AUDIT_SORTS,
    AUDIT_VIEW_HELP,
    AUDIT_VIEWS,
    DTYPE_HELP,
    DTYPE_NAMES,
    EXTRACT_OTHERS,
    EXTRACT_OTHERS_HELP,
    EXTRACT_RANK_HELP,
    EXTRACT_TARGETS_HELP,
    FUSE_DTYPE_HELP,
    KEEP_BASE_HELP,
    MODULES_TO_SAVE,
    MODULES_TO_SAVE_HELP,
    ON_DISAGREE,
    ON_DISAGREE_HELP,
    RANK_HELP,
    REPORT_FORMATS,
    SCOPE_HELP,
    SCOPES,
)


class Ctx:
    """Global options, and the workspace and progress bars they imply."""

    def __init__(self, workspace, debug, quiet, device):
        self.workspace, self.debug, self.quiet, self.device = workspace, debug, quiet, device

    def ws(self):
        from .lowrank import resolve_device
        from .workspace import Workspace

        return Workspace(self.workspace, device=resolve_device(self.device))

    def progress(self, desc: str):
        """A tqdm wrapper on stderr, only for a terminal and without --quiet."""
        if self.quiet or not sys.stderr.isatty():
            return None
        from tqdm import tqdm

        return functools.partial(tqdm, desc=desc, file=sys.stderr, leave=False, unit="module")

    def bars(self):
        """``progress`` when bars are wanted, else None (what ``commands`` take)."""
        return None if self.quiet or not sys.stderr.isatty() else self.progress


def handled(fn):
    """Turn VecmergeError into one ``error:`` line and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        ctx = click.get_current_context()
        obj: Ctx = ctx.obj
        try:
            return fn(*args, **kwargs)
        except click.exceptions.Exit:
            raise
        except Exception as e:
            from .errors import VecmergeError

            if obj.debug:
                raise
            if isinstance(e, VecmergeError):
                msg = str(e)
                code = e.exit_code
            elif isinstance(e, MemoryError) or "allocate memory" in str(e) or "DefaultCPUAllocator" in str(e):
                msg, code = ("out of memory: vecmerge holds every input's factors and the output in memory; "
                             "free memory or merge fewer adapters at once"), 2
            elif isinstance(e, OSError):
                msg, code = f"{type(e).__name__}: {e}", 2
            else:
                msg, code = f"internal error ({type(e).__name__}: {e}); rerun with --debug and report it", 3
            click.echo(f"error: {msg}", err=True)
            ctx.exit(code)

    return wrapper


def _echo(text: str, err: bool = False) -> None:
    click.echo(text, err=err)


def _usage(msg: str):
    from .errors import UsageError

    raise UsageError(msg)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vecmerge")
@click.option("--workspace", type=click.Path(dir_okay=False), default=None,
              help="Workspace file naming adapters (default: ./vecmerge.yaml if present).")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
@click.option("--device", default="cpu", show_default=True, help="Device for the factored kernels (cpu, cuda).")
@click.pass_context
def main(ctx, workspace, debug, quiet, device):
    """Surgery on LoRA adapters: exact factored algebra, audits, trust-region steps, verified PEFT output."""
    # Small LAPACK calls are far slower multi-threaded (see kernels.py); torch is not imported yet.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    ctx.obj = Ctx(workspace, debug, quiet, device)


@main.command()
@click.argument("adapters", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
@handled
def inspect(obj: Ctx, adapters, as_json):
    """Config, scale rule, ranks, dtype, norms and sha256 of each ADAPTER (name or folder)."""
    from . import commands

    commands.inspect(obj.ws(), list(adapters), as_json=as_json, echo=_echo, progress=obj.bars())


@main.command()
@click.argument("adapters", nargs=-1)
@click.option("--ref", help="Reference trajectory expression, e.g. 'v54 - v54e2'.")
@click.option("--dir", "direction", help="Direction expression, e.g. 'v51 - v28'.")
@click.option("--by", type=click.Choice(AUDIT_VIEWS), default="module", show_default=True, help=AUDIT_VIEW_HELP)
@click.option("--sort", type=click.Choice(AUDIT_SORTS), default="module", show_default=True, help=AUDIT_SORT_HELP)
@click.option("--format", "fmt", type=click.Choice(REPORT_FORMATS), default="table", show_default=True)
@click.option("--plot", type=click.Path(dir_okay=False), help="Write a cosine heatmap PNG (needs matplotlib).")
@click.option("--allow-missing", is_flag=True, help="Treat modules missing from an adapter as zero.")
@click.option("--samples", type=int, default=200, show_default=True, help="Random rotations for the chance band.")
@click.pass_obj
@handled
def audit(obj: Ctx, adapters, ref, direction, by, sort, fmt, plot, allow_missing, samples):
    """Per-module sign consensus and cosine: --ref EXPR --dir EXPR, or pairwise over ADAPTERS."""
    if (ref is None) != (direction is None):
        given, lacking = ("--ref", "--dir") if ref is not None else ("--dir", "--ref")
        _usage(f"audit: {given} needs {lacking} too; e.g. --ref 'v54 - v54e2' --dir 'v51 - v28'")
    if ref is not None and adapters:
        _usage("audit: give either --ref/--dir or ADAPTERS for a pairwise matrix, not both")
    if ref is None and len(adapters) < 2:
        what = f"only one adapter ({adapters[0]})" if adapters else "nothing to audit"
        _usage(f"audit: {what}; pass --ref EXPR --dir EXPR, or two or more ADAPTERS to compare")
    if samples < 0:
        _usage(f"--samples {samples}: give 0 (analytic band) or a positive number of draws")
    from . import commands

    commands.audit(obj.ws(), ref=ref, direction=direction, adapters=adapters, by=by, sort=sort, fmt=fmt, plot=plot,
                   allow_missing=allow_missing, samples=samples, echo=_echo, progress=obj.bars())


def _merge_options(keep_base: bool):
    def deco(fn):
        opts = [
            click.option("--rank", default="exact", show_default=True,
                         help=RANK_HELP + (KEEP_BASE_HELP if keep_base else "") + "."),
            click.option("--dtype", type=click.Choice(DTYPE_NAMES), default="fp32", show_default=True,
                         help=DTYPE_HELP + "."),
            click.option("--out", type=click.Path(file_okay=False), help="Output adapter folder."),
            click.option("--force", is_flag=True, help="Replace an existing --out."),
            click.option("--allow-missing", is_flag=True, help="Treat modules missing from an adapter as zero."),
            click.option("--modules-to-save", type=click.Choice(MODULES_TO_SAVE), default="refuse", show_default=True,
                         help=MODULES_TO_SAVE_HELP + "."),
            click.option("--dry-run", is_flag=True, help="Print the plan and report; write nothing."),
            click.option("--json", "as_json", is_flag=True, help="Machine-readable report."),
            click.option("--modules", "show_modules", is_flag=True, help="Also print the per-module table."),
        ]
        for o in reversed(opts):
            fn = o(fn)
        return fn

    return deco


def _method_options(stepped: bool):
    """Click options for the fields of every registered method of this kind (generated, not typed twice)."""
    def deco(fn):
        seen = {}
        for m in methods.names(stepped=stepped):
            for f in methods.get(m).fields:
                seen.setdefault(f.name, (f, []))[1].append(m)
        for f, owners in reversed(list(seen.values())):
            kind = click.Choice(f.choices) if f.choices else {"float": float, "int": int, "str": str}.get(f.kind)
            fn = click.option(f.flag, f.name, type=kind, default=None, is_flag=f.kind == "bool" or None,
                              help=f"{f.help} ({', '.join(owners)}).")(fn)
        return fn

    return deco


def _method_help(stepped: bool) -> str:
    return "; ".join(f"{m}: {methods.get(m).summary}" for m in methods.names(stepped=stepped))


def _run_recipe(obj: Ctx, data: dict, *, force, dry_run, as_json, show_modules, source="options"):
    from . import commands
    from .recipe import Recipe

    recipe = Recipe.from_dict({k: v for k, v in data.items() if v is not None}, source)
    commands.merge(obj.ws(), recipe, force=force, dry_run=dry_run, as_json=as_json, show_modules=show_modules,
                   echo=_echo, progress=obj.bars())


@main.command()
@click.option("--base", required=True, help="Backbone expression, e.g. v54.")
@click.option("--dir", "direction", required=True, help="Direction expression, e.g. 'v51 - v28'.")
@click.option("--trust", type=float, help="Relative step T: alpha = T*||base||/||dir||.")
@click.option("--trust-scope", type=click.Choice(SCOPES), default="global", show_default=True, help=SCOPE_HELP + ".")
@click.option("--alpha", type=float, help="Alpha directly; with --trust, trust is a bound.")
@click.option("--consensus-ref", help="Sign each module by <ref_m, dir_m>, e.g. 'v54 - v54e2'.")
@click.option("--on-disagree", type=click.Choice(ON_DISAGREE), default="fail", show_default=True,
              help=ON_DISAGREE_HELP + ".")
@click.option("--min-agree", type=float, help="Fail below this share of agreeing modules.")
@click.option("--mode", type=click.Choice(methods.names(stepped=True)), default="add", show_default=True,
              help=_method_help(stepped=True) + ".")
@click.option("--dose", help="Comma-separated multiples of alpha, one output each at OUT-x<k>.")
@click.option("--strict", is_flag=True, help="Fail (exit 1, nothing written) when less than 99% of the step "
              "survives or the written update misses it by over 10% of the step.")
@_method_options(stepped=True)
@_merge_options(keep_base=True)
@click.pass_obj
@handled
def project(obj: Ctx, base, direction, trust, trust_scope, alpha, consensus_ref, on_disagree, min_agree, mode,
            dose, strict, rank, dtype, out, force, allow_missing, modules_to_save, dry_run, as_json, show_modules,
            **method_fields):
    """A trust-region step BASE + alpha*DIR, gated by consensus, written as a PEFT LoRA."""
    cons = None
    if consensus_ref:
        cons = {"ref": consensus_ref, "on_disagree": on_disagree, "min_agree": min_agree}
    data = {"base": base, "dir": direction, "trust": trust, "trust_scope": trust_scope, "alpha": alpha,
            "consensus": cons, "mode": mode, "rank": rank, "dose": dose, "out": out, "dtype": dtype,
            "allow_missing": allow_missing, "modules_to_save": modules_to_save, "strict": strict, **method_fields}
    _run_recipe(obj, data, force=force, dry_run=dry_run, as_json=as_json, show_modules=show_modules)


@main.command()
@click.argument("expression")
@_merge_options(keep_base=False)
@click.pass_obj
@handled
def refactor(obj: Ctx, expression, rank, dtype, out, force, allow_missing, modules_to_save, dry_run, as_json,
             show_modules):
    """Any EXPRESSION of adapters, re-factored to a LoRA of the chosen --rank."""
    if str(rank).strip().lower() == "keep-base":
        _usage("refactor: --rank keep-base keeps a backbone's factors under a step; use 'vecmerge project' for "
               "that, or --rank exact")
    data = {"base": expression, "rank": rank, "out": out, "dtype": dtype, "allow_missing": allow_missing,
            "modules_to_save": modules_to_save}
    _run_recipe(obj, data, force=force, dry_run=dry_run, as_json=as_json, show_modules=show_modules)


@main.command("run")
@click.argument("recipe", type=click.Path(exists=True))
@click.option("--out", type=click.Path(file_okay=False), help="Override the recipe's out.")
@click.option("--force", is_flag=True, help="Replace existing outputs.")
@click.option("--dry-run", is_flag=True, help="Print the plan and report; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
@click.option("--modules", "show_modules", is_flag=True, help="Also print the per-module table.")
@click.pass_obj
@handled
def run_cmd(obj: Ctx, recipe, out, force, dry_run, as_json, show_modules):
    """Run a YAML RECIPE (or re-run an output's vecmerge.json manifest)."""
    import dataclasses

    from . import commands
    from .recipe import load

    _not_a_model_manifest(recipe)
    r = load(recipe)
    if out:
        r = dataclasses.replace(r, out=out)
    commands.merge(obj.ws(), r, force=force, dry_run=dry_run, as_json=as_json, show_modules=show_modules,
                   echo=_echo, progress=obj.bars())


def _not_a_model_manifest(path) -> None:
    """``vecmerge run`` of an extract or fuse manifest: say which command made it (it is no recipe)."""
    from .errors import VecmergeError
    from .safe_parse import load_json

    if str(path).endswith(".json"):
        try:
            data = load_json(path)
        except VecmergeError:
            return  # the recipe loader reports it
        if isinstance(data, dict) and data.get("kind") in ("extract", "fuse"):
            _usage(f"run: {path} records a 'vecmerge {data['kind']}' output, not a recipe; run 'vecmerge "
                   f"{data['kind']}' again with its settings, or check the output with 'vecmerge verify'")


@main.command()
@click.argument("target", nargs=-1, required=True)
@click.option("--base-model", type=click.Path(exists=True, file_okay=False),
              help="Local transformers model folder: load through PEFT and compare logits "
                   "(default: the workspace's base_model).")
@click.option("--identities", is_flag=True, help="Check algebraic identities of TARGET adapters (no manifest).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
@click.pass_obj
@handled
def verify(obj: Ctx, target, base_model, identities, as_json):
    """Re-derive an output from its manifest and check every identity; exit 1 if any check fails."""
    if identities and base_model:
        _usage("verify: --base-model needs an output folder with a manifest; drop it with --identities")
    if not identities and len(target) != 1:
        _usage("verify takes one output folder (or --identities ADAPTER...)")
    from . import commands

    commands.verify(obj.ws(), list(target), base_model=base_model, identities=identities, as_json=as_json,
                    echo=_echo, progress=obj.bars())


@main.command()
@click.option("--base-model", required=True, type=click.Path(file_okay=False), help="The base model folder.")
@click.option("--tuned", required=True, type=click.Path(file_okay=False), help="The fully fine-tuned model folder.")
@click.option("--rank", required=True, help=EXTRACT_RANK_HELP + ".")
@click.option("--targets", default="all-linear", show_default=True, help=EXTRACT_TARGETS_HELP + ".")
@click.option("--others", type=click.Choice(EXTRACT_OTHERS), default=None, help=EXTRACT_OTHERS_HELP + ".")
@click.option("--dtype", type=click.Choice(DTYPE_NAMES), default="fp32", show_default=True,
              help="dtype of the written factors.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the randomized range finder.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output adapter folder.")
@click.option("--force", is_flag=True, help="Replace an existing --out that vecmerge wrote.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest instead of the report.")
@click.option("--modules", "show_modules", is_flag=True, help="Also print the per-module table.")
@click.pass_obj
@handled
def extract(obj: Ctx, base_model, tuned, rank, targets, others, dtype, seed, out, force, as_json, show_modules):
    """A LoRA from a full fine-tune: each module's difference cut at --rank, with its exact error."""
    from . import commands

    commands.extract(base_model, tuned, out, rank=rank, targets=[t for t in targets.split(",") if t.strip()],
                     others=others, dtype=dtype, seed=seed, force=force, as_json=as_json, show_modules=show_modules,
                     echo=_echo, progress=obj.bars())


@main.command()
@click.argument("adapter", type=click.Path(file_okay=False))
@click.option("--base-model", type=click.Path(file_okay=False),
              help="The base model folder (default: the workspace's base_model).")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output model folder.")
@click.option("--dtype", type=click.Choice(DTYPE_NAMES), default=None, help=FUSE_DTYPE_HELP + ".")
@click.option("--force", is_flag=True, help="Replace an existing --out that vecmerge wrote.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest instead of the report.")
@click.pass_obj
@handled
def fuse(obj: Ctx, adapter, base_model, out, dtype, force, as_json):
    """ADAPTER added into the base model's weights, written as a plain sharded safetensors model."""
    base_model = base_model or obj.ws().base_model
    if base_model is None:
        _usage("fuse: give --base-model (or base_model in vecmerge.yaml)")
    from . import commands

    commands.fuse(adapter, base_model, out, dtype=dtype, force=force, as_json=as_json, echo=_echo,
                  progress=obj.bars())


@main.command()
@click.option("--out", type=click.Path(file_okay=False), default="demo-out", show_default=True)
@click.option("--force", is_flag=True, help="Replace an existing --out.")
@click.option("--small", is_flag=True, help="Smallest settings (for tests).")
@click.pass_obj
@handled
def demo(obj: Ctx, out, force, small):
    """Train toy trajectories, then inspect, audit, project and verify: the whole story in a minute."""
    from .demo import run_demo

    run_demo(out, force=force, small=small, quiet=obj.quiet, echo=click.echo)


if __name__ == "__main__":  # pragma: no cover
    main()
