"""The `rtui` command line. Every command takes --target, --config and one flag per config field.

Exit codes: 0 done, 1 the operation failed, 2 bad input or usage (one line, no
traceback), 3 a check found nothing feasible. Output with --json is stable.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Iterable, Sequence
from types import UnionType
from typing import Any, Literal, NoReturn, TextIO, Union, get_args, get_origin

from backend import targets
from backend.config import ECHO_LIMIT, field_info, field_owners, flag_name, shown
from backend.errors import RtuiError, UserError
from backend.resolve import ResolvedConfig
from backend.session import RunSession
from backend.store import RunStatus, RunStore
from tui.heap import loading
from tui.invocation import resolved_from

LATEST = "__latest__"
HELP_FLAGS = ("-h", "--help")


class Parser(argparse.ArgumentParser):
    """Usage errors in one line with what to do next, exit 2.

    A parser may also have *word commands*: `rtui logs classify FILE...` is a command of its
    own although `rtui logs RUN_ID` takes a free positional, which argparse subparsers cannot
    express (they would make every run id an invalid choice).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._word_dest = ""
        self._words: dict[str, Parser] = {}
        self.commands: frozenset[str] = frozenset()  # its subcommands' names, once added

    def add_word_command(self, positional: str, word: str, **kwargs: Any) -> Parser:
        """A parser for `<this command> <word> ...`, chosen when ``positional`` parses as ``word``."""
        self._word_dest = positional
        kwargs.setdefault("prog", f"{self.prog} {word}")
        parser = Parser(**kwargs)
        # The word itself, so the word command's own options may come before or after it.
        parser.add_argument("word", choices=[word], help=argparse.SUPPRESS)
        self._words[word] = parser
        return parser

    def parse_known_args(self, args: Iterable[str] | None = None, namespace: Any = None) -> tuple[Any, list[str]]:
        if self._words and args is not None:
            args = list(args)
            # A probe without the help flags, so `rtui logs classify --help` reaches classify's help.
            probe, _ = super().parse_known_args([a for a in args if a not in HELP_FLAGS], None)
            chosen = self._words.get(getattr(probe, self._word_dest, None) or "")
            if chosen is not None:
                # Intermixed: files may come before and after --json (`classify a.log --json b.log`).
                # Not "known": what it does not know is an error naming its own --help.
                return chosen.parse_intermixed_args(args, namespace), []
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        # argparse echoes the offending argument: a pasted 5000-character value is not an error line.
        message = re.sub(rf"\S{{{ECHO_LIMIT + 1},}}", lambda m: m.group()[:ECHO_LIMIT] + "…", message)
        self.exit(2, f"rtui: {message} (see `{self.prog} --help`)\n")


# Placeholders a name alone does not give: lists, either-or values, compound names.
_METAVAR = {
    "availability_zone": "AZ", "vpc_id": "VPC_ID", "private_subnet_ids": "SUBNET_ID,...", "api_cidrs": "CIDR,...",
    "system_node_type": "INSTANCE_TYPE", "gpu_node_type": "INSTANCE_TYPE", "image": "IMAGE",
    "addon_registry": "HOST[/PATH]",
    "kuberay_crds": "DIR|URL", "kubeconfig": "FILE", "hf_token": "env:NAME|FILE", "model_id": "HUB_ID|DIR",
    "data": "cycle|random|PATH|s3://URI", "tokenizer": "DIR|HUB_ID", "storage_path": "DIR|s3://URI",
    "resume_from": "DIR|latest", "job_env": "NAME,...", "learning_rate": "RATE",
}


def _choices(annotation: Any) -> tuple[str, ...]:
    """The values of a Literal field (also inside ``X | None``); () for any other type."""
    if get_origin(annotation) is Literal:
        return tuple(str(a) for a in get_args(annotation))
    if get_origin(annotation) in (Union, UnionType):
        return next((c for c in map(_choices, get_args(annotation)) if c), ())
    return ()


def field_choices(field: str) -> tuple[str, ...]:
    """The values a config field takes when they are few: a Literal's, or the built-in targets (an
    installed target is accepted too, but the help does not pay for looking them up)."""
    return tuple(targets.BUILTIN) if field == "target" else _choices(field_info(field).annotation)


def config_metavar(field: str) -> str:
    """What a config flag's value looks like: ``{local,aws,kube}``, ``N``, ``NAME``, never a field name."""
    annotation = field_info(field).annotation
    choices = field_choices(field)
    if choices:
        return "{" + ",".join(choices) + "}"
    kinds = set(get_args(annotation)) - {type(None)} or {annotation}
    if bool in kinds:
        return "{true,false}"
    if int in kinds:
        return "PORT" if field.endswith("port") else "N"
    return _METAVAR.get(field, field.split("_")[-1].upper())


def config_help(field: str) -> str:
    """The field's description, its choices when it has some, and its default (argparse-escaped)."""
    info = field_info(field)
    text = info.description or ""
    choices = field_choices(field)
    if choices:
        text += f"; one of {', '.join(choices)}"
    default = info.default
    if "default" not in text and default not in (None, ""):
        shown_default = json.dumps(default) if isinstance(default, bool) else default
        text += f" (default: {shown_default})"
    return text.replace("%", "%%")


def _config_parent() -> Parser:
    parent = Parser(add_help=False)
    common = parent.add_argument_group("configuration (flag > RTUI_* env > rtui.toml > default)")
    common.add_argument("--config", dest="config_file", metavar="FILE", default=argparse.SUPPRESS,
                        help="rtui.toml to read instead of ./rtui.toml or the XDG config dir")
    owners = field_owners()
    every = max(owners.values(), key=len)
    groups: dict[tuple[str, ...], Any] = {}
    for field, whose in owners.items():
        # A target's own settings under its name: each target's config model makes them (backend.config).
        if whose == every:
            group = common
        elif whose not in groups:
            group = groups[whose] = parent.add_argument_group(
                f"{' and '.join(whose)} target{'s' if len(whose) > 1 else ''}")
        else:
            group = groups[whose]
        # --region may be repeated for `rtui check`; everywhere else the last one wins.
        extra: dict[str, Any] = {"action": "append"} if field == "region" else {}
        if config_metavar(field) == "{true,false}":
            extra = {"nargs": "?", "const": "true"}  # `--allow-unpinned` alone says yes
        group.add_argument(flag_name(field), dest=f"cfg_{field}", metavar=config_metavar(field),
                           default=argparse.SUPPRESS, help=config_help(field), **extra)
    return parent


def build_parser() -> Parser:
    common = _config_parent()
    # No abbreviations at the top: it would read a subcommand's own option (`rtui model --to`) as an
    # ambiguous prefix of the shared ones (--tokenizer, --tokens-per-step) before the subcommand sees it.
    parser = Parser(prog="rtui", parents=[common], allow_abbrev=False,
                    description="Fine-tune a model with Ray Train, locally or across GPU machines on AWS.")
    parser.add_argument("--resume", nargs="?", const=LATEST, metavar="RUN_ID",
                        help="reattach the wizard to a run (the latest when RUN_ID is omitted)")
    parser.add_argument("--read-only", action="store_true", help="hide every action that changes anything")
    sub = parser.add_subparsers(dest="command", parser_class=Parser)

    def add(name: str, help_text: str) -> Parser:
        made = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
        assert isinstance(made, Parser)
        return made

    p = add("plan", "show what `up` would create or change")
    p.add_argument("--json", action="store_true")
    p = add("up", "create what the plan says, submit the job and follow it")
    p.add_argument("--yes", action="store_true", help="apply without asking")
    p.add_argument("--until", metavar="ADDRESS|LAYER",
                   help="stop once this resource or layer is in place (e.g. local.ray-head, local-ray)")
    p.add_argument("--az-failover", action="store_true",
                   help="aws: when AWS has no capacity for the GPU nodes in their AZ, move them to the next "
                        "feasible AZ and go on")
    p.add_argument("--json", action="store_true", help="JSON lines of step events")
    p = add("status", "the state of a run, reconciled with what is live")
    p.add_argument("run_id", nargs="?")
    p.add_argument("--json", action="store_true")
    p = add("logs", "print a run's job log; `rtui logs classify FILE...` reports NCCL transports")
    p.add_argument("run_id", nargs="?", help="the run (the latest when omitted); or `classify`, see below")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until the job ends")
    p.add_argument("--job", type=int, metavar="N",
                   help="the run's Nth job (1 is the first submission; default: the latest)")
    p.add_argument("--source", choices=("job", "head"), default="job",
                   help="job: the job's driver log (every worker's lines); head: the Ray head pod's log (kube) "
                        "(default: job)")
    p.epilog = "rtui logs classify FILE... [--json]: which network NCCL used, from job logs (- for stdin)."
    text = "which network NCCL really used (EFA, TCP fallback, IB, intra-node), file by file"
    c = p.add_word_command("run_id", "classify", parents=[common], description=text)
    c.add_argument("files", nargs="*", metavar="FILE", help="a job log; - reads stdin")
    c.add_argument("--json", action="store_true", help="one JSON object per file")
    p = add("down", "tear down everything a run created (its checkpoints and model are kept)")
    p.add_argument("run_id", nargs="?")
    p.add_argument("--yes", action="store_true")
    p.add_argument("--delete-data", action="store_true",
                   help="also delete the run's checkpoints and model (kept otherwise, and listed with their size)")
    p.add_argument("--json", action="store_true")
    p = add("model", "copy a run's model (a Hugging Face directory) to a local directory")
    p.add_argument("run_id", nargs="?", help="the run (the latest when omitted)")
    p.add_argument("--to", metavar="DIR", help="where to copy it (made if missing; default ./rtui-model-RUN_ID)")
    p.add_argument("--json", action="store_true",
                   help="print {uri, format, files, bytes, eval_loss_before, eval_loss_after} and copy only with --to")
    p = add("check", "preflight checks; for aws, a feasibility matrix per region and AZ")
    p.add_argument("--all-regions", action="store_true", help="check every region enabled for the account")
    p.add_argument("--request-quota-increase", action="store_true",
                   help="aws: file a vCPU quota increase request for every short quota (needs --yes)")
    p.add_argument("--yes", action="store_true", help="confirm --request-quota-increase")
    p.add_argument("--json", action="store_true")
    p = add("manifest", "print every Kubernetes object rtui would apply, as YAML; touches no cluster")
    p.add_argument("--run-id", metavar="ID", help="the run id the objects are labelled with (default: a new one)")
    p = sub.add_parser("token", help="print an EKS bearer token as kubectl's exec plugin expects (ExecCredential)",
                       description="An EKS token for kubectl when the AWS CLI is absent: the kubeconfig entry "
                                   "rtui writes calls it. Prints JSON; the token is never stored.")
    p.add_argument("--cluster-name", required=True, metavar="NAME", help="the EKS cluster")
    p.add_argument("--region", required=True, metavar="REGION", help="its region")
    p.add_argument("--profile", metavar="PROFILE", help="AWS profile (else the usual credential chain)")
    p = add("runs", "list runs")
    p.add_argument("--json", action="store_true")
    p.add_argument("--set-aside-corrupt", action="store_true",
                   help="move the run records that cannot be read to the state dir's corrupt/ folder (listing "
                        "only reports them)")
    p = add("config", "show the effective configuration, or confirm ./rtui.toml")
    p.add_argument("action", choices=["show", "trust"],
                   help="show: every field, its value and where it came from; trust: confirm the fields of "
                        "./rtui.toml (or --config FILE) held until you do (all but the training and display knobs; "
                        "`config show` marks them and says why), in its present content")
    p.add_argument("--json", action="store_true")
    _add_bench(sub, common)
    parser.commands = frozenset(sub.choices or ())
    return parser


BENCH_HELP = {
    "fabric": "all-reduce bus-bandwidth sweep across every worker (nccl-tests' busbw), EFA vs forced TCP",
    "ab": "two short training jobs, EFA vs forced TCP: both throughputs and the speedup",
}


def _add_bench(sub: Any, common: argparse.ArgumentParser) -> None:
    """`rtui bench fabric|ab`: starts what the target needs (like `up`), runs the bench jobs."""
    epilog = ("Starts the run's cluster like `rtui up --until head` and leaves it up afterwards (tear it down "
              "with `rtui down --yes`), unless --down is given. On GPU targets each bench runs twice: with the "
              "EFA environment and forced onto TCP (NCCL_NET=Socket, FI_PROVIDER=tcp, NCCL_NET_PLUGIN=none). "
              "The local target has no EFA: one gloo run, and the ratio is null with the reason. Progress goes "
              "to stderr with --json; stdout then holds one JSON object. Results and job logs are kept under "
              "the state dir (bench/RUN_ID/).")
    bench = sub.add_parser("bench", parents=[common], help="measure the fabric before training (fabric, ab)",
                           description="Measure the network a run will train on.", epilog=epilog)
    kinds = bench.add_subparsers(dest="bench", parser_class=Parser, metavar="{fabric,ab}", required=True)
    for kind, text in BENCH_HELP.items():
        p = kinds.add_parser(kind, parents=[common], help=text, description=text, epilog=epilog)
        p.add_argument("--yes", action="store_true", help="start the cluster and run the jobs without asking")
        p.add_argument("--json", action="store_true", help="one JSON object on stdout")
        p.add_argument("--down", action="store_true", help="tear the run down afterwards (also on failure)")
        p.add_argument("--variant", action="append", choices=("efa", "tcp", "gloo"),
                       help="run only this variant (repeatable; default efa and tcp on GPUs, gloo locally)")
        p.add_argument("--timeout", type=_seconds, default=900.0, metavar="SECONDS",
                       help="per job, in seconds (default: 900)")
        if kind == "fabric":
            p.add_argument("--iters", type=int, metavar="N",
                           help="timed all-reduces per size (default 20 on GPUs, 5 on CPU)")
            p.add_argument("--warmup", type=int, metavar="N",
                           help="untimed all-reduces per size (default 5 on GPUs, 2 on CPU)")
            p.add_argument("--max-mib", type=int, metavar="N",
                           help="largest message in MiB (default 1024 on GPUs, 64 on CPU)")
        else:
            p.epilog = epilog + (" Each job trains the run's model for 12 steps locally, 20 on GPUs, unless "
                                 "--steps is given on this command line.")


def _seconds(text: str) -> float:
    """A number of seconds for argparse. float() takes "nan", which every `<= 0` check lets through."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {shown(text)}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds, got {shown(text)}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except RtuiError as exc:
        print(f"rtui: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("rtui: interrupted; nothing was torn down (see `rtui status`)", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def _main(argv: list[str]) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    out = sys.stdout
    if ns.command is None:
        if ns.resume in parser.commands:  # `rtui --resume plan`: the command was taken for a run id
            raise UserError(f"--resume took {ns.resume!r} for a run id; --resume is for the wizard",
                            remedy=f"run `rtui --resume [RUN_ID]` alone, or `rtui {ns.resume}` without it")
        return _wizard(ns)
    # Both are the wizard's options: with a command they would be dropped without a word,
    # and `rtui --read-only up --yes` would change things the user asked to leave alone.
    if ns.resume is not None:
        raise UserError(f"--resume is for the wizard, not `rtui {ns.command}`",
                        remedy="run `rtui --resume [RUN_ID]` alone, or give the run id to the command")
    if ns.read_only:
        raise UserError(f"--read-only is for the wizard, not `rtui {ns.command}`",
                        remedy="drop --read-only; commands that change things already ask for --yes")
    # lazy: the commands load what each needs; the wizard's first frame does without them
    from tui import commands

    return commands.run(ns, out)


def wizard_session(ns: argparse.Namespace) -> tuple[RunSession, list[str], ResolvedConfig | None]:
    """The wizard's run, the live runs to choose from (--resume without an id), and a resolved config
    whose ./rtui.toml fields the first modal asks the user to confirm (None when none waits)."""
    if ns.resume is not None:
        session = RunSession.resume(None if ns.resume == LATEST else ns.resume)
        choose_from = live_run_ids(session.store) if ns.resume == LATEST else []
        return session, choose_from if len(choose_from) > 1 else [], None
    # Checked whole first (a job_env naming credentials stops here); the session starts without
    # ./rtui.toml's unconfirmed fields, which the wizard's first modal asks about.
    confirm = resolved_from(ns, untrusted="show")
    if not confirm.unconfirmed:
        return RunSession.for_config(confirm), [], None
    withheld = resolved_from(ns, untrusted="withhold")
    # The modal asks about all that waits: the whole file when its free knobs need its held fields.
    confirm = confirm.model_copy(update={"unconfirmed": withheld.unconfirmed})
    return RunSession.for_config(withheld), [], confirm


def _wizard(ns: argparse.Namespace) -> int:
    session, choose_from, confirm = wizard_session(ns)
    if not (_is_tty(sys.stdin) and _is_tty(sys.stdout)):
        # Checked after the run is found, so a bad --resume still gets its own message. Without
        # a terminal the app draws into a pipe or file and waits for keys that never come.
        raise UserError("the wizard needs a terminal (stdin or stdout is not one)",
                        remedy="run `rtui` in a terminal; scripts use `rtui plan`, `rtui up --yes`, `rtui status`")
    with loading():  # tui.heap: the app's modules load with the collector paused, then are frozen
        # lazy: Textual only for the wizard: `rtui token` runs on every kubectl call
        from tui.app import RtuiApp

    app = RtuiApp(session, resume=ns.resume is not None, read_only=ns.read_only, choose_from=choose_from,
                  confirm_config=confirm)
    app.run()
    return int(app.return_code or 0)


def live_run_ids(store: RunStore) -> list[str]:
    """Runs not torn down, newest first: what `rtui --resume` without an id chooses from."""
    records, _ = store.list()
    return [r.run_id for r in records if r.status is not RunStatus.DOWN]


def _is_tty(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


if __name__ == "__main__":
    sys.exit(main())
