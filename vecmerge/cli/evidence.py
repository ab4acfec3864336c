"""``vecmerge evidence ...``, ``vecmerge ls`` and ``vecmerge gate``: the ledger, plans and sequential decisions,
lineage and the seven-condition gate."""

from __future__ import annotations

import math

import click

from .app import Ctx, echo, global_options, handled, json_option, main, metric_list, usage


@main.group()
def evidence():
    """The evaluation ledger: record scores, compare models with error bars, calibrate proxies.

    Scores live in vecmerge-evidence.db beside vecmerge.yaml (its evidence: key moves it), each tied to the
    adapter's content sha256: when a name points at other weights, its old scores are stale and left out.
    """


ENV_HELP = ("The eval environment: an id (as show --by env prints it) or KEY=VALUE of its fields (repeatable); "
            "needed when the records were made under several.")


def env_option(fn):
    return click.option("--env", "env", multiple=True, metavar="ID|KEY=VALUE", help=ENV_HELP)(fn)


class _WrittenFloat(click.types.FloatParamType):
    """A float that keeps the text it was given as (``io.parse.Written``): its decimals are the precision."""

    def convert(self, value, param, ctx):
        from ..io.parse import Written

        x = super().convert(value, param, ctx)
        return Written(value, x) if isinstance(value, str) else x


DECIMALS_HELP = ("The decimals the scores are written with (default: counted in the text given; a grade is "
                 "reported only at a known precision).")


def _written(text: str):
    """``text`` as a float that keeps its text (``io.parse.Written``); ValueError when it is no number."""
    from ..io.parse import Written

    return Written(text.strip())


def _subs(pairs) -> dict:
    """``KEY=V`` (one run) or ``KEY=V1,V2,...`` (one value per run, in order) -> key -> list of floats."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        try:
            values = [_written(v) for v in value.split(",")]
        except ValueError:
            sep = ""
        if not sep or not key.strip():
            usage(f"--sub {pair!r}: give KEY=VALUE with a number, e.g. --sub item_understanding=0.2453 (or one "
                  "value per run: KEY=V1,V2,...)")
        if key.strip() in out:
            usage(f"--sub {key.strip()} given twice; give every run's value at once: --sub {key.strip()}=V1,V2,...")
        out[key.strip()] = values
    return out


@evidence.command("add", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("values", nargs=-1, required=True, type=_WrittenFloat())
@click.option("--metric", help="What was measured (default: metric: in vecmerge.yaml).")
@click.option("--sub", "subs", multiple=True, help="A sub-score KEY=VALUE of a single run, or KEY=V1,V2,... with "
              "one value per run in the runs' order (repeatable, one per sub-score).")
@click.option("--note", help="Free text kept with each record.")
@click.option("--higher-is-better/--lower-is-better", "higher", default=None,
              help="Declare the metric's direction (once per metric).")
@click.option("--env", "env", multiple=True, metavar="KEY=VALUE", help="A field of the runs' eval environment "
              "(repeatable): harness, harness_version, task_version, n_shot, temperature, max_tokens, stop, timeout, "
              "seed, or any other KEY.")
@click.option("--external", is_flag=True, help="Record NAME as an external model even when it is close to a "
              "workspace name.")
@click.option("--decimals", type=click.IntRange(0, 20), help=DECIMALS_HELP)
@json_option
@global_options
@click.pass_obj
@handled
def evidence_add(obj: Ctx, name, values, metric, subs, note, higher, env, external, decimals, as_json):
    """Record runs of NAME: one VALUE per run (negative values: put -- before them).

    A NAME that is no adapter here is recorded as an external model (no sha256); one within two edits of a
    workspace name is refused with "did you mean ...?" (--external records it anyway).
    """
    from .. import commands

    commands.evidence_add(obj.ws(), name, list(values), metric=metric, subs=_subs(subs) or None, note=note,
                          higher_is_better=higher, env=env, external=external, decimals=decimals, as_json=as_json,
                          echo=echo)


@evidence.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path())
@click.option("--model", help="The model name for lm-eval files (default: from their model_args).")
@click.option("--cluster-field", help="A field of each --log_samples doc to cluster items by (e.g. topic; "
              "dotted for nested).")
@click.option("--task", help="Only this lm-eval task of the samples files.")
@click.option("--higher-is-better", "higher", multiple=True, metavar="METRIC",
              help="Declare that higher METRIC is better (repeatable; lm-eval files declare their own).")
@click.option("--lower-is-better", "lower", multiple=True, metavar="METRIC",
              help="Declare that lower METRIC is better (repeatable).")
@click.option("--env", "env", multiple=True, metavar="KEY=VALUE", help="A field added to every record's eval "
              "environment (repeatable; lm-eval results carry their own).")
@click.option("--decimals", type=click.IntRange(0, 20), help=DECIMALS_HELP)
@json_option
@global_options
@click.pass_obj
@handled
def evidence_import(obj: Ctx, files, model, cluster_field, task, higher, lower, env, decimals, as_json):
    """Import FILES: CSV (model,metric,value[,note,item,cluster,sub.KEY]), lm-eval results .json, samples .jsonl;
    a folder: every lm-eval results_*.json and samples_*.jsonl under it (each samples file with its run's results).

    Every file is read before anything is written; a malformed row is one error line and nothing is recorded.
    """
    both = sorted(set(higher) & set(lower))
    if both:
        usage(f"evidence import: {both[0]} is declared both --higher-is-better and --lower-is-better")
    from .. import commands

    commands.evidence_import(obj.ws(), list(files), model=model, cluster_field=cluster_field, task=task,
                             directions={**{m: True for m in higher}, **{m: False for m in lower}} or None,
                             env=env, decimals=decimals, as_json=as_json, echo=echo)


@evidence.command("export")
@click.option("--format", "fmt", type=click.Choice(["csv", "json"]), default="csv", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="The same as --format json.")
@global_options
@click.pass_obj
@handled
def evidence_export(obj: Ctx, fmt, as_json):
    """Print every record (stale ones flagged) as CSV or JSON; the CSV imports again."""
    from .. import commands

    commands.evidence_export(obj.ws(), "json" if as_json else fmt, echo=echo)


@evidence.command("show")
@click.argument("names", nargs=-1)
@click.option("--metric", help="Only this metric.")
@click.option("--stale", "include_stale", is_flag=True, help="Include records of weights a name no longer has.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Write a PNG of the means with error bars.")
@click.option("--force", is_flag=True, help="Replace an existing --plot PNG.")
@click.option("--env", "env", multiple=True, metavar="ID|KEY=VALUE", help="Only these eval environments.")
@click.option("--by", type=click.Choice(["env"]), help="One table per eval environment, with its fields.")
@json_option
@global_options
@click.pass_obj
@handled
def evidence_show(obj: Ctx, names, metric, include_stale, plot, force, env, by, as_json):
    """n, mean, std, SE, 95% CI, min, max, range per model (all, or NAMES), sub-score and eval environment.

    Records of different eval environments are never pooled. For each replicate group (replicate_of: in
    vecmerge.yaml): the variance between trainings and within evaluations, with confidence intervals.
    """
    from .. import commands

    commands.evidence_show(obj.ws(), list(names), metric, include_stale=include_stale, plot=plot, force=force,
                           env=env, by=by, as_json=as_json, echo=echo)


@evidence.command("compare")
@click.argument("a")
@click.argument("b")
@click.option("--metric", help="The metric (default: metric: in vecmerge.yaml, or the one A and B share).")
@click.option("--detect", type=float, help="A difference to plan repeats for (default: the observed one).")
@click.option("--target", help="The sub-score being raised: reported, not counted among the others' costs.")
@click.option("--margin", type=float, help="Non-inferiority margin for every sub-score (default: one grade where "
              "its values lie on a grid, else its pooled run noise sd).")
@click.option("--stale", "include_stale", is_flag=True, help="Include records of weights a name no longer has.")
@env_option
@json_option
@global_options
@click.pass_obj
@handled
def evidence_compare(obj: Ctx, a, b, metric, detect, target, margin, include_stale, env, as_json):
    """Is A better than B beyond eval noise? Welch over runs; paired and clustered over items.

    Every sub-score too: its test (Welch or paired per item), Holm-adjusted p across sub-scores, its grid
    step where its values lie on one, and what the difference costs the others (worse beyond noise, shown
    not worse at the margin, or unknown). Runs of different eval environments are not the same measurement:
    refused, naming the fields that differ, unless --env picks one. Replicate groups: their variance
    components and a test over trainings.
    """
    if detect is not None and not detect > 0:
        usage(f"--detect {detect}: a difference > 0")
    if margin is not None and not (math.isfinite(margin) and margin > 0):
        usage(f"--margin {margin}: a difference > 0 in the metric's units")
    from .. import commands

    commands.evidence_compare(obj.ws(), a, b, metric, detect=detect, include_stale=include_stale, as_json=as_json,
                              echo=echo, target=target, margin=margin, env=env)


@evidence.command("plan")
@click.argument("a")
@click.option("--vs", "b", required=True, help="The model A is compared with (B).")
@click.option("--metric", help="The metric (default: metric: in vecmerge.yaml).")
@click.option("--min-effect", type=float, required=True, help="D: the smallest difference worth finding (the "
              "metric's units, its direction).")
@click.option("--max-runs", type=int, required=True, help="N: the most runs of each model the plan spends.")
@click.option("--alpha", type=float, default=0.05, show_default=True, help="The error rate kept at every look.")
@json_option
@global_options
@click.pass_obj
@handled
def evidence_plan(obj: Ctx, a, b, metric, min_effect, max_runs, alpha, as_json):
    """Pre-register a sequential comparison of A against B: runs recorded after it are its looks.

    A plan is immutable (a new one is a new record); it keeps both adapters' sha256, D, N, alpha and the test.
    """
    if not (math.isfinite(min_effect) and min_effect > 0):
        usage(f"--min-effect {min_effect}: a difference > 0")
    if max_runs < 2:
        usage(f"--max-runs {max_runs}: at least 2 (a look needs two runs of each model)")
    if not 0 < alpha < 1:
        usage(f"--alpha {alpha}: between 0 and 1, e.g. 0.05")
    if a == b:
        usage(f"evidence plan: A and --vs are both {a}")
    from .. import commands

    commands.evidence_plan(obj.ws(), a, b, metric=metric, min_effect=min_effect, max_runs=max_runs, alpha=alpha,
                           as_json=as_json, echo=echo)


@evidence.command("decide")
@click.argument("a")
@click.option("--vs", "b", required=True, help="The model A is compared with (B).")
@click.option("--metric", help="The plan's metric (needed only when A and B have plans on several).")
@click.option("--replay", is_flag=True, help="The decision after each look, in recording order.")
@env_option
@json_option
@global_options
@click.pass_obj
@handled
def evidence_decide(obj: Ctx, a, b, metric, replay, env, as_json):
    """The latest plan's anytime-valid decision: stop_better, stop_futile, or continue (with runs to go).

    A look after every run recorded since the plan, once each model has two; the error rate holds whatever
    the number of looks (a t test mixed over the effect: evidence/sequential.py).
    """
    from .. import commands

    commands.evidence_decide(obj.ws(), a, b, metric=metric, replay=replay, env=env, as_json=as_json, echo=echo)


@evidence.command("calibrate")
@click.option("--proxy", required=True, help="The cheap metric, e.g. local_cv (P1,P2 with --loo: a fit of several).")
@click.option("--target", required=True, help="The metric that matters, e.g. official_total.")
@click.option("--loo", is_flag=True, help="Leave-one-model-out: judge a least-squares fit on models it never saw.")
@click.option("--min-models", type=int, help="Models needed before a proxy may rank (default 8).")
@env_option
@json_option
@global_options
@click.pass_obj
@handled
def evidence_calibrate(obj: Ctx, proxy, target, loo, min_models, env, as_json):
    """Can PROXY rank candidates like TARGET? Spearman, Kendall (bootstrap CIs), pairwise accuracy, noise ceiling.

    With --loo each model's TARGET is predicted by a least-squares fit (intercept and PROXY slopes) on the other
    models, and those held-out predictions are judged: what a new candidate's prediction would be worth.
    """
    if min_models is not None and min_models < 3:
        usage(f"--min-models {min_models}: at least 3 (a rank correlation needs 3 models)")
    proxies = metric_list(proxy, "--proxy")
    if target in proxies:
        usage(f"evidence calibrate: --proxy and --target are both {target}; calibrate one metric against another")
    from .. import commands

    commands.evidence_calibrate(obj.ws(), proxies, target, min_models=min_models, loo=loo, env=env, as_json=as_json,
                                echo=echo)


@main.command("ls")
@click.option("--metric", help="The metric for runs and mean (default: metric: in vecmerge.yaml).")
@json_option
@global_options
@click.pass_obj
@handled
def ls_cmd(obj: Ctx, metric, as_json):
    """The workspace: name, path, sha256, base model, parent, runs recorded and their mean."""
    from .. import commands

    commands.ls(obj.ws(), metric=metric, as_json=as_json, echo=echo)


@main.command("gate")
@click.option("--base", required=True, help="The backbone, e.g. v54.")
@click.option("--dir", "direction", required=True, help="The direction X - Y, e.g. 'v51 - v28'.")
@click.option("--consensus-ref", help="The reference trajectory for module consensus, e.g. 'v54 - v54e2'.")
@click.option("--trust", type=float, help="The relative step T of the planned merge.")
@click.option("--metric", help="The ledger metric (default: gate.metric or metric: in vecmerge.yaml).")
@env_option
@json_option
@global_options
@click.pass_obj
@handled
def gate_cmd(obj: Ctx, base, direction, consensus_ref, trust, metric, env, as_json):
    """Is BASE + alpha*(X - Y) worth trying? Seven conditions, PASS/FAIL/UNKNOWN; exit 0 only when all pass.

    Common base, common parent (lineage), stable backbone (repeated runs), repeated evidence (X beats Y
    beyond eval noise, or the decision of a plan of X vs Y), module consensus, small trust region, no
    sub-score regresses (each protected sub-score of X not worse than Y's at its margin). Thresholds, protect
    and margin: gate: in vecmerge.yaml.
    """
    import math

    if trust is not None and not (math.isfinite(trust) and trust > 0):
        usage(f"--trust {trust}: a relative step > 0, e.g. 0.0113")
    from .. import commands

    commands.gate(obj.ws(), base, direction, consensus_ref=consensus_ref, trust=trust, metric=metric, env=env,
                  as_json=as_json, echo=echo, progress=obj.bars())
