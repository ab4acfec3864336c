"""The ``vecmerge`` command: flags in, ``commands`` called, one ``error:`` line out when something is wrong.

Flags build the same Recipe a YAML file does; choices and method options come from ``options`` and
the method registry, so nothing is spelled twice. Errors print one ``error: ...`` line to stderr
(``--debug`` shows the traceback); exit 2 for bad input or usage, 1 for a check that failed, 0
otherwise. Heavy imports (torch) happen inside commands, so ``vecmerge --help`` stays fast.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import sys
import threading
import warnings

import click

from .. import __version__, methods
from ..options import (
    ALLOW_BASE_MISMATCH_HELP,
    ALLOW_MISSING_HELP,
    AUDIT_SORT_HELP,
    AUDIT_SORTS,
    AUDIT_VIEW_HELP,
    AUDIT_VIEWS,
    BASE_MODEL_ID_HELP,
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
    REPORT_FORMAT_HELP,
    REPORT_FORMATS,
    SCOPE_HELP,
    SCOPES,
    STEP_RANK_HELP,
)
from ..recipe.recipe import recipe_help


class Ctx:
    """Global options, and the workspace and progress bars they imply."""

    def __init__(self, workspace, debug, quiet, device):
        self.workspace, self.debug, self.quiet, self.device = workspace, debug, quiet, device

    def ws(self):
        from ..linalg.lowrank import resolve_device
        from ..workspace.names import Workspace

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


INTERRUPTED, TERMINATED = 130, 143  # 128 + SIGINT / SIGTERM, what shells report for a stopped command


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that staged outputs are removed on the way out."""


def _raise_terminated(signum, frame):
    raise _Terminated


def handled(fn):
    """Turn VecmergeError into one ``error:`` line and its exit code; Ctrl-C into one line and exit 130
    (SIGTERM: 143), after the staged outputs are removed.

    Warnings from libraries (torch, transformers) are held while the command runs: after a success
    each is printed as one ``warning:`` line, after a failure only the ``error:`` line is (``--debug``
    shows everything as it happens).
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        ctx = click.get_current_context()
        if ctx.obj.debug:
            return fn(*args, **kwargs)
        main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
        try:
            with warnings.catch_warnings(record=True) as held:
                result = _run(ctx, fn, args, kwargs)  # an error exits here, and the held warnings go with it
        finally:
            if main_thread:
                signal.signal(signal.SIGTERM, previous)
        lines = dict.fromkeys(f"warning: {str(w.message).strip().splitlines()[0]} ({w.category.__name__})"
                              for w in held if str(w.message).strip())
        for line in lines:
            click.echo(line, err=True)
        return result

    return wrapper


def _run(ctx, fn, args, kwargs):
    """``fn(*args, **kwargs)``; an error becomes one ``error:`` line and ``ctx.exit(code)``."""
    try:
        return fn(*args, **kwargs)
    except click.exceptions.Exit:
        raise
    except KeyboardInterrupt as e:
        how = "terminated (SIGTERM)" if isinstance(e, _Terminated) else "interrupted"
        click.echo(f"error: {how}; vecmerge writes every output whole or not at all, so nothing is "
                   "half-written", err=True)
        ctx.exit(TERMINATED if isinstance(e, _Terminated) else INTERRUPTED)
    except Exception as e:
        from ..errors import VecmergeError

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


def _echo(text: str, err: bool = False) -> None:
    click.echo(text, err=err)


def _usage(msg: str):
    from ..errors import UsageError

    raise UsageError(msg)


WORKSPACE_HELP = "Workspace file naming adapters (default: ./vecmerge.yaml if present)."
DEBUG_HELP = "Show tracebacks instead of one error line."
QUIET_HELP = "No progress bars."
DEVICE_HELP = "Device for the factored kernels: cpu, cuda or cuda:N."


def _late(attr: str):
    """Callback of a global option given after the subcommand: it overrides the group's value."""
    def set_it(ctx, param, value):
        if value not in (None, False):
            setattr(ctx.find_object(Ctx), attr, value)
        return value

    return set_it


def global_options(fn):
    """The group's options, accepted after the subcommand too (``vecmerge project ... -q``)."""
    for opt in reversed([
        click.option("--workspace", type=click.Path(dir_okay=False), default=None, expose_value=False,
                     callback=_late("workspace"), help=WORKSPACE_HELP),
        click.option("--debug", is_flag=True, default=False, expose_value=False, callback=_late("debug"),
                     help=DEBUG_HELP),
        click.option("--quiet", "-q", is_flag=True, default=False, expose_value=False, callback=_late("quiet"),
                     help=QUIET_HELP),
        click.option("--device", default=None, expose_value=False, callback=_late("device"),
                     help=DEVICE_HELP + " [default: cpu]"),
    ]):
        fn = opt(fn)
    return fn


class _OneLineUsageError(click.UsageError):
    """A usage error click found (unknown option, missing value, bad choice), shown as one ``error:`` line."""

    def show(self, file=None) -> None:
        where = self.ctx.command_path if self.ctx is not None else "vecmerge"
        msg = " ".join(self.format_message().split()).rstrip(".")
        click.echo(f"error: {msg}; see '{where} --help'", file=file, err=file is None)


def _one_line(e: click.UsageError) -> click.UsageError:
    """``e`` as a one-line usage error (exit 2); a bare command that shows its help is left as it is."""
    if isinstance(e, _OneLineUsageError) or type(e).__name__ == "NoArgsIsHelpError":
        return e
    return _OneLineUsageError(e.format_message(), e.ctx)


class _Group(click.Group):
    """The top group: every usage error of it and of its commands is one ``error:`` line, exit 2."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as e:
            raise _one_line(e) from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            raise _one_line(e) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vecmerge")
@click.option("--workspace", type=click.Path(dir_okay=False), default=None, help=WORKSPACE_HELP)
@click.option("--debug", is_flag=True, help=DEBUG_HELP)
@click.option("--quiet", "-q", is_flag=True, help=QUIET_HELP)
@click.option("--device", default="cpu", show_default=True, help=DEVICE_HELP)
@click.pass_context
def main(ctx, workspace, debug, quiet, device):
    """Surgery on LoRA adapters: exact factored algebra, audits, trust-region steps, verified PEFT output.

    The options above may also follow the command: vecmerge project ... -q. Each command's --help
    says more; vecmerge run --help documents the recipe keys.
    """
    # Small LAPACK calls are far slower multi-threaded (see kernels.py); torch is not imported yet.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    ctx.obj = Ctx(workspace, debug, quiet, device)


@main.command()
@click.argument("adapters", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@global_options
@click.pass_obj
@handled
def inspect(obj: Ctx, adapters, as_json):
    """Config, scale rule, ranks, dtype, norms and sha256 of each ADAPTER (name or folder)."""
    from .. import commands

    commands.inspect(obj.ws(), list(adapters), as_json=as_json, echo=_echo, progress=obj.bars())


@main.command()
@click.argument("adapters", nargs=-1)
@click.option("--ref", help="Reference trajectory expression, e.g. 'v54 - v54e2'.")
@click.option("--dir", "direction", help="Direction expression, e.g. 'v51 - v28'.")
@click.option("--by", type=click.Choice(AUDIT_VIEWS), default="module", show_default=True, help=AUDIT_VIEW_HELP)
@click.option("--sort", type=click.Choice(AUDIT_SORTS), default="module", show_default=True, help=AUDIT_SORT_HELP)
@click.option("--format", "fmt", type=click.Choice(REPORT_FORMATS), default="table", show_default=True,
              help=REPORT_FORMAT_HELP)
@click.option("--plot", type=click.Path(dir_okay=False),
              help="Also write a cosine heatmap PNG, layers x module types (needs matplotlib).")
@click.option("--force", is_flag=True, help="Replace an existing --plot PNG.")
@click.option("--allow-missing", is_flag=True, help=ALLOW_MISSING_HELP + " Audits count them apart (not compared).")
@click.option("--samples", type=int, default=200, show_default=True,
              help="Random rotations per module for the chance band; 0 for the analytic band 1.96/sqrt(out*in).")
@click.option("--modules-to-save", type=click.Choice(MODULES_TO_SAVE), default="refuse", show_default=True,
              help=MODULES_TO_SAVE_HELP)
@click.option("--allow-base-mismatch", is_flag=True, help=ALLOW_BASE_MISMATCH_HELP)
@global_options
@click.pass_obj
@handled
def audit(obj: Ctx, adapters, ref, direction, by, sort, fmt, plot, force, allow_missing, samples, modules_to_save,
          allow_base_mismatch):
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
    from .. import commands

    commands.audit(obj.ws(), ref=ref, direction=direction, adapters=adapters, by=by, sort=sort, fmt=fmt, plot=plot,
                   allow_missing=allow_missing, samples=samples, modules_to_save=modules_to_save,
                   allow_base_mismatch=allow_base_mismatch, force=force, echo=_echo, progress=obj.bars())


def _merge_options(stepped: bool, rank_note: str | None = None):
    def deco(fn):
        rank = (click.option("--rank", default=None, help=RANK_HELP + ". " + rank_note) if rank_note else
                click.option("--rank", default="exact", show_default=True,
                             help=RANK_HELP + (STEP_RANK_HELP + KEEP_BASE_HELP if stepped else "") + "."))
        opts = [
            rank,
            click.option("--dtype", type=click.Choice(DTYPE_NAMES), default="fp32", show_default=True,
                         help=DTYPE_HELP),
            click.option("--out", type=click.Path(file_okay=False),
                         help="Output adapter folder (written whole or not at all)."),
            click.option("--force", is_flag=True, help="Replace an existing --out."),
            click.option("--allow-missing", is_flag=True, help=ALLOW_MISSING_HELP),
            click.option("--modules-to-save", type=click.Choice(MODULES_TO_SAVE), default="refuse", show_default=True,
                         help=MODULES_TO_SAVE_HELP),
            click.option("--allow-base-mismatch", is_flag=True, help=ALLOW_BASE_MISMATCH_HELP),
            click.option("--base-model-id", help=BASE_MODEL_ID_HELP),
            click.option("--dry-run", is_flag=True, help="Print the plan and report; write nothing."),
            click.option("--json", "as_json", is_flag=True, help="Machine-readable report."),
            click.option("--modules", "show_modules", is_flag=True, help="Also print the per-module table."),
        ]
        for o in reversed(opts):
            fn = o(fn)
        return global_options(fn)

    return deco


def _selection_options(fn):
    fn = click.option("--exclude", help="Leave out modules whose name matches this regular expression "
                      r"(re.search), e.g. 'layers\.0\.'.")(fn)
    return click.option("--only", help="Only modules whose name matches this regular expression (re.search), "
                        "e.g. 'mlp' or 'q_proj|v_proj'.")(fn)


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


_RECIPE_KEY_OF = {"direction": "dir", "consensus_ref": "consensus.ref", "on_disagree": "consensus.on_disagree",
                  "min_agree": "consensus.min_agree"}


def _flag_names(command: click.Command) -> dict[str, str]:
    """``{recipe key: what the user typed}`` for a command whose flags build a recipe (``--consensus-ref``...)."""
    names = {}
    for prm in command.params:
        if isinstance(prm, click.Argument):
            names["base"] = prm.human_readable_name
        elif prm.expose_value and prm.name:
            names[_RECIPE_KEY_OF.get(prm.name, prm.name)] = max(prm.opts, key=len)
    if "mode" in names:
        names["method"] = names["mode"]
    return names


def as_flags(problem: str, names: dict[str, str]) -> str:
    """A recipe problem worded with the flags the user typed: ``mode=onto-ref: needs consensus.ref`` becomes
    ``--mode onto-ref: needs --consensus-ref``.

    Args:
        problem (str): one message naming recipe keys. names (dict[str, str]): recipe key -> flag (``_flag_names``).
    """
    for key in sorted(names, key=len, reverse=True):
        k = re.escape(key)
        problem = re.sub(rf"(?<![\w.-]){k}=", lambda _m, f=names[key]: f + " ", problem)
        problem = re.sub(rf"(?<![\w.-]){k}(?=:|\s\(|\s+or\b|$)", lambda _m, f=names[key]: f, problem)
    return re.sub(r"(--[\w-]+): (?=[\d'\"])", r"\1 ", problem)


def _run_recipe(obj: Ctx, data: dict, *, force, dry_run, as_json, show_modules, source="options"):
    from .. import commands
    from ..errors import RecipeError
    from ..recipe.recipe import Recipe

    try:
        recipe = Recipe.from_dict({k: v for k, v in data.items() if v is not None}, source)
        commands.merge(obj.ws(), recipe, force=force, dry_run=dry_run, as_json=as_json, show_modules=show_modules,
                       echo=_echo, progress=obj.bars())
    except RecipeError as e:
        if e.source not in (source, "recipe"):
            raise
        names = _flag_names(click.get_current_context().command)
        raise RecipeError([as_flags(q, names) for q in e.problems], source) from None


@main.command()
@click.option("--base", required=True, help="Backbone expression, e.g. v54 (the adapter you step from).")
@click.option("--dir", "direction", required=True, help="Direction expression, e.g. 'v51 - v28'.")
@click.option("--trust", type=float, help="Relative step T: alpha = T*||base||/||dir|| (0.0113 moves 1.13% of the "
              "backbone's norm).")
@click.option("--trust-scope", type=click.Choice(SCOPES), default="global", show_default=True, help=SCOPE_HELP)
@click.option("--alpha", type=float, help="Alpha directly; with --trust, trust is a bound on it.")
@click.option("--consensus-ref", help="Reference trajectory, e.g. 'v54 - v54e2': each module agrees when "
              "<ref_m, dir_m> > 0; see --on-disagree.")
@click.option("--on-disagree", type=click.Choice(ON_DISAGREE), default="fail", show_default=True,
              help=ON_DISAGREE_HELP)
@click.option("--min-agree", type=float, help="Fail below this share (0..1) of modules agreeing in sign.")
@click.option("--mode", type=click.Choice(methods.names(stepped=True)), default="add", show_default=True,
              help="How each module's direction is shaped before alpha is chosen. " + _method_help(stepped=True)
              + ".")
@click.option("--dose", help="Comma-separated multiples of alpha, one output each at OUT-x<k>, e.g. 0.5,1,1.456.")
@click.option("--strict", is_flag=True, help="Fail (exit 1, nothing written) on any warning: less than 99% of the "
              "step survives, the written update misses it by over 10% of the step, dtype rounding, a step over "
              "half the backbone's norm, inputs of different base models.")
@click.option("--gate", "run_gate", is_flag=True, help="Run the six-condition gate first (see 'vecmerge gate'); "
              "write nothing unless every condition passes. The output's manifest and card carry its table.")
@click.option("--metric", help="With --gate: the ledger metric for the backbone and evidence conditions.")
@_selection_options
@_method_options(stepped=True)
@_merge_options(stepped=True)
@click.pass_obj
@handled
def project(obj: Ctx, base, direction, trust, trust_scope, alpha, consensus_ref, on_disagree, min_agree, mode,
            dose, strict, run_gate, metric, only, exclude, rank, dtype, out, force, allow_missing, modules_to_save,
            allow_base_mismatch, base_model_id, dry_run, as_json, show_modules, **method_fields):
    """A trust-region step BASE + alpha*DIR, gated by consensus, written as a PEFT LoRA.

    With --only/--exclude the step is taken in the selected modules only; the others keep the backbone.

    Example: vecmerge project --base v54 --dir 'v51 - v28' --trust 0.0113 --consensus-ref 'v54 - v54e2' --out out/v58
    """
    if metric is not None and not run_gate:
        _usage("project: --metric only means something with --gate")
    cons = None
    if consensus_ref:
        cons = {"ref": consensus_ref, "on_disagree": on_disagree, "min_agree": min_agree}
    data = {"base": base, "dir": direction, "trust": trust, "trust_scope": trust_scope, "alpha": alpha,
            "consensus": cons, "mode": mode, "rank": rank, "dose": dose, "out": out, "dtype": dtype,
            "allow_missing": allow_missing, "modules_to_save": modules_to_save, "strict": strict,
            "allow_base_mismatch": allow_base_mismatch or None, "base_model_id": base_model_id,
            "gate": ({"metric": metric} if metric else True) if run_gate else None, "only": only, "exclude": exclude,
            **method_fields}
    _run_recipe(obj, data, force=force, dry_run=dry_run, as_json=as_json, show_modules=show_modules)


@main.command()
@click.argument("models", nargs=-1, required=True, metavar="INPUT...")
@click.option("--method", type=click.Choice(methods.merge_names()), required=True,
              help="; ".join(f"{m}: {methods.get(m).summary}" for m in methods.merge_names()) + ".")
@click.option("--weights", help="Comma-separated weights, one per INPUT (default 1 each), e.g. 0.5,0.5.")
@click.option("--strict", is_flag=True, help="Fail (exit 1, nothing written) when less than 99% of the intended "
              "merge survives the rank cut.")
@_selection_options
@_method_options(stepped=False)
@_merge_options(stepped=False, rank_note="Default exact; svd and --space full need a rank.")
@click.pass_obj
@handled
def merge(obj: Ctx, models, method, weights, strict, only, exclude, rank, dtype, out, force, allow_missing,
          modules_to_save, allow_base_mismatch, base_model_id, dry_run, as_json, show_modules, **method_fields):
    """The classic merges of INPUTs (adapter names or expressions such as 'v51 - v28'), written as a PEFT LoRA.

    Each method is applied to the updates scale*B@A themselves, never to the factors, and the output
    verifies like every other (vecmerge verify OUT). Per-model density and per-module multipliers:
    write a recipe (models: [{model: v28, weight: 0.5, density: 0.3}, ...]) and use vecmerge run.
    """
    ws = [1.0] * len(models)
    if weights is not None:
        try:
            ws = [float(w) for w in weights.split(",")]
        except ValueError:
            _usage(f"--weights {weights}: comma-separated numbers, one per INPUT, e.g. 0.5,0.5")
        if len(ws) != len(models):
            _usage(f"--weights {weights}: {len(ws)} weight(s) for {len(models)} INPUT(s); give one per INPUT")
    data = {"method": method, "models": [{"model": m, "weight": w} for m, w in zip(models, ws)], "rank": rank,
            "out": out, "dtype": dtype, "allow_missing": allow_missing, "modules_to_save": modules_to_save,
            "strict": strict, "only": only, "exclude": exclude, "allow_base_mismatch": allow_base_mismatch or None,
            "base_model_id": base_model_id, **method_fields}
    _run_recipe(obj, data, force=force, dry_run=dry_run, as_json=as_json, show_modules=show_modules)


@main.command()
@click.argument("expression")
@_merge_options(stepped=False)
@click.pass_obj
@handled
def refactor(obj: Ctx, expression, rank, dtype, out, force, allow_missing, modules_to_save, allow_base_mismatch,
             base_model_id, dry_run, as_json, show_modules):
    """Any EXPRESSION of adapters, re-factored to a LoRA of the chosen --rank.

    Example: vecmerge refactor '0.5*v16 + 0.5*v28' --rank 32 --out out/avg
    """
    if str(rank).strip().lower() == "keep-base":
        _usage("refactor: --rank keep-base keeps a backbone's factors under a step; use 'vecmerge project' for "
               "that, or --rank exact")
    if str(rank).strip().lower().startswith("step-energy"):
        _usage("refactor: --rank step-energy:E measures a step's energy, and refactor has no step; use --rank "
               "energy:E (the share of the whole update's energy)")
    data = {"base": expression, "rank": rank, "out": out, "dtype": dtype, "allow_missing": allow_missing,
            "modules_to_save": modules_to_save, "allow_base_mismatch": allow_base_mismatch or None,
            "base_model_id": base_model_id}
    _run_recipe(obj, data, force=force, dry_run=dry_run, as_json=as_json, show_modules=show_modules)


@main.command("run", epilog=recipe_help())
@click.argument("recipe", type=click.Path(exists=True))
@click.option("--out", type=click.Path(file_okay=False), help="Override the recipe's out.")
@click.option("--force", is_flag=True, help="Replace existing outputs.")
@click.option("--base-model-id", help="Override the recipe's base_model_id. " + BASE_MODEL_ID_HELP)
@click.option("--dry-run", is_flag=True, help="Print the plan and report; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
@click.option("--modules", "show_modules", is_flag=True, help="Also print the per-module table.")
@global_options
@click.pass_obj
@handled
def run_cmd(obj: Ctx, recipe, out, force, base_model_id, dry_run, as_json, show_modules):
    """Run a YAML RECIPE (or re-run an output's vecmerge.json manifest, from any folder).

    The recipe's keys are listed below (the same as docs/RECIPES.md).
    """
    import dataclasses

    from .. import commands
    from ..errors import RecipeError
    from ..options import is_hub_id
    from ..recipe.recipe import load

    _not_a_model_manifest(recipe)
    r = load(recipe)
    if out:
        r = dataclasses.replace(r, out=out)
    if base_model_id:
        if not is_hub_id(base_model_id):
            raise RecipeError([f"--base-model-id {base_model_id!r}: a hub id such as Qwen/Qwen3-0.6B (ORG/NAME)"],
                              "options")
        r = dataclasses.replace(r, base_model_id=base_model_id)
    commands.merge(obj.ws(), r, force=force, dry_run=dry_run, as_json=as_json, show_modules=show_modules,
                   echo=_echo, progress=obj.bars())


def _not_a_model_manifest(path) -> None:
    """``vecmerge run`` of an extract or fuse manifest: say which command made it (it is no recipe)."""
    from ..errors import VecmergeError
    from ..io.parse import load_json

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
              help="Local transformers model folder (config.json and weights) of the model the output declares: "
                   "load through PEFT and compare deltas, logits and merge_and_unload (default: the workspace's "
                   "base_model).")
@click.option("--allow-base-mismatch", is_flag=True,
              help="Run the PEFT checks even when --base-model is not the model the output declares.")
@click.option("--identities", is_flag=True, help="Check algebraic identities of TARGET adapters (no manifest).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
@global_options
@click.pass_obj
@handled
def verify(obj: Ctx, target, base_model, allow_base_mismatch, identities, as_json):
    """Re-derive an output from its manifest and check every identity; exit 1 if any check fails."""
    if identities and base_model:
        _usage("verify: --base-model needs an output folder with a manifest; drop it with --identities")
    if not identities and len(target) != 1:
        _usage("verify takes one output folder (or --identities ADAPTER...)")
    from .. import commands

    commands.verify(obj.ws(), list(target), base_model=base_model, identities=identities, as_json=as_json,
                    allow_base_mismatch=allow_base_mismatch, echo=_echo, progress=obj.bars())


@main.group()
def evidence():
    """The evaluation ledger: record scores, compare models with error bars, calibrate proxies.

    Scores live in vecmerge-evidence.db beside vecmerge.yaml (its evidence: key moves it), each tied to the
    adapter's content sha256: when a name points at other weights, its old scores are stale and left out.
    """


def _json_option(fn):
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(fn)


def _subs(pairs) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not key.strip():
            _usage(f"--sub {pair!r}: give KEY=VALUE with a number, e.g. --sub item_understanding=0.2453")
    return out


@evidence.command("add", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("values", nargs=-1, required=True, type=float)
@click.option("--metric", help="What was measured (default: metric: in vecmerge.yaml).")
@click.option("--sub", "subs", multiple=True, help="A sub-score KEY=VALUE of a single run (repeatable).")
@click.option("--note", help="Free text kept with each record.")
@click.option("--higher-is-better/--lower-is-better", "higher", default=None,
              help="Declare the metric's direction (once per metric).")
@_json_option
@global_options
@click.pass_obj
@handled
def evidence_add(obj: Ctx, name, values, metric, subs, note, higher, as_json):
    """Record runs of NAME: one VALUE per run (negative values: put -- before them)."""
    from .. import commands

    commands.evidence_add(obj.ws(), name, list(values), metric=metric, subs=_subs(subs) or None, note=note,
                          higher_is_better=higher, as_json=as_json, echo=_echo)


@evidence.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--model", help="The model name for lm-eval files (default: from their model_args).")
@click.option("--cluster-field", help="A field of each --log_samples doc to cluster items by (e.g. topic; "
              "dotted for nested).")
@click.option("--task", help="Only this lm-eval task of the samples files.")
@click.option("--higher-is-better", "higher", multiple=True, metavar="METRIC",
              help="Declare that higher METRIC is better (repeatable; lm-eval files declare their own).")
@click.option("--lower-is-better", "lower", multiple=True, metavar="METRIC",
              help="Declare that lower METRIC is better (repeatable).")
@_json_option
@global_options
@click.pass_obj
@handled
def evidence_import(obj: Ctx, files, model, cluster_field, task, higher, lower, as_json):
    """Import FILES: CSV (model,metric,value[,note,item,cluster,sub.KEY]), lm-eval results .json, samples .jsonl.

    Every file is read before anything is written; a malformed row is one error line and nothing is recorded.
    """
    both = sorted(set(higher) & set(lower))
    if both:
        _usage(f"evidence import: {both[0]} is declared both --higher-is-better and --lower-is-better")
    from .. import commands

    commands.evidence_import(obj.ws(), list(files), model=model, cluster_field=cluster_field, task=task,
                             directions={**{m: True for m in higher}, **{m: False for m in lower}} or None,
                             as_json=as_json, echo=_echo)


@evidence.command("export")
@click.option("--format", "fmt", type=click.Choice(["csv", "json"]), default="csv", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="The same as --format json.")
@global_options
@click.pass_obj
@handled
def evidence_export(obj: Ctx, fmt, as_json):
    """Print every record (stale ones flagged) as CSV or JSON; the CSV imports again."""
    from .. import commands

    commands.evidence_export(obj.ws(), "json" if as_json else fmt, echo=_echo)


@evidence.command("show")
@click.argument("names", nargs=-1)
@click.option("--metric", help="Only this metric.")
@click.option("--stale", "include_stale", is_flag=True, help="Include records of weights a name no longer has.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Write a PNG of the means with error bars.")
@click.option("--force", is_flag=True, help="Replace an existing --plot PNG.")
@_json_option
@global_options
@click.pass_obj
@handled
def evidence_show(obj: Ctx, names, metric, include_stale, plot, force, as_json):
    """n, mean, std, SE, 95% CI, min, max, range per model (all, or NAMES) and per sub-score."""
    from .. import commands

    commands.evidence_show(obj.ws(), list(names), metric, include_stale=include_stale, plot=plot, force=force,
                           as_json=as_json, echo=_echo)


@evidence.command("compare")
@click.argument("a")
@click.argument("b")
@click.option("--metric", help="The metric (default: metric: in vecmerge.yaml, or the one A and B share).")
@click.option("--detect", type=float, help="A difference to plan repeats for (default: the observed one).")
@click.option("--stale", "include_stale", is_flag=True, help="Include records of weights a name no longer has.")
@_json_option
@global_options
@click.pass_obj
@handled
def evidence_compare(obj: Ctx, a, b, metric, detect, include_stale, as_json):
    """Is A better than B beyond eval noise? Welch over runs; paired and clustered over items."""
    if detect is not None and not detect > 0:
        _usage(f"--detect {detect}: a difference > 0")
    from .. import commands

    commands.evidence_compare(obj.ws(), a, b, metric, detect=detect, include_stale=include_stale, as_json=as_json,
                              echo=_echo)


@evidence.command("calibrate")
@click.option("--proxy", required=True, help="The cheap metric, e.g. local_cv.")
@click.option("--target", required=True, help="The metric that matters, e.g. official_total.")
@click.option("--min-models", type=int, help="Models needed before a proxy may rank (default 8).")
@_json_option
@global_options
@click.pass_obj
@handled
def evidence_calibrate(obj: Ctx, proxy, target, min_models, as_json):
    """Can PROXY rank candidates like TARGET? Spearman, Kendall (bootstrap CIs), pairwise accuracy, noise ceiling."""
    if min_models is not None and min_models < 3:
        _usage(f"--min-models {min_models}: at least 3 (a rank correlation needs 3 models)")
    if proxy == target:
        _usage(f"evidence calibrate: --proxy and --target are both {proxy}; calibrate one metric against another")
    from .. import commands

    commands.evidence_calibrate(obj.ws(), proxy, target, min_models=min_models, as_json=as_json, echo=_echo)


@main.command("ls")
@click.option("--metric", help="The metric for runs and mean (default: metric: in vecmerge.yaml).")
@_json_option
@global_options
@click.pass_obj
@handled
def ls_cmd(obj: Ctx, metric, as_json):
    """The workspace: name, path, sha256, base model, parent, runs recorded and their mean."""
    from .. import commands

    commands.ls(obj.ws(), metric=metric, as_json=as_json, echo=_echo)


@main.command("gate")
@click.option("--base", required=True, help="The backbone, e.g. v54.")
@click.option("--dir", "direction", required=True, help="The direction X - Y, e.g. 'v51 - v28'.")
@click.option("--consensus-ref", help="The reference trajectory for module consensus, e.g. 'v54 - v54e2'.")
@click.option("--trust", type=float, help="The relative step T of the planned merge.")
@click.option("--metric", help="The ledger metric (default: gate.metric or metric: in vecmerge.yaml).")
@_json_option
@global_options
@click.pass_obj
@handled
def gate_cmd(obj: Ctx, base, direction, consensus_ref, trust, metric, as_json):
    """Is BASE + alpha*(X - Y) worth trying? Six conditions, PASS/FAIL/UNKNOWN; exit 0 only when all pass.

    Common base, common parent (lineage), stable backbone (repeated runs), repeated evidence (X beats Y
    beyond eval noise), module consensus, small trust region. Thresholds: gate: in vecmerge.yaml.
    """
    import math

    if trust is not None and not (math.isfinite(trust) and trust > 0):
        _usage(f"--trust {trust}: a relative step > 0, e.g. 0.0113")
    from .. import commands

    commands.gate(obj.ws(), base, direction, consensus_ref=consensus_ref, trust=trust, metric=metric,
                  as_json=as_json, echo=_echo, progress=obj.bars())


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
@global_options
@click.pass_obj
@handled
def extract(obj: Ctx, base_model, tuned, rank, targets, others, dtype, seed, out, force, as_json, show_modules):
    """A LoRA from a full fine-tune: each module's difference cut at --rank, with its exact error."""
    from .. import commands

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
@global_options
@click.pass_obj
@handled
def fuse(obj: Ctx, adapter, base_model, out, dtype, force, as_json):
    """ADAPTER added into the base model's weights, written as a plain sharded safetensors model."""
    base_model = base_model or obj.ws().base_model
    if base_model is None:
        _usage("fuse: give --base-model (or base_model in vecmerge.yaml)")
    from .. import commands

    commands.fuse(adapter, base_model, out, dtype=dtype, force=force, as_json=as_json, echo=_echo,
                  progress=obj.bars())


@main.command()
@click.option("--out", type=click.Path(file_okay=False), default="demo-out", show_default=True,
              help="The demo folder (the toy checkpoints, vecmerge.yaml, the audit plot and out/v58).")
@click.option("--force", is_flag=True, help="Replace an existing --out (only one a demo made).")
@click.option("--small", is_flag=True, help="Smallest settings (for tests).")
@global_options
@click.pass_obj
@handled
def demo(obj: Ctx, out, force, small):
    """Train toy trajectories, then inspect, audit, project and verify: the whole story in a minute."""
    from ..demo.run import run_demo

    run_demo(out, force=force, small=small, quiet=obj.quiet, echo=click.echo)


if __name__ == "__main__":  # pragma: no cover
    main()
