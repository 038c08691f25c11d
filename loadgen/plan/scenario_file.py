"""Reading a scenario file: the one place YAML is read.

Loading order: bytes → UTF-8 text → YAML nodes (with a budget on what aliases expand to) → Python values →
``${VAR:-default}`` expansion in strings → ``--set`` overrides (dotted paths, list indices as numbers) →
validation (scenario.py's models). Every error is a ``ScenarioError`` naming the field, the bad value and its
line in the file — or the flag or ``--set`` that gave the value; a file with several errors lists every one,
one line each, and an unknown field names the one meant (plan/suggest.py).
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any, Callable

import yaml
from pydantic import ValidationError

from loadgen.core.secrets import clip
from loadgen.plan.bundled import names
from loadgen.plan.nesting import MAX_NESTING, depth, too_deep
from loadgen.plan.scenario import Empirical, Mixture, Scenario, ScenarioError
from loadgen.plan.suggest import suggest

MAX_YAML_VALUES = 100_000  # values a scenario may expand to, aliases counted at each use (an alias bomb: billions)

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_UNION_TAGS = {"fixed", "uniform", "normal", "lognormal", "exponential", "empirical", "mixture"}


def load_scenario(path: Path | str, overrides: list[str] | None = None,
                  flags: dict[str, str] | None = None) -> Scenario:
    """Read, expand, override and validate; ``flags`` names the command-line flag behind an override key
    (``{"load.duration_s": "--duration"}``) so that its errors blame the flag, not the file."""
    path = Path(path)
    root, data = _read_yaml(path)
    refs = env_refs(data)  # before expansion: a masked field's source, for a replay (run.json, docs/shrink.md)
    data = _expand(data)
    blame: dict[str, str] = {}
    for item in overrides or []:
        key, value = parse_override(item)
        blame[key] = (flags or {}).get(key) or f"--set {item}"
        if key.count(".") + 1 + depth(value) > MAX_NESTING:  # the field's path and the value, nested
            raise too_deep(clip(blame[key], 80))
        apply_override(data, key, value)
        refs = {p: t for p, t in refs.items() if ".".join(map(str, p))[:len(key) + 1] not in (key, key + ".")}
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(_format_error(exc, str(path), root, blame)) from None
    return _resolve_paths(scenario, path.parent).with_source(path, overrides or [], refs)


def _read_yaml(path: Path) -> tuple[yaml.Node | None, dict[str, Any]]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror}{_bundled_hint(path, exc)}") from None
    if b"\0" in raw:  # a binary file (YAML forbids NUL; UTF-16 has one in every ASCII character)
        at = raw.index(b"\0")
        line = raw.count(b"\n", 0, at) + 1
        raise ScenarioError(f"{path}:{line}: not a text file (NUL byte at offset {at}); "
                            "a scenario is YAML text in UTF-8")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ScenarioError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                            "save the file as UTF-8") from None
    root, data = _parse_yaml(text, lambda line: f"{path}:{line}" if line else str(path), "not valid YAML")
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: a scenario must be a mapping with name, load and workload")
    return root, data


def _bundled_hint(path: Path, exc: OSError) -> str:
    """For a scenario file that is not there but bundled by that name (the README's ``scenarios/smoke.yaml``
    outside the clone): the commands that run it by name, or copy it to where the user looked."""
    if not isinstance(exc, FileNotFoundError) or path.suffix not in ("", ".yaml") or path.stem not in names():
        return ""
    folder = shlex.quote(str(path.parent))
    return (f"; loadgen ships a scenario of that name: give its name ({path.stem}), e.g. loadgen run "
            f"{path.stem}, or copy it there: loadgen scenario copy {path.stem} {folder}")


def _parse_yaml(text: str, where: Callable[[int | None], str], what: str) -> tuple[yaml.Node | None, Any]:
    """The document's node graph and value, after checking without recursion that it nests at most
    MAX_NESTING levels (PyYAML's composer recurses per level) and, composed, expands to at most
    MAX_YAML_VALUES values nested as deep. ScenarioError: ``where(line)``, then ``what`` and what is wrong."""
    try:
        _check_depth(text, where)
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as exc:  # a ReaderError (a control character) is raised as the stream is opened
        raise ScenarioError(_yaml_error(exc, text, where, what)) from None
    try:
        root = loader.get_single_node()
        _check_size(root, where)
        return root, loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:
        raise ScenarioError(_yaml_error(exc, text, where, what)) from None
    finally:
        loader.dispose()


def _check_depth(text: str, where: Callable[[int | None], str]) -> None:
    """Count the nesting in the parser's events (PyYAML's parser is a state machine: no recursion)."""
    loader, levels = yaml.SafeLoader(text), 0
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, yaml.CollectionStartEvent):
                levels += 1
                if levels > MAX_NESTING:
                    raise too_deep(where(event.start_mark.line + 1))
            elif isinstance(event, yaml.CollectionEndEvent):
                levels -= 1
    finally:
        loader.dispose()


def _yaml_error(exc: yaml.YAMLError, text: str, where: Callable[[int | None], str], what: str) -> str:
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML does not allow (a control character)
        line = text[:exc.position].count("\n") + 1
        return f"{where(line)}: {what}: character U+{exc.character:04X} is not allowed in YAML (a control character)"
    mark, context = getattr(exc, "problem_mark", None), getattr(exc, "context_mark", None)
    opened = f" ({exc.context} at line {context.line + 1})" if context and context != mark else ""
    return f"{where(mark.line + 1 if mark else None)}: {what}: {getattr(exc, 'problem', exc)}{opened}"


def _check_size(root: yaml.Node | None, where: Callable[[int | None], str]) -> None:
    """Refuse a document whose aliases expand to more than MAX_YAML_VALUES values, nest it past MAX_NESTING
    levels (an alias inside an alias adds its levels), or refer to themselves. Sizes and levels are memoized
    per node, so this is linear in the file even when its expansion is not; a loop, not recursion."""
    measured: dict[int, tuple[int, int]] = {}  # node → (values, levels of collections)
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)] if root is not None else []
    while stack:
        node, children_done = stack.pop()
        key, line = id(node), node.start_mark.line + 1
        children = _children(node)
        if children_done:
            total = 1 + sum(measured[id(c)][0] for c in children)
            levels = max((measured[id(c)][1] for c in children), default=0) + isinstance(node, yaml.CollectionNode)
            if total > MAX_YAML_VALUES:
                raise ScenarioError(f"{where(line)}: the YAML expands to over {MAX_YAML_VALUES:,} values (aliases "
                                    "repeated inside aliases?)")
            if levels > MAX_NESTING:
                raise too_deep(where(line))
            open_nodes.discard(key)
            measured[key] = (total, levels)
        elif key in open_nodes:
            raise ScenarioError(f"{where(line)}: an alias refers to itself (recursive YAML)")
        elif key not in measured:
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in measured)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def env_refs(value: Any, path: tuple[str | int, ...] = ()) -> dict[tuple[str | int, ...], str]:
    """Each string that refers to an environment variable (``${VAR}``), by its path, as written (unexpanded)."""
    if isinstance(value, str):
        return {path: value} if _ENV.search(value) else {}
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return {p: t for k, v in items for p, t in env_refs(v, (*path, k)).items()}


def _expand(value: Any, where: str = "") -> Any:
    if isinstance(value, str):
        def sub(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            if os.environ.get(name):  # as in the shell, ":-" also replaces an empty value (an unset CI secret)
                return os.environ[name]
            if default is None and name in os.environ:
                return ""
            if default is None:
                raise ScenarioError(f"{where or 'value'}: environment variable {name} is not set and has no "
                                    f"default (write ${{{name}:-default}})")
            return default
        return _ENV.sub(sub, value)
    if isinstance(value, dict):
        return {k: _expand(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{where}.{i}") for i, v in enumerate(value)]
    return value


def parse_override(item: str) -> tuple[str, Any]:
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ScenarioError(f"--set {item!r}: expected FIELD=VALUE, e.g. load.rate_per_s=8")
    return key.strip(), _parse_yaml(text, lambda line: f"--set {clip(item, 80)!r}", "value is not valid YAML")[1]


def apply_override(data: dict[str, Any], key: str, value: Any) -> None:
    node: Any = data
    parts = key.split(".")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ScenarioError(f"--set {key}: {'.'.join(parts[:i]) or 'value'} has no item {part}")
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                node = node.setdefault(part, {})
        else:
            raise ScenarioError(f"--set {key}: {'.'.join(parts[:i])} is not a mapping")


def _line_of(root: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the deepest node on ``loc`` that exists in the YAML file."""
    node, line = root, None
    for part in loc:
        if node is None:
            break
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == str(part)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            node = None
    if node is not None:
        line = node.start_mark.line + 1
    return line


def _format_error(exc: ValidationError, source: str, root: yaml.Node | None, blame: dict[str, str]) -> str:
    """Every validation error, one line each: where (file:line, or the flag or --set that gave the value), the
    field, what is wrong, and for an unknown field the one meant ("did you mean load.rate_per_s?")."""
    lines: list[str] = []
    for error in exc.errors():
        line = _error_line(error, source, root, blame)
        if line not in lines:
            lines.append(line)
    return "\n".join(lines)


def _error_line(error: Any, source: str, root: yaml.Node | None, blame: dict[str, str]) -> str:
    loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p in _UNION_TAGS))
    field = ".".join(str(p) for p in loc) or "(top level)"
    value = error.get("input")
    shown = "" if isinstance(value, dict) or error["type"] == "missing" else f" (got {value!r})"
    culprits = [flag for key, flag in blame.items()
                if field == key or field.startswith(key + ".") or key.startswith(field + ".")]
    culprit = ", ".join(culprits) if culprits else None
    if culprit is None:
        line = _line_of(root, loc)
        culprit = f"{source}:{line}" if line else source
    hint = ""
    if error["type"] == "extra_forbidden" and loc:
        meant = suggest(Scenario, loc[:-1], str(loc[-1]))
        hint = f"; did you mean {'.'.join(str(p) for p in (*loc[:-1], meant))}?" if meant else ""
    return f"{culprit}: {field}: {error['msg']}{shown}{hint}"


def _resolve_paths(scenario: Scenario, base: Path) -> Scenario:
    """Relative files (traces, empirical histograms, tokenizers, TLS files) are relative to the scenario file."""
    def at(p: Path) -> Path:
        return p if p.is_absolute() else base / p

    def resolve(p: Path | None) -> Path | None:
        return None if p is None else at(p)

    if scenario.load.trace:
        scenario.load.trace.path = at(scenario.load.trace.path)
    for cls in scenario.workload.classes:
        dists = [cls.prompt_tokens, cls.output_tokens]
        if cls.conversation is not None:
            dists += [cls.conversation.turns, cls.conversation.first_prompt_tokens]
        for dist in dists:
            _resolve_dist_files(dist, resolve)
        if cls.dataset is not None:
            cls.dataset = cls.dataset.model_copy(update={"path": resolve(cls.dataset.path)})
    t = scenario.target
    t.tokenizer = resolve(t.tokenizer)
    t.tls.ca_bundle, t.tls.client_cert, t.tls.client_key = (resolve(t.tls.ca_bundle), resolve(t.tls.client_cert),
                                                            resolve(t.tls.client_key))
    _check_files(scenario)
    return scenario


def _resolve_dist_files(dist: object, resolve: Callable[[Path | None], Path | None]) -> None:
    """Every ``file`` of an empirical distribution, at any depth of mixtures, made relative to the scenario."""
    if isinstance(dist, Empirical) and dist.file:
        dist.file = resolve(dist.file)
    elif isinstance(dist, Mixture):
        for component in dist.components:
            _resolve_dist_files(component.dist, resolve)


def _check_files(scenario: Scenario) -> None:
    """Files the target needs exist, and the tokenizer file has its library (before anything is sent)."""
    t = scenario.target
    for field, path in (("target.tokenizer", t.tokenizer), ("target.tls.ca_bundle", t.tls.ca_bundle),
                        ("target.tls.client_cert", t.tls.client_cert), ("target.tls.client_key", t.tls.client_key)):
        if path is not None and not path.is_file():
            raise ScenarioError(f"{field}: no such file: {path}")
    for cls in scenario.workload.classes:
        if cls.dataset is not None and not cls.dataset.path.exists():
            raise ScenarioError(f"workload.classes[{cls.name}].dataset.path: no such file: {cls.dataset.path}")
    if t.tokenizer is not None:
        try:
            import tokenizers  # noqa: F401
        except ImportError:
            raise ScenarioError("target.tokenizer needs the tokenizers library: pip install 'loadgen[tokenizers]'") \
                from None
