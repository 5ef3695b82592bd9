"""Load trained models (evaluation, generation, benchmarks) from a run dir, one of its checkpoints, or a
Hugging Face folder. It lives with the checkpoints it reads, below every area that loads models.

Accepted paths:
  ``RUN_DIR``                        (has config.yaml): its latest checkpoint, else ``RUN_DIR/hf``
  ``RUN_DIR/checkpoints/step_N``     one checkpoint of a run (full or sharded, verified against meta.json)
  ``HF_DIR``                         (has config.json): ``FoxForCausalLM.from_pretrained`` (or AutoModelForCausalLM);
                                     a checkpoint of the FoX paper's own code converted in memory (models.official)
  ``owner/name``                     a Hugging Face Hub repository id (no such local path): downloaded, then as HF_DIR
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from safetensors import SafetensorError

from foxformer.argtypes import SettingError, setting_name, unset_said
from foxformer.data.preparation import (MANIFEST, is_dataset, read_manifest, recorded_tokenizer_files,
                                       tokenizer_change)
from foxformer.data.tokenizer import moved_hint, same_tokenizer
from foxformer.models.calls import hf_progress
from foxformer.models.config import ConfigError, FoxConfig
from foxformer.models.hub import download, is_hub_id
from foxformer.models.official import OFFICIAL_TYPES, load_official

from .checkpoint import CheckpointError, latest_checkpoint, read_meta
from .config import read_model_config, read_yaml, saved_model_config
from .distributed import resolve_device
from .sharded import read_model_state_dict

RUN_CONFIG = "config.yaml"
DEFAULT_TOKENIZER = "gpt2"  # what models that name no tokenizer are fed


@dataclass
class LoadedModel:
    """A model ready for evaluation plus what the plots need to know about it.

    train_len: the training context length (None if unknown); tokenizer: spec string such as "gpt2";
    source: "run" | "checkpoint" | "hf"; step: training step of the weights (None if unknown);
    data_dir: the prepared dataset its run trained on (None if unknown); tokenizer_files: the content fingerprint
    of its tokenizer folder as its run recorded it (data.tokenizer.tokenizer_files; None for other tokenizers and
    unknown ones), which tells the folder moved elsewhere from another tokenizer.
    """

    model: torch.nn.Module
    name: str
    path: str
    train_len: Optional[int] = None
    tokenizer: Optional[str] = None
    source: str = "hf"
    step: Optional[int] = None
    data_dir: Optional[str] = None
    tokenizer_files: Optional[str] = None


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device, label: str = "{}") -> torch.dtype:
    """"auto" -> bf16 on CUDA, fp32 on CPU. ``label``: how an error names the setting (argtypes.setting_name)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    table = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
             "fp16": torch.float16, "float16": torch.float16, "fp64": torch.float64}
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in table:
        raise ValueError(f"{setting_name(label, 'dtype')}: expected one of auto, {', '.join(table)}, got {dtype!r}")
    return table[dtype]


def read_run_config(path: str) -> dict:
    """A run's config.yaml as saved (settings and derived facts)."""
    data = read_yaml(path, "model") or {}
    if not isinstance(data, dict):
        raise SettingError("model", f"{path} is not a mapping; is this a foxformer run dir?")
    return data


def _strip_prefixes(sd: dict) -> dict:
    """Drop wrapper prefixes (torch.compile, DDP) that a raw state dict may carry."""
    out = {}
    for key, value in sd.items():
        for prefix in ("_orig_mod.", "module."):
            while key.startswith(prefix):
                key = key[len(prefix):]
        out[key] = value
    return out


def _model_from_run_config(run_cfg: dict, state_dict: dict, run_dir: str):
    from foxformer.models import FoxForCausalLM

    preset = run_cfg.get("preset", "fox-pro-tiny")
    vocab = (run_cfg.get("derived") or {}).get("vocab_size") or run_cfg.get("vocab_size")
    emb = state_dict.get("model.embed_tokens.weight")
    if emb is not None:  # the weights are the ground truth for the vocabulary size
        vocab = int(emb.shape[0])
    if vocab is None:
        raise SettingError("model", "the run's config.yaml has no vocab_size and the checkpoint has no embedding")
    model = FoxForCausalLM(saved_model_config(run_dir, run_cfg, vocab))
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not model.config.tie_embeddings]
    if missing or unexpected:
        raise SettingError("model", f"checkpoint does not match preset {preset!r} with {run_cfg.get('model') or {}}: "
                                    f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model


def _load_checkpoint_dir(path: str, run_dir: str):
    cfg_path = os.path.join(run_dir, RUN_CONFIG)
    if not os.path.exists(cfg_path):
        raise SettingError("model", f"checkpoint {path!r} has no {RUN_CONFIG} two levels up ({run_dir!r}); "
                                    f"cannot tell which model it holds")
    try:
        sd = read_model_state_dict(path)  # verifies every file against meta.json first
    except CheckpointError as e:  # the training advice (resume from another) does not apply here
        raise SettingError("model", f"{e}; load another checkpoint (RUN/checkpoints/step_N) or the run's Hugging Face "
                                    f"export (RUN/hf)") from None
    except (OSError, RuntimeError, EOFError) as e:
        raise SettingError("model", f"could not read checkpoint {path!r} ({e})") from e
    step = read_meta(path).get("step")
    run_cfg = read_run_config(cfg_path)
    return _model_from_run_config(run_cfg, _strip_prefixes(sd), run_dir), run_cfg, step


def _load_hf_dir(path: str, attention_backend: Optional[str], label: str, among_others: bool = False):
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        try:
            model_type = json.load(f).get("model_type")
        except json.JSONDecodeError as e:
            raise SettingError("model", f"{path}/config.json is not valid JSON ({e})") from e
    # another library's model has no attention backend to set: the value was dropped without a word; refused
    # here, from config.json, before its weights load (the official types load as FoxForCausalLM)
    if attention_backend is not None and not among_others and model_type not in ("foxformer", *OFFICIAL_TYPES):
        raise ValueError(f"{setting_name(label, 'attention_backend')}: only foxformer models have attention "
                         f"backends; {path} is {'a ' + model_type if model_type else 'no foxformer'} model; "
                         f"{unset_said(label)} for it")
    if model_type in OFFICIAL_TYPES:  # their layout, mapped exactly in memory (what `convert official` saves)
        try:
            return load_official(path)
        except ValueError as e:
            raise SettingError("model", str(e)) from None
    try:
        if model_type == "foxformer":
            from foxformer.models import FoxForCausalLM

            return FoxForCausalLM.from_pretrained(path)
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(path)
    except (OSError, RuntimeError, KeyError, SafetensorError) as e:  # SafetensorError: a truncated file
        raise SettingError("model", f"could not load Hugging Face folder {path!r} ({e}); if it was cut short, export "
                                    f"it again (foxformer export-hf RUN)") from e


_UNTOLD = object()  # _named_tokenizer's answer where only the loaded model tells


def _named_tokenizer(path: str, config=None):
    """The tokenizer spec the model at the local ``path`` names (LoadedModel.tokenizer; None where it names none):
    its run's config.yaml "tokenizer", else, where a Hugging Face folder loads (``path``, or a run dir's hf/ export
    where the run has no checkpoint), the spec its config names, else the tokenizer files beside it ("hf:FOLDER").
    ``config``: the loaded model's config (load_model), else the folder's config.json is read, before the weights
    load; _UNTOLD there for an official checkpoint (models.official tells its tokenizer from its weights) and for a
    config.json that cannot be read. Raises OSError or ValueError for a config.yaml or checkpoint pointer that
    cannot be read."""
    run = run_dir_of(path)
    spec = read_run_config(os.path.join(run, RUN_CONFIG)).get("tokenizer") if run else None
    if spec:
        return spec
    if _is_checkpoint_dir(path):
        return None
    if os.path.exists(os.path.join(path, RUN_CONFIG)):  # a run dir: its latest checkpoint, else its hf/ export
        if latest_checkpoint(path) is not None:
            return None
        path = os.path.join(path, "hf")
    if not os.path.exists(os.path.join(path, "config.json")):
        return None
    if config is not None:
        spec = getattr(config, "tokenizer", None)
    else:
        saved = saved_config(path)
        if saved is None or saved.get("model_type") in OFFICIAL_TYPES:
            return _UNTOLD
        spec = saved.get("tokenizer")
    if spec:
        return spec
    if any(os.path.exists(os.path.join(path, name)) for name in ("tokenizer.json", "tokenizer_config.json")):
        return f"hf:{path}"
    return None


def load_model(path: str, *, device: str | torch.device | None = "auto", dtype: str | torch.dtype | None = "auto",
               name: Optional[str] = None, train_len: Optional[int] = None,
               attention_backend: Optional[str] = None, progress: bool = True, label: str = "{}",
               among_others: bool = False, said_as: Optional[str] = None) -> LoadedModel:
    """Load ``path`` (see the module docstring) in eval mode on ``device``.

    ``train_len`` overrides the training context length read from the run's config.yaml (HF folders
    inside a run dir, ``RUN_DIR/hf``, find it too). ``progress``: transformers' weight-loading bars.
    Raises ValueError for anything that is not a model; a bad device, dtype or attention backend, or an attention
    backend for another library's model (which has none), before the weights load, named as ``label`` names
    settings (argtypes.setting_name: "--{}" by their flags). ``among_others``: the model is one of several
    compared under one attention backend (eval), so another library's keeps its own attention instead.
    ``said_as``: how the user named ``path`` where not as ``model`` (a command's flag --model), which the errors
    about the model then name it by.
    """
    # 0 or a negative count (--train-len of eval and bias-shift) was taken as no training length: every position
    # counted as within it, without a word
    if train_len is not None and (isinstance(train_len, bool) or not isinstance(train_len, int) or train_len < 1):
        raise ValueError(f"{setting_name(label, 'train_len')}: expected the training context, a positive number of "
                         f"tokens, got {train_len!r}")
    device = resolve_device(device, setting_name(label, "device"))
    dtype = resolve_dtype(dtype, device, label)
    if attention_backend is not None:
        try:
            FoxConfig.check_attention_backend(attention_backend)
        except ConfigError as e:
            # the keyword's (or the flag's) user typed no FoxConfig attribute
            raise ConfigError(e.reason, *e.fields, where=f"{setting_name(label, e.fields[0])}: ") from None
    with hf_progress(progress), _model_said_as(said_as):
        return _load_model(path, device, dtype, name, train_len, attention_backend, label, among_others)


@contextlib.contextmanager
def _model_said_as(said_as: Optional[str]):
    """A refusal of the model (SettingError "model") named as ``said_as``, where the user named it so."""
    try:
        yield
    except SettingError as e:
        if said_as is None or e.field != "model":
            raise
        # `generate --model X` was answered "model: ...", a name the user never typed
        raise ValueError(f"{said_as}: {e.reason}") from e


def saved_config(path: str, said_as: Optional[str] = None) -> Optional[dict]:
    """The saved config of the model ``path`` names (as load_model reads paths), read before its weights load: a
    Hugging Face folder's config.json (a Hub id's downloaded alone, not its weights), a run's or checkpoint's
    model_config.json (model_type "foxformer"), a run's hf/config.json. None where none can be read (a run from
    before model_config.json, a path that is no model: loading it says why). ``said_as``: as load_model's."""
    with _model_said_as(said_as):
        path = os.fspath(path)
        if is_hub_id(path):
            path = _hub_folder(path, ["config.json"])
        if _is_checkpoint_dir(path) or os.path.isfile(os.path.join(path, RUN_CONFIG)):
            run = run_dir_of(path)
            fields = read_model_config(run) if run else None
            if fields is not None:
                return {"model_type": FoxConfig.model_type, **fields}
            path = os.path.join(path, "hf")  # a run dir's export (a checkpoint has none)
        try:
            with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
                saved = json.load(f)
        except (OSError, ValueError):
            return None
        return saved if isinstance(saved, dict) else None


def _hub_folder(given: str, files: Optional[list[str]] = None) -> str:
    """The local folder of the Hub id ``given`` (its model files, or ``files``), or a SettingError saying why not."""
    try:
        return download(given) if files is None else download(given, files)
    except OSError as e:
        raise SettingError("model", f"{given!r} is no local folder, and {e}; download it where the Hub is "
                                    f"reachable and pass its path") from e


CHECKPOINT_FILES = ("model.pt", ".metadata")  # a checkpoint folder's weights: one file, or a sharded (DCP) save


def _is_checkpoint_dir(path: str) -> bool:
    """A checkpoint folder: its weights, or the meta.json that vouches for them without a Hugging Face config.json
    beside it (weights gone, as from a partial copy: the checkpoint's own check names the file missing, where "not a
    checkpoint" sent the user to the run dir, whose latest checkpoint may be this very one)."""
    return any(os.path.exists(os.path.join(path, name)) for name in CHECKPOINT_FILES) or (
        os.path.isfile(os.path.join(path, "meta.json")) and not os.path.exists(os.path.join(path, "config.json")))


def run_dir_of(path: str) -> Optional[str]:
    """The run folder (holding config.yaml) a local model path belongs to: a checkpoint's RUN/checkpoints/step_N,
    the run dir itself, or its hf/ export; None for any other path. Read before any weights load (bias-shift takes
    the run's dataset from it), and by load_model."""
    here = os.path.abspath(path)
    if _is_checkpoint_dir(here):
        run = os.path.dirname(os.path.dirname(here))
    elif os.path.exists(os.path.join(here, RUN_CONFIG)):
        run = here
    elif os.path.exists(os.path.join(here, "config.json")):
        run = os.path.dirname(here)
    else:
        return None
    return run if os.path.isfile(os.path.join(run, RUN_CONFIG)) else None


def _run_hint(path: str) -> str:
    """For a path inside a run that is no model (RUN/checkpoints, its ``latest`` pointer file): the run dir, which
    loads the latest checkpoint."""
    here = os.path.abspath(path)
    for run in (os.path.dirname(here), os.path.dirname(os.path.dirname(here))):
        if os.path.exists(os.path.join(run, RUN_CONFIG)):
            return f"; for the run's latest checkpoint pass the run dir {run}"
    return ""


def _dataset_hint(path: str) -> str:
    """For a prepared dataset given where a model goes (`eval loss DATA`, the model and --data swapped)."""
    if is_dataset(path):
        return f"; it holds {MANIFEST}: a prepared dataset, which commands that read one take as --data"
    return ""


def _load_model(path, device, dtype, name, train_len, attention_backend, label, among_others) -> LoadedModel:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"model path: expected a string path, got {type(path).__name__}")
    given = path = os.fspath(path)
    if is_hub_id(path):
        path = _hub_folder(path)
    if not os.path.isdir(path):
        raise SettingError("model", f"{path!r} is not a directory (expected a run dir, a checkpoint dir "
                                    f"RUN/checkpoints/step_N, a Hugging Face folder with config.json, or a Hub id "
                                    f"owner/name){_run_hint(path)}")
    run_cfg: dict = {}
    step = None
    if _is_checkpoint_dir(path):
        run_dir = os.path.dirname(os.path.dirname(os.path.abspath(path)))
        model, run_cfg, step = _load_checkpoint_dir(path, run_dir)
        source = "checkpoint"
    elif os.path.exists(os.path.join(path, RUN_CONFIG)):
        latest = latest_checkpoint(path)
        if latest is not None:
            model, run_cfg, step = _load_checkpoint_dir(latest, path)
        elif os.path.exists(os.path.join(path, "hf", "config.json")):
            model = _load_hf_dir(os.path.join(path, "hf"), attention_backend, label, among_others)
            run_cfg = read_run_config(os.path.join(path, RUN_CONFIG))
        else:
            raise SettingError("model", f"run dir {path!r} has neither checkpoints nor an hf/ export yet")
        source = "run"
    elif os.path.exists(os.path.join(path, "config.json")):
        model = _load_hf_dir(path, attention_backend, label, among_others)
        if (run := run_dir_of(path)) is not None:
            run_cfg = read_run_config(os.path.join(run, RUN_CONFIG))
        source = "hf"
    else:
        raise SettingError("model", f"{path!r} has no config.json, {RUN_CONFIG} or model.pt: not a Hugging Face "
                                    f"folder, a run dir or a checkpoint{_dataset_hint(path) or _run_hint(path)}")
    # a FoxForCausalLM, or among_others: _load_hf_dir refused any other model
    if attention_backend is not None and hasattr(model.config, "set_attention_backend"):
        model.config.set_attention_backend(attention_backend)
    model = model.to(device=device, dtype=dtype).eval()
    check_finite_weights(model, given, dtype, label)
    recorded = run_cfg.get("context") or getattr(model.config, "train_len", None)
    if train_len is not None and recorded and int(recorded) != train_len:
        # the override is the flag's purpose, but its number was reported as the model's own training length
        print(f"note: {setting_name(label, 'train_len')} {train_len} stands in for the {recorded} tokens {given!r} was "
              f"trained on: positions past {train_len} count as beyond it", file=sys.stderr)
    ctx = train_len if train_len is not None else recorded
    label = name or _default_name(given)
    return LoadedModel(model=model, name=label, path=given, train_len=int(ctx) if ctx else None,
                       tokenizer=_named_tokenizer(path, model.config), source=source, step=step,
                       data_dir=run_cfg.get("data_dir"),
                       tokenizer_files=(run_cfg.get("derived") or {}).get("tokenizer_files"))


def check_finite_weights(model: torch.nn.Module, given: str, dtype: torch.dtype, label: str = "{}") -> None:
    """ValueError naming the first parameters of ``model`` (loaded from ``given``, cast to ``dtype``) that hold NaN
    or inf. Checked once at load: such a model failed later as `error: log_fgate contains NaN` (the attention op's
    check, naming neither the model nor the weight), as `per_seq: the model's outputs contain NaN`, or, in
    `generate`, as a traceback from torch.multinomial (greedy decoding printed garbage instead)."""
    bad = []
    for name, p in model.named_parameters():
        finite = torch.isfinite(p)
        if not bool(finite.all()):
            nan = int(torch.isnan(p).sum())
            bad.append((name, nan, int((~finite).sum()) - nan, p.numel()))
    if not bad:
        return
    said = [f"{name} ({', '.join(f'{n:,} {kind}' for n, kind in ((nan, 'NaN'), (inf, 'inf')) if n)} of "
            f"{numel:,} values)" for name, nan, inf, numel in bad[:2]]
    more = f" and {len(bad) - 2} more" if len(bad) > 2 else ""
    # finite in the file and inf after the cast: values past fp16's largest (65,504)
    overflow = dtype == torch.float16 and not any(nan for _, nan, _, _ in bad)
    fix = (f"{setting_name(label, 'dtype')} bf16 or fp32 keeps them finite" if overflow
           else "the checkpoint is damaged or its run diverged: load an earlier checkpoint")
    raise SettingError("model", f"{given!r} has non-finite weights: {'; '.join(said)}{more}; {fix}")


def tokenizer_spec(models: list[LoadedModel], given: Optional[str] = None) -> str:
    """The tokenizer to feed ``models`` text with: ``given`` (--tokenizer), else the one they trained with, else
    gpt2. ValueError when the models trained with different tokenizers, when ``given`` is not theirs (another
    tokenizer's ids may still lie in the model's vocabulary: the text read or written would be garbage that looks
    valid), or when check_tokenizer refuses it. A tokenizer folder counts by its files' content wherever it lies
    (data.tokenizer.same_tokenizer): a moved project keeps its tokenizer."""
    known = [m for m in models if m.tokenizer]
    other = next((m for m in known if not same_tokenizer(known[0].tokenizer, m.tokenizer, known[0].tokenizer_files,
                                                         m.tokenizer_files)), None)
    if other is not None:
        raise ValueError(f"models: they were trained with different tokenizers ({known[0].tokenizer!r}, "
                         f"{other.tokenizer!r}); evaluate them in separate commands")
    if given and known and not same_tokenizer(known[0].tokenizer, given, known[0].tokenizer_files):
        names = ", ".join(m.name for m in known)
        gone = moved_hint(known[0].tokenizer, known[0].tokenizer_files)
        raise ValueError(f"--tokenizer: {given!r} is not the tokenizer {names} trained with ({known[0].tokenizer!r}); "
                         + (gone or f"leave --tokenizer out to use {known[0].tokenizer!r}"))
    spec = given or next((m.tokenizer for m in known), None) or DEFAULT_TOKENIZER
    check_tokenizer(models, spec)
    return spec


def named_tokenizer_spec(paths: Sequence[str], given: Optional[str] = None) -> Optional[str]:
    """tokenizer_spec's answer for the models at ``paths``, told from their config files before their weights
    load (a check that needs the tokenizer then spares the minutes a large model takes): ``given``, else the one
    they name (load_model's LoadedModel.tokenizer), else gpt2. None where this cannot tell: a Hub id, an official
    checkpoint, a config that cannot be read, models naming different ones, or one other than ``given`` (which
    tokenizer_spec then refuses, once they load). A path that is no model names none: its load fails."""
    named = set()
    for path in paths:
        if is_hub_id(path):
            return None
        try:
            spec = _named_tokenizer(path)
        except (OSError, ValueError):
            return None
        if spec is _UNTOLD:
            return None
        if spec:
            named.add(spec)
    if given:
        return given if named <= {given} else None
    return None if len(named) > 1 else next(iter(named), DEFAULT_TOKENIZER)


def check_tokenizer(models: list[LoadedModel], spec: str) -> None:
    """ValueError when ``spec`` names a tokenizer folder whose files changed since the dataset a model's run trained
    on was prepared with it (data.preparation.tokenizer_change): text tokenized with it now would give the model
    ids that stood for other tokens in its training. Models without a dataset that is still there pass."""
    for m in models:
        try:
            manifest = read_manifest(m.data_dir) if m.data_dir and os.path.isdir(m.data_dir) else None
        except ValueError:  # a damaged dataset: nothing here reads it, and there is no fingerprint to compare
            manifest = None
        change = manifest and tokenizer_change(manifest, spec)
        if change:
            raise ValueError(f"tokenizer: {m.name} was trained on {m.data_dir!r}, and {change}; save the tokenizer "
                             f"the data was made with back in its folder, or train on data prepared again with the "
                             f"new one")


def check_data_tokenizer(data_dir: str, models: list[LoadedModel], given: Optional[str] = None, *,
                         label: str = "{}") -> None:
    """Refuse a prepared dataset that another tokenizer than a model's made (its ids may still lie in the
    model's vocabulary, and the loss would be reported as if they were text): another tokenizer (same_tokenizer), or
    a tokenizer folder whose content changed since either the dataset or the model's training data was prepared
    with it (tokenizer_change, as train and generate check it). ``given``: a tokenizer asked for beside the dataset,
    whose tokens leave it no say; another than theirs was dropped in silence. ``label``: as setting_name's
    ("--{}": the flags of eval and bias-shift)."""
    manifest = read_manifest(data_dir)
    if manifest is None:
        return  # the dataset's reader says what is missing
    data, files = setting_name(label, "data_dir", "data"), recorded_tokenizer_files(manifest)
    if given and not same_tokenizer(manifest["tokenizer"], given, files):
        name, source = setting_name(label, "tokenizer"), setting_name(label, "source")
        raise ValueError(f"{name}: {given!r} tokenizes {source} text, and {data} {data_dir!r} holds tokens "
                         f"already (made with {manifest['tokenizer']!r}); leave {name} out, or give the text as "
                         f"{source}")
    for m in models:
        if m.tokenizer and not same_tokenizer(manifest["tokenizer"], m.tokenizer, files, m.tokenizer_files):
            raise ValueError(f"{data}: {data_dir!r} was tokenized with {manifest.get('tokenizer')!r}, but "
                             f"{m.name} was trained with {m.tokenizer!r}; prepare the data with --tokenizer "
                             f"{m.tokenizer}")
        change = m.tokenizer and tokenizer_change(manifest, m.tokenizer)
        if change:
            raise ValueError(f"{data}: {data_dir!r}: {change}; prepare the data again with --force (the same "
                             f"`foxformer data prepare` command), or save the tokenizer {m.name} was trained with "
                             f"back in its folder")
        if m.tokenizer:
            check_tokenizer([m], m.tokenizer)


def _name_parts(path: str) -> tuple[list[str], str, str]:
    """(the folders above, the label, what else tells it apart) of a model at ``path``: RUN@step_N for a checkpoint,
    RUN and "/hf" for a run's export RUN/hf."""
    parts = os.path.abspath(path).rstrip(os.sep).split(os.sep)
    if len(parts) >= 3 and parts[-2] == "checkpoints":
        return parts[:-3], f"{parts[-3]}@{parts[-1]}", ""
    if parts[-1] == "hf" and len(parts) >= 2:
        return parts[:-2], parts[-2], "/hf"
    return parts[:-1], parts[-1], ""


def _default_name(path: str) -> str:
    return _name_parts(path)[1]


def distinct_names(paths: Sequence[str]) -> list[str]:
    """Default labels of models evaluated together, apart where ``_default_name`` gives several the same: a run and
    its export (RUN, RUN/hf) were both "RUN", told apart only as RUN#0 / RUN#1. Those show the export's /hf, then as
    many folders above as part them; the same path given twice stays NAME#i."""
    names = [_default_name(p) for p in paths]
    out = list(names)
    for name in set(names):
        group = [i for i, n in enumerate(names) if n == name]
        if len(group) < 2:
            continue
        split = [_name_parts(paths[i]) for i in group]
        for depth in range(max(len(above) for above, _, _ in split) + 1):
            labels = ["/".join(above[max(0, len(above) - depth):] + [label]) + tail for above, label, tail in split]
            if len(set(labels)) == len(labels):
                break
        else:  # one path given twice: its whole path said nothing more than its name
            labels = [label + tail for _, label, tail in split]
        for i, label in zip(group, labels):
            out[i] = label if labels.count(label) == 1 else f"{label}#{i}"
    return out


def wrap_model(model: torch.nn.Module, name: str = "model", train_len: Optional[int] = None) -> LoadedModel:
    """An in-memory model as a LoadedModel (for the Python API and tests)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    return LoadedModel(model=model.eval(), name=name, path="<memory>", train_len=train_len, source="memory")
