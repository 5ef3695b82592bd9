"""Every `foxformer ...` command shown in the README and docs/ parses with the current CLI (docs that
quote a removed flag or a renamed command fail here, not in a user's terminal). Commands with
placeholders (`...`, `[optional]`, `<...>`, `RUN_A`) are skipped there; their flags, the flags of the commands the
scripts run and the package's messages and help texts show, the config keys they set, and the files, script steps and
Python names the docs point at, are checked below. Nothing is executed."""
import re
import shlex
from pathlib import Path

import pytest

from foxformer.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "src").rglob("README.md"))]
PREFIX = re.compile(r"^(?:PYTHONPATH=\S+\s+)?(?:\.venv/bin/)?(?:python -m foxformer\.cli|foxformer)\s+(.*)$")


def _commands():
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        fenced = [False] * len(lines)  # inside ``` blocks
        inside = False
        for n, line in enumerate(lines):
            if line.strip().startswith("```"):
                inside = not inside
            fenced[n] = inside
        i = 0
        while i < len(lines):
            if not (lines[i].startswith("    ") or fenced[i]):  # code only, not prose
                i += 1
                continue
            text, start = lines[i].strip(), i + 1
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1] + " " + lines[i].strip()
            i += 1
            text = text.split(" #")[0].strip().strip("`")
            m = PREFIX.match(text)
            if m and not re.search(r"\.\.\.|\[|<|RUN_[A-Z]|[A-Z]{3,}_DIR", m.group(1)):
                yield pytest.param(m.group(1), id=f"{doc.relative_to(ROOT)}:{start}")


COMMANDS = list(_commands())


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 10


@pytest.mark.parametrize("command", COMMANDS)
def test_documented_command_parses(command):
    parser = build_parser()
    try:
        args = parser.parse_args(shlex.split(command))
    except SystemExit as e:
        pytest.fail(f"`foxformer {command}` does not parse (exit {e.code})")
    assert callable(getattr(args, "func", None)), command


TRAIN_COMMANDS = [c for c in COMMANDS if c.values[0].startswith("train ")]


@pytest.mark.parametrize("command", TRAIN_COMMANDS)
def test_documented_train_command_makes_a_valid_config(command):
    """The README's 125M line parsed but failed as written: 'total_tokens / max_steps: set at least one'."""
    from foxformer.train.cli import _overrides
    from foxformer.train.config import load_config

    args = build_parser().parse_args(shlex.split(command))
    overrides = _overrides(args)
    if args.config is None and set(overrides) == {"out_dir"}:
        pytest.skip("continues a run from its config.yaml")
    load_config(args.config, overrides)


# The checks above parse only complete commands. Below, what they skip: the flags of commands with placeholders
# (`foxformer eval niah RUN_DIR --lengths ...`), of `torchrun ... -m foxformer.cli`, of the `# = foxformer ...`
# lines under `gpu_bench.sh` steps and of commands quoted in prose; argparse would also take an abbreviation of a
# renamed flag. The same for the `$FX ...` commands of scripts/*.sh and the commands the package's own messages,
# docstrings and help texts show. And the config keys, files, steps and Python names the docs point at.
MAIN_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "src").rglob("README.md"))]
COMMAND = re.compile(r"(?:-m foxformer\.cli|(?<![\w/.-])(?<!from )(?<!import )foxformer)\s+([a-z-][^`]*)")


def _quoted_commands():
    """(doc:line, text after `foxformer`) for every command in code lines and in `inline code` of the prose."""
    for doc in MAIN_DOCS:
        lines, fenced, inside = doc.read_text().splitlines(), [], False
        for line in lines:
            inside ^= line.strip().startswith("```")
            fenced.append(inside or line.strip().startswith("```"))
        paragraph, i = [], 0
        while i <= len(lines):
            code = i < len(lines) and (fenced[i] or lines[i].startswith("    "))
            if i == len(lines) or code or not lines[i].strip():  # a paragraph of prose ends
                for span in re.findall(r"`([^`]+)`", " ".join(paragraph)):
                    for m in COMMAND.finditer(span):
                        yield f"{doc.relative_to(ROOT)}:{i}", m.group(1)
                paragraph = []
            if i == len(lines):
                break
            if not code:
                paragraph.append(lines[i].strip())
                i += 1
                continue
            text, start = lines[i], i + 1
            while text.endswith("\\") and i + 1 < len(lines):  # continuations, a `# = ...` comment's too
                i += 1
                text = text[:-1] + " " + lines[i].strip().lstrip("#")
            i += 1
            for m in COMMAND.finditer(text.strip().lstrip("#").strip()):
                yield f"{doc.relative_to(ROOT)}:{start}", m.group(1).split(" #")[0]


def _subparsers(parser):
    import argparse

    return next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


def _script_commands():
    """(script:line, text after `$FX`) for the commands the GPU scripts run, whose outputs are the published numbers:
    a renamed flag fails here, not minutes into a lent machine's call. gpu_bench.sh's `GRAPHS="$FX bench decode ..."`
    stands for its prefix."""
    for script in sorted((ROOT / "scripts").glob("*.sh")):
        text = script.read_text()
        prefixes = dict(re.findall(r'^(\w+)="\$FX ([^"]*)"$', text, re.M))
        lines, i = text.splitlines(), 0
        while i < len(lines):
            line, start = lines[i], i + 1
            while line.endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line[:-1] + " " + lines[i].strip()
            i += 1
            for name, prefix in prefixes.items():
                line = line.replace(f"${name} ", f"$FX {prefix} ")
            for m in re.finditer(r"\$FX\s+([a-z][^;|&>]*)", line):
                yield f"{script.relative_to(ROOT)}:{start}", m.group(1)


def _code_commands():
    """Commands the package itself shows: the hints of its errors and messages (`resume with: foxformer train --out
    RUN`), docstrings and every parser's help text. Prose such as "foxformer model" names no command and is left out."""
    parser = build_parser()
    top = set(_subparsers(parser))
    for source in sorted((ROOT / "src").rglob("*.py")):
        lines, i = source.read_text().splitlines(), 0
        while i < len(lines):
            line, start = lines[i], i + 1
            # a message's string literals run on over lines: "... `foxformer data "\n f"prepare` ..."
            while re.search(r'"$', line) and i + 1 < len(lines) and re.match(r'\s*[rbf]*"', lines[i + 1]):
                i += 1
                line = re.sub(r'"$', "", line) + re.sub(r'^\s*[rbf]*"', "", lines[i])
            i += 1
            for m in COMMAND.finditer(line):
                if m.group(1).split()[0] in top:
                    yield f"{source.relative_to(ROOT)}:{start}", m.group(1)
    pending = [([], parser)]
    while pending:
        path, p = pending.pop()
        pending += [(path + [name], sub) for name, sub in _subparsers(p).items()]
        for text in [p.description, p.epilog, *(a.help for a in p._actions)]:
            for m in COMMAND.finditer(" ".join((text or "").split())):
                if m.group(1).split()[0] in top:
                    yield f"help of foxformer {' '.join(path)}", m.group(1)


def _flag_cases():
    parser, seen = build_parser(), set()
    for where, command in [*_quoted_commands(), *_script_commands(), *_code_commands()]:
        words, p, path = command.split(), parser, []
        while words and words[0].rstrip(";:,.)") in _subparsers(p):  # `foxformer data prepare`; default: ...
            p = _subparsers(p)[words[0].rstrip(";:,.)")]
            path.append(words.pop(0).rstrip(";:,.)"))
        if words and "|" in words[0] and set(words[0].split("|")) <= set(_subparsers(p)):  # bench attention|model
            continue
        if words and path and _subparsers(p) and re.match(r"[<{.]", words[0]):  # eval {loss,niah,...}, bench <what>
            continue
        if (not path or _subparsers(p)) and not (words and words[0].startswith("-")):
            yield pytest.param(where, command, None, id=f"{where}:{command[:30]}")
            continue
        for flag in (w.strip("`,.()\"'").split("=")[0] for w in words if w.startswith("--")):
            if (" ".join(path), flag) not in seen:
                seen.add((" ".join(path), flag))
                yield pytest.param(p, " ".join(path), flag, id=f"{where}:{' '.join(path)} {flag}")


@pytest.mark.parametrize("parser,command,flag", list(_flag_cases()))
def test_documented_flag_exists(parser, command, flag):
    assert flag is not None, f"`foxformer {command}`: no such command"
    flags = {s for a in parser._actions for s in a.option_strings}
    assert flag in flags, f"`foxformer {command}` has no {flag} (its flags: {sorted(flags)})"


def test_documented_config_keys_exist():
    """`--set KEY=VALUE` names a TrainConfig key, `--model KEY=VALUE` and `PRESET:KEY=VALUE,...` (bench model
    --presets, eval mqar --models, reproduce.sh's runs) FoxConfig fields, in the docs, the scripts and the code's
    own hints: a misspelt key is refused, so a documented one that no longer exists stops the command it is in."""
    import dataclasses

    from foxformer.models.presets import model_keys
    from foxformer.train.config import TrainConfig

    train_keys, fox_keys = {f.name for f in dataclasses.fields(TrainConfig)}, set(model_keys())
    sources = [*MAIN_DOCS, *sorted((ROOT / "scripts").glob("*.sh")), *sorted((ROOT / "src").rglob("*.py"))]
    unknown, seen = [], 0
    for source in sources:
        text = source.read_text()
        for m in re.finditer(r"--(set|model)[ =][\'\"]?([\w.]+)=", text):
            kind, key = m.groups()
            if kind == "set" and key.startswith("model."):
                kind, key = "model", key[len("model."):]
            seen += 1
            if key not in (train_keys if kind == "set" else fox_keys):
                unknown.append(f"{source.relative_to(ROOT)}: --{kind} {key}=")
        for m in re.finditer(r"(?<![\w-])(?:fox|transformer|linear)-[\w.-]*:((?:\w+=[^\s,`\'\"]+,?)+)", text):
            for key in (item.split("=")[0] for item in m.group(1).split(",") if "=" in item):
                seen += 1
                if key not in fox_keys:
                    unknown.append(f"{source.relative_to(ROOT)}: {m.group(0)}")
    assert seen >= 10 and not unknown, unknown


# Names in the docs that are no files of this repository: what an export writes, and the paper's code.
NOT_OURS = {"configuration_foxformer.py", "modeling_foxformer.py", "eval/lm_eval_harness/run_lm_eval.py"}


def test_documented_files_exist():
    """Every `*.py` / `*.sh` the docs name (a path, or one relative to a package: `hopper/launch.py`) and every
    scripts/, tests/, src/foxformer/ or docs/ path is a file of the repository, and every relative link resolves."""
    files = {str(f.relative_to(ROOT)) for d in ("src", "tests", "scripts", "docs") for f in (ROOT / d).rglob("*")}
    missing = []
    for doc in MAIN_DOCS:
        text = doc.read_text()
        for m in re.finditer(r"(?<![\w/.-])(\w[\w/.-]*\.(?:py|sh))\b", text):
            name = m.group(1)
            if name not in NOT_OURS and not any(f == name or f.endswith("/" + name) for f in files):
                missing.append(f"{doc.relative_to(ROOT)}: {name}")
        for m in re.finditer(r"(?<![\w/.-])((?:scripts|tests|src/foxformer|docs)/[\w./*-]*[\w*/])", text):
            if not any(ROOT.glob(m.group(1).rstrip("."))):
                missing.append(f"{doc.relative_to(ROOT)}: {m.group(1)}")
        for m in re.finditer(r"\]\(([^)#\s]+)\)", text):
            if not m.group(1).startswith("http") and not (doc.parent / m.group(1)).exists():
                missing.append(f"{doc.relative_to(ROOT)}: link {m.group(1)}")
    assert not missing, missing


def test_documented_script_steps_exist():
    """`gpu_bench.sh STEP...`, `multigpu.sh STEP...` and `issue20.sh WHAT` name steps the scripts have."""
    steps = {s: set(re.findall(r"^\s*([a-z0-9][a-z0-9-]*)\)", (ROOT / "scripts" / s).read_text(), re.M))
             for s in ("gpu_bench.sh", "multigpu.sh", "issue20.sh")}
    unknown = []
    for doc in MAIN_DOCS:
        for m in re.finditer(r"(gpu_bench\.sh|multigpu\.sh|issue20\.sh)((?:[ \t]+[a-z][a-z0-9-]*)+)", doc.read_text()):
            words = m.group(2).split()[:1] if m.group(1) == "issue20.sh" else m.group(2).split()
            unknown += [f"{doc.relative_to(ROOT)}: {m.group(1)} {w}" for w in words if w not in steps[m.group(1)]]
    assert not unknown, unknown


def test_documented_python_names_resolve():
    """`foxformer.ops.pruning_stats`, `foxformer.models.official.convert_official`, ...: each imports."""
    import importlib

    names = {m.group(1) for doc in MAIN_DOCS for m in re.finditer(r"(?<![\w.])(foxformer(?:\.\w+)+)", doc.read_text())}
    assert len(names) >= 5
    broken = []
    for name in sorted(names):
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
                break
            except ModuleNotFoundError:
                continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            broken.append(name)
    assert not broken, broken


def test_modules_the_docs_run_with_python_m_are_scripts_their_packages_do_not_import():
    """`python -m foxformer.models.presets` (docs/results.md) printed runpy's RuntimeWarning: foxformer.models
    imports presets, so runpy found the module loaded before running it as __main__. `foxformer presets` is that
    table's command. A module shown with `python -m` (in the docs or a docstring) has a __main__ guard and is not
    imported by its packages."""
    import os
    import subprocess
    import sys

    texts = [doc.read_text() for doc in MAIN_DOCS] + [f.read_text() for f in (ROOT / "src").rglob("*.py")]
    names = sorted({m.group(1) for text in texts for m in re.finditer(r"python -m (foxformer(?:\.\w+)+)", text)})
    assert "foxformer.cli" in names and "foxformer.models.presets" not in names
    for name in names:
        source = ROOT / "src" / (name.replace(".", "/") + ".py")
        assert 'if __name__ == "__main__":' in source.read_text(), name
    parents = sorted({n.rpartition(".")[0] for n in names})
    code = (f"import importlib, sys\nfor p in {parents!r}: importlib.import_module(p)\n"
            f"print([n for n in {names!r} if n in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert out.stdout.strip() == "[]", out.stdout
