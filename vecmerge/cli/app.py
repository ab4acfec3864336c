"""The ``vecmerge`` group: global options, one ``error:`` line and its exit code for every failure, signals.

Every command module of ``cli/`` registers its commands on ``main``. Errors print one ``error: ...`` line to
stderr (``--debug`` shows the traceback); exit 2 for bad input or usage, 1 for a check that failed, 130/143 when
interrupted, 0 otherwise. Heavy imports (torch) happen inside commands, so ``vecmerge --help`` stays fast.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import warnings

import click

from ..version import __version__


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
BROKEN_PIPE = 141  # 128 + SIGPIPE: the output's reader closed it


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
            echo(line, err=True)
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
    except BrokenPipeError:  # the reader of the output went away (``| head``): stop quietly, as Unix tools do
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        except (OSError, ValueError):
            pass
        ctx.exit(BROKEN_PIPE)
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
        from ..io.safe_text import printable

        click.echo(f"error: {printable(msg, keep_newlines=True)}", err=True)  # a stranger's name may hold escapes
        ctx.exit(code)


def echo(text: str, err: bool = False) -> None:
    """Every command's output: reports, CSV and JSON, with escape sequences and control characters a stranger's
    names or paths may hold removed (``io.safe_text.printable``; line breaks kept). JSON and vecmerge's CSV hold
    none (both escape or strip them), so machine output passes unchanged."""
    from ..io.safe_text import printable

    click.echo(printable(text, keep_newlines=True), err=err)


def usage(msg: str):
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
        from ..io.safe_text import printable

        click.echo(f"error: {printable(msg)}; see '{where} --help'", file=file, err=file is None)


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
