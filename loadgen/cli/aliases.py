"""The old flag names, kept for one release: argv is rewritten to the new names (cli/vocabulary.py ALIASES)
before click parses it, with one warning line on stderr per old name. Stops at ``--`` (what follows goes to a
server); handles ``--old=value``; a value that looks like a flag (``--set --rates``) is left alone; an old name
is rewritten only where its command has the new one and not the old (a command not yet renamed keeps working).
The root group also names every value its commands' help shows (name_values)."""

from __future__ import annotations

from typing import Any

from typer.core import TyperGroup

from loadgen.cli.common import fail
from loadgen.cli.vocabulary import (ALIASES, FALSE_WORDS, FLAGS, KIND_METAVARS, METAVARS, REMOVED_IN, TRUE_WORDS,
                                   VALUE_ALIASES, warn)


def command_path(root: Any, args: list[str]) -> tuple[str, Any, int]:
    """The command ARGS name ("target vllm"), its click command, and where its own arguments start."""
    names: list[str] = []
    command, i = root, 0
    while getattr(command, "commands", None) is not None:
        while i < len(args) and args[i].startswith("-") and args[i] != "--":
            i += 1  # the group's own options (--version, -h) take no value
        if i >= len(args) or args[i] not in command.commands:
            break
        command = command.commands[args[i]]
        names.append(args[i])
        i += 1
    return " ".join(names), command, i


def _option_names(command: Any) -> tuple[set[str], set[str]]:
    """Every option name of the command, and those that take a value."""
    names: set[str] = set()
    valued: set[str] = set()
    for param in getattr(command, "params", []):
        opts = [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]
        if getattr(param, "param_type_name", "") != "option":
            continue
        names.update(opts)
        if not getattr(param, "is_flag", False) and not getattr(param, "count", False):
            valued.update(opts)
    return names, valued


def rewrite(root: Any, args: list[str]) -> list[str]:
    """ARGS with the old flag names of their command replaced by the new ones (warning once per name)."""
    path, command, start = command_path(root, args)
    renames, valued_bools = ALIASES.get(path, {}), VALUE_ALIASES.get(path, frozenset())
    if not renames and not valued_bools:
        return list(args)
    names, valued = _option_names(command)
    renames = {old: new for old, new in renames.items() if new in names and old not in names}
    out, warned = list(args[:start]), set()
    i = start
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return out + args[i:]
        name, eq, value = arg.partition("=")
        if name in renames:
            if name not in warned:
                warn(f"{name} is now {renames[name]} (the old name goes in {REMOVED_IN})")
                warned.add(name)
            name = renames[name]
            arg = name + eq + value
        if name in valued_bools and (eq or i + 1 < len(args) and not args[i + 1].startswith("-")):
            out.append(_bool_word(name, value if eq else args[i + 1]))  # the command takes no argument
            i += 1 if eq else 2
            continue
        out.append(arg)
        i += 1
        if name in valued and not eq and i < len(args):
            out.append(args[i])  # its value, whatever it looks like
            i += 1
    return out


def _bool_word(name: str, word: str) -> str:
    """``--chunked-prefill off`` → ``--no-chunked-prefill`` (warned); a word that is no boolean: exit 2."""
    pair = f"{name}/--no-{name[2:]}"
    if word.lower() not in TRUE_WORDS | FALSE_WORDS:
        raise fail(f"{name} {word}: a switch, written {pair}")
    warn(f"{name} {word} is now {pair} (the old form goes in {REMOVED_IN})")
    return name if word.lower() in TRUE_WORDS else f"--no-{name[2:]}"


def name_values(command: Any, path: str = "") -> None:
    """Every value in COMMAND's help (and its subcommands') named as cli/vocabulary.py METAVARS says, where its
    option names none: ``--set FIELD=VALUE``, ``--port PORT``, never typer's ``<list[str]>`` or ``<int range>``
    (the range still shows, as ``[1<=x<=100]``); an argument by its name in capitals (``RUN_DIR``)."""
    for param in getattr(command, "params", []):
        if param.metavar is not None or getattr(param, "is_flag", False):
            continue
        if getattr(param, "param_type_name", "") == "argument":
            param.metavar = param.name.upper()
            continue
        flag, described = param.opts[0], getattr(param, "type_descriptor", None)
        choices = [str(getattr(c, "value", c)) for c in getattr(described, "choices", None) or ()]
        numeric = getattr(described, "annotation", None) in (int, float)
        kind = FLAGS[flag].kind if flag in FLAGS else "number" if numeric else "text"
        shown = "|".join(choices) if choices else KIND_METAVARS[kind]
        param.metavar = METAVARS.get(f"{path} {flag}".strip(), METAVARS.get(flag, shown))
    for name, sub in getattr(command, "commands", {}).items():
        name_values(sub, f"{path} {name}".strip())


class Group(TyperGroup):
    """loadgen's command groups (``typer.Typer(cls=Group)``): typer's, with the help option's value False when
    it is not given. Typer coerces a None through pydantic, which it imports for that: 0.1 s of every subcommand's
    start (``loadgen run -h`` passes the root group's help option unset); a bool it passes as is."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        if option is not None:
            option.default = False
        return option


class AliasGroup(Group):
    """The root group: names the values in every command's help (name_values); rewrites the old flag names of
    the command it is about to run, then parses."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        name_values(self)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, rewrite(self, args))


__all__ = ["AliasGroup", "Group", "command_path", "name_values", "rewrite"]
