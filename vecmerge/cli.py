"""The ``vecmerge`` command. Flags build the same Recipe a YAML file does; ``merge.run`` does the work.

Errors print one ``error: ...`` line to stderr (``--debug`` shows the traceback); exit 2 for bad
input, 1 for a check that failed, 0 otherwise. Heavy imports (torch) happen inside commands, so
``vecmerge --help`` stays fast.
"""

from __future__ import annotations

import functools
import os
import sys

import click

from . import __version__


class Ctx:
    def __init__(self, workspace, debug, quiet, device):
        self.workspace, self.debug, self.quiet, self.device = workspace, debug, quiet, device

    def ws(self):
        from .workspace import Workspace

        return Workspace(self.workspace)

    def progress(self, desc: str):
        """A tqdm wrapper on stderr, only for a terminal and without --quiet."""
        if self.quiet or not sys.stderr.isatty():
            return None
        from tqdm import tqdm

        return functools.partial(tqdm, desc=desc, file=sys.stderr, leave=False, unit="module")


def handled(fn):
    """Turn VecmergeError into one ``error:`` line and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        ctx = click.get_current_context()
        obj: Ctx = ctx.obj
        try:
            if obj.device != "cpu":
                from .lowrank import set_device

                set_device(obj.device)
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


def _emit(obj: Ctx, rep: dict, as_json: bool, render) -> None:
    from .report import to_json

    click.echo(to_json(rep) if as_json else render(rep))


@main.command()
@click.argument("adapters", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
@handled
def inspect(obj: Ctx, adapters, as_json):
    """Config, scale rule, ranks, dtype, norms and sha256 of each ADAPTER (name or folder)."""
    from .describe import describe
    from .report import render_inspect, to_json

    ws = obj.ws()
    infos = [describe(ws.adapter(a), obj.progress(f"inspect {a}")) for a in adapters]
    if as_json:
        click.echo(to_json(infos if len(infos) > 1 else infos[0]))
    else:
        click.echo(render_inspect(infos))


@main.command()
@click.argument("adapters", nargs=-1)
@click.option("--ref", help="Reference trajectory expression, e.g. 'v54 - v54e2'.")
@click.option("--dir", "direction", help="Direction expression, e.g. 'v51 - v28'.")
@click.option("--by", type=click.Choice(["module", "layer", "type", "grid"]), default="module", show_default=True)
@click.option("--sort", type=click.Choice(["module", "cosine", "inner", "layer", "type"]), default="module",
              show_default=True)
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv", "markdown"]), default="table",
              show_default=True)
@click.option("--plot", type=click.Path(dir_okay=False), help="Write a cosine heatmap PNG (needs matplotlib).")
@click.option("--allow-missing", is_flag=True, help="Treat modules missing from an adapter as zero.")
@click.option("--samples", type=int, default=200, show_default=True, help="Random rotations for the chance band.")
@click.pass_obj
@handled
def audit(obj: Ctx, adapters, ref, direction, by, sort, fmt, plot, allow_missing, samples):
    """Per-module sign consensus and cosine: --ref EXPR --dir EXPR, or pairwise over ADAPTERS."""
    from . import audit as audit_mod
    from . import report_audit

    ws = obj.ws()
    result = audit_mod.run_audit(ws, ref=ref, direction=direction, adapters=list(adapters),
                                 allow_missing=allow_missing, samples=samples,
                                 progress=obj.progress("audit"))
    click.echo(report_audit.render(result, by=by, sort=sort, fmt=fmt))
    if plot:
        report_audit.plot(result, plot)
        click.echo(f"heatmap: {plot}", err=fmt != "table")


def _merge_options(fn):
    opts = [
        click.option("--rank", default="exact", show_default=True, help="exact | N | energy:E | keep-base."),
        click.option("--dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32", show_default=True),
        click.option("--out", type=click.Path(file_okay=False), help="Output adapter folder."),
        click.option("--force", is_flag=True, help="Replace an existing --out."),
        click.option("--allow-missing", is_flag=True, help="Treat modules missing from an adapter as zero."),
        click.option("--modules-to-save", type=click.Choice(["refuse", "drop"]), default="refuse", show_default=True,
                     help="Adapters with modules_to_save: refuse, or drop those full weights."),
        click.option("--dry-run", is_flag=True, help="Print the plan and report; write nothing."),
        click.option("--json", "as_json", is_flag=True, help="Machine-readable report."),
        click.option("--modules", "show_modules", is_flag=True, help="Also print the per-module table."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def _run_recipe(obj: Ctx, data: dict, *, force, dry_run, as_json, show_modules, source="options"):
    from .merge import run
    from .recipe import Recipe
    from .report import render_merge, render_modules

    recipe = Recipe.from_dict({k: v for k, v in data.items() if v is not None}, source)
    rep = run(recipe, obj.ws(), dry_run=dry_run, force=force, progress=obj.progress(recipe.kind))
    _emit(obj, rep, as_json, render_merge)
    if show_modules and not as_json:
        click.echo("\n" + render_modules(rep))


@main.command()
@click.option("--base", required=True, help="Backbone expression, e.g. v54.")
@click.option("--dir", "direction", required=True, help="Direction expression, e.g. 'v51 - v28'.")
@click.option("--trust", type=float, help="Relative step T: alpha = T*||base||/||dir||.")
@click.option("--trust-scope", type=click.Choice(["global", "module"]), default="global", show_default=True)
@click.option("--alpha", type=float, help="Alpha directly; with --trust, trust is a bound.")
@click.option("--consensus-ref", help="Sign each module by <ref_m, dir_m>, e.g. 'v54 - v54e2'.")
@click.option("--on-disagree", type=click.Choice(["fail", "drop", "keep"]), default="fail", show_default=True)
@click.option("--min-agree", type=float, help="Fail below this share of agreeing modules.")
@click.option("--mode", type=click.Choice(["add", "onto-ref", "orthogonal"]), default="add", show_default=True)
@click.option("--dose", help="Comma-separated multiples of alpha, one output each at OUT-x<k>.")
@click.option("--strict", is_flag=True, help="Fail (exit 1, nothing written) when less than 99%% of the step "
              "survives or the written update misses it by over 10%% of the step.")
@_merge_options
@click.pass_obj
@handled
def project(obj: Ctx, base, direction, trust, trust_scope, alpha, consensus_ref, on_disagree, min_agree, mode,
            dose, strict, rank, dtype, out, force, allow_missing, modules_to_save, dry_run, as_json, show_modules):
    """A trust-region step BASE + alpha*DIR, gated by consensus, written as a PEFT LoRA."""
    cons = None
    if consensus_ref:
        cons = {"ref": consensus_ref, "on_disagree": on_disagree, "min_agree": min_agree}
    data = {"base": base, "dir": direction, "trust": trust, "trust_scope": trust_scope, "alpha": alpha,
            "consensus": cons, "mode": mode, "rank": rank, "dose": dose, "out": out, "dtype": dtype,
            "allow_missing": allow_missing, "modules_to_save": modules_to_save, "strict": strict}
    _run_recipe(obj, data, force=force, dry_run=dry_run, as_json=as_json, show_modules=show_modules)


@main.command()
@click.argument("expression")
@_merge_options
@click.pass_obj
@handled
def refactor(obj: Ctx, expression, rank, dtype, out, force, allow_missing, modules_to_save, dry_run, as_json,
             show_modules):
    """Any EXPRESSION of adapters, re-factored to a LoRA of the chosen --rank."""
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

    from .merge import run
    from .recipe import load
    from .report import render_merge, render_modules

    r = load(recipe)
    if out:
        r = dataclasses.replace(r, out=out)
    rep = run(r, obj.ws(), dry_run=dry_run, force=force, progress=obj.progress(r.kind))
    _emit(obj, rep, as_json, render_merge)
    if show_modules and not as_json:
        click.echo("\n" + render_modules(rep))


@main.command()
@click.argument("target", nargs=-1, required=True)
@click.option("--base-model", type=click.Path(exists=True, file_okay=False),
              help="Local transformers model folder: load through PEFT and compare logits.")
@click.option("--identities", is_flag=True, help="Check algebraic identities of TARGET adapters (no manifest).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
@click.pass_obj
@handled
def verify(obj: Ctx, target, base_model, identities, as_json):
    """Re-derive an output from its manifest and check every identity; exit 1 if any check fails."""
    from . import report_verify
    from . import verify as verify_mod
    from .errors import CheckFailed

    ws = obj.ws()
    if identities and base_model:
        raise click.UsageError("--base-model needs an output folder with a manifest; drop it with --identities")
    if identities:
        result = verify_mod.verify_identities([ws.adapter(t) for t in target], progress=obj.progress("verify"))
    else:
        if len(target) != 1:
            raise click.UsageError("verify takes one output folder (or --identities ADAPTER...)")
        result = verify_mod.verify_output(target[0], base_model=base_model, progress=obj.progress("verify"))
    _emit(obj, result, as_json, report_verify.render)
    if not result["passed"]:
        failed = [c["name"] for c in result["checks"] if not c["passed"]]
        raise CheckFailed(f"{len(failed)} check(s) failed: {', '.join(failed)}")


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
