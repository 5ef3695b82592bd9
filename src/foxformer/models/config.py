"""FoxConfig: one typed config for FoX and Transformer models, LLaMA and Pro blocks, and the ablations."""
from __future__ import annotations

import dataclasses
import functools
import math
import sys
import warnings

from transformers import PretrainedConfig

from ..argtypes import did_you_mean
from ..data.specs import document_token_ids
from ..ops.forgetting_attn.checks import BACKENDS, MAX_HEAD_DIM
from .kvcache.policy import check_eviction

ATTENTIONS = ("forgetting", "softmax", "linear")
FGATES = ("data_dependent", "data_independent", "fixed", "none")
FGATE_BIAS_INITS = ("zero", "timescales")
NUMBERS = ("mlp_ratio", "fgate_tmin", "fgate_tmax", "rope_theta", "init_std", "rms_norm_eps")
OPTIONAL_NUMBERS = ("qk_norm_eps", "evict_eps", "evict_qk_bound", "prune_eps")
# Defaults of fields only some models read: set elsewhere, they are refused rather than carried along unread.
TIMESCALE_DEFAULTS = {"fgate_tmin": 2.0, "fgate_tmax": 16384.0}
ROPE_THETA_DEFAULT = 500000.0
# Keys a saved config carries beside the fields: transformers writes model_type, exports auto_map, and configs of
# earlier foxformer versions a field since removed. Kept as attributes (as transformers keeps any key) without a word.
SAVED_KEYS = frozenset({"auto_map", "model_type", "deterministic_attention"})
_SAID_KEYS: set[str] = set()  # misspelled keys warned of, once per process: from_pretrained builds configs repeatedly
# Other libraries' names of FoxConfig fields (GPT-2's, nanoGPT's, LLaMA's and Mistral's reference code, fairseq's):
# FoxConfig(n_embd=64, n_layer=2) built the default 768-wide 12-layer model, and these names are too far from the
# fields' for a "did you mean" to catch. Hugging Face's own names of fields are read as them (attribute_map).
FOREIGN_NAMES = {
    **dict.fromkeys(("n_embd", "n_embed", "d_model", "dim", "embed_dim"), "hidden_size"),
    **dict.fromkeys(("n_layer", "n_layers"), "num_layers"),
    **dict.fromkeys(("n_head", "n_heads"), "num_heads"),
    "n_kv_heads": "num_kv_heads",
    **dict.fromkeys(("n_inner", "ffn_dim", "d_ff", "ffn_hidden_size"), "intermediate_size"),
    **dict.fromkeys(("n_positions", "n_ctx", "max_seq_len", "block_size"), "max_position_embeddings"),
    **dict.fromkeys(("layer_norm_epsilon", "layer_norm_eps", "norm_eps"), "rms_norm_eps"),
    "rotary_emb_base": "rope_theta",
    "n_vocab": "vocab_size",
}


def is_positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _round_up(x: float, multiple: int) -> int:
    return int(math.ceil(x / multiple) * multiple)


def field_hint(key: str, fields=None) -> str:
    """`` (FoxConfig calls it 'x')`` for another library's name of a field (FOREIGN_NAMES), else `` (did you mean
    'x'?)`` with the one of ``fields`` (default: FoxConfig's, and their Hugging Face names) closest to ``key``, or
    ""."""
    if key in FOREIGN_NAMES:
        return f" (FoxConfig calls it {FOREIGN_NAMES[key]!r})"
    if fields is None:
        fields = [f.name for f in dataclasses.fields(FoxConfig)] + list(FoxConfig.attribute_map)
    return did_you_mean(key, fields)


def _warn_misspelled(keys: list[str], fate: str, stacklevel: int) -> None:
    """Warn of each key (no field of FoxConfig) that is close to a field's name or another library's name of one,
    once per key and process; keys that saved configs carry (SAVED_KEYS) are known. Warned of, not refused, as
    transformers keeps any key: a saved config's extra key does not stop it loading. stacklevel: the caller's,
    for the line the warning names."""
    for key in keys:
        if key in SAVED_KEYS or key in _SAID_KEYS:
            continue
        hint = field_hint(key)
        if hint:
            _SAID_KEYS.add(key)
            warnings.warn(f"FoxConfig: {key!r} is no field of FoxConfig; {fate}{hint}", stacklevel=stacklevel + 1)


def _read_for_a_tokenizer() -> bool:
    """Whether AutoTokenizer.from_pretrained is reading this config: to learn the tokenizer's class it hands AutoConfig
    every keyword it was given, the tokenizer's own (padding_side, bos_token, add_bos_token, model_max_length, ...;
    under pipeline() the model's too, device_map), none of them meant for the config."""
    frame = sys._getframe(1)
    while frame is not None:
        if (frame.f_code.co_name == "from_pretrained"
                and frame.f_globals.get("__name__") == "transformers.models.auto.tokenization_auto"):
            return True
        frame = frame.f_back
    return False


class ConfigError(ValueError):
    """A model setting refused. ``fields``: the FoxConfig fields it is about, the refused one first, then those it
    is refused beside; a command line names by them the item its user typed (``--model num_heads=3: ...``), where
    the message names the field. ``reason``: the message past ``where``, the prefix naming what refused it."""

    def __init__(self, reason: str, *fields: str, where: str = "FoxConfig."):
        super().__init__(f"{where}{reason}")
        self.reason, self.fields, self.where = reason, fields, where

    def __reduce__(self):  # pickled as its arguments (a worker's error reaching its parent), not as args[0] alone
        return functools.partial(ConfigError, where=self.where), (self.reason, *self.fields)


class FoxConfig(PretrainedConfig):
    """Configuration of a FoX / Transformer causal LM (Hugging Face ``model_type`` "foxformer").

    The subclass becomes a keyword-only dataclass (transformers v5 makes every config one), so the
    fields below are the whole schema; ``__post_init__`` validates them.

    attention: "forgetting" (FoX), "softmax" (Transformer; requires fgate="none") or "linear" (the recurrent
        baseline: gated linear attention with the forget gate and L2-normalised q, k; needs a forget gate,
        and has no keys to evict or prune).
    fgate: forget gate kind. "data_dependent" f_t = sigmoid(w . x_t + b) per head; "data_independent" learns
        only b; "fixed" freezes b; "none" = plain softmax attention.
    fgate_bias_init: where b starts. "zero" (f = 0.5: a memory of ~1.4 tokens in every head) or "timescales"
        (one decay timescale per head, geometric in [fgate_tmin, fgate_tmax]). None: the choice of the paper's
        code for the kind: "zero" for data_dependent (the only start it allows there), "timescales" for the
        other two ("zero" is refused for a fixed gate, which would stay at f = 0.5). A zero-started
        data-dependent gate gets almost no gradient from tokens more than a few tens back (0.5^d): on MQAR,
        whose answers lie tens to hundreds of tokens back, it does not open at our sizes, where the
        timescale start learns as fast as the fixed gate (docs/results.md, MQAR section). The LM results
        all use the zero start.
    A setting the chosen model would not read is refused, not carried along: fgate_tmin / fgate_tmax without the
    "timescales" start, rope_theta without rope, qk_norm_per_head without qk_norm, evict_eps / prune_eps with
    linear attention or without a forget gate (softmax attention, fgate="none").
    intermediate_size: SwiGLU width; None means round_up(2/3 * mlp_ratio * hidden_size, 64).
    head_dim: None means hidden_size // num_heads. num_kv_heads: None means num_heads (no GQA).
    attention_backend: backend of the forgetting_attention op ("auto" | "gluon" | "triton" | "torch" | "naive").
    fgate_bias_shift: added to the forget-gate logits at inference (positive = slower decay = longer
        effective context): a float for the whole model, a list [num_layers] of floats, or a nested list
        [num_layers][num_heads]. 0 leaves the model unchanged.
    evict_eps: decoding evicts cached keys whose attention probability is provably below evict_eps / N
        for every later query (None = keep everything). Needs qk_norm, or evict_qk_bound.
    evict_qk_bound: without qk_norm, the user's promise U >= |scale * q . k| for every query/key pair.
    evict_max_len: N in the bound (the longest sequence decoded; the model refuses to grow an evicting cache
        past it); None means max_position_embeddings (FoX may still decode past that).
    prune_eps: the attention op skips (query block, key block) tiles whose total attention probability
        per row is provably below prune_eps (None = compute every tile). The bound on |q . k| comes from
        the QK-norm weights when qk_norm is on, else from the norms of q and k ("auto").
    qk_norm_per_head: QK-norm weights [heads, head_dim] (one per head) instead of one [head_dim] shared by
        all heads (the form of the paper's released checkpoints and of our presets).
    qk_norm_eps: eps of the QK-norm; None means rms_norm_eps (the official code uses 1e-5 there, 1e-6
        elsewhere).
    kv_shift: token shift of keys and values (the Pro block). k_shift / v_shift: each alone; None means
        kv_shift.
    joint_input_projections: the products that read the same input run as one matrix product over their weights
        concatenated in the graph, its output padded to a multiple of 8 columns (models/fused_linear.joint_linear):
        in the attention q, k, v and the logits of the gates the block has (in training and prefill; one-token
        decode steps fuse them either way), in the MLP its gate and up projections. The same weights and state
        dict; results equal up to the products' rounding.
    joint_gate_projections: the attention's one-logit-per-head products (the data-dependent forget gate, the
        token-shift gates) as one product, padded likewise; in training and prefill, and implied by
        joint_input_projections. Alone, cuBLAS runs each of these 12-column products on a slow kernel (rows of
        24 bytes); the same weights and state dict, results equal up to the products' rounding.
    fused_pro_ops: in training and prefill without a cache, the Pro block's extras run as fused ops
        (foxformer.ops.shift_norm: the token shift with the QK-norm; gate_norm: the output norm with the output gate;
        Triton kernels on CUDA, their exact references elsewhere); cached decoding keeps the modules. On: FoX (Pro)
        125M's step 1.2% faster on an H100 (docs/benchmarks.md). The same weights; results equal up to rounding
        (one rounding per op instead of one per step).
    tokenizer: spec of the tokenizer the model reads (foxformer.data.load_tokenizer: "gpt2", "gpt2-json", ...);
        save_pretrained writes its files next to the weights and the eval commands use it. None: unknown.
    train_len: the longest sequences (tokens) the weights were trained on, which training records; generate warns
        when a prompt and its new tokens may run past it (once per length). None: unknown.
    bos_token_id / eos_token_id / pad_token_id: None with a built-in tokenizer (bytes, gpt2, gpt2-json) means its
        end-of-document token (256 for bytes, 50256 for the GPT-2 ones), the token between documents in foxformer's
        data: Hugging Face generate stops there, and the tokenizer pads with it. Training sets bos and eos from its
        dataset for any tokenizer; pad None then follows eos (where the config names a tokenizer), and an export
        records the pad of the tokenizer it saves where that has its own (pad_token_id_beside). Each id lies in
        [0, vocab_size); eos may be a list of them.
    """

    model_type = "foxformer"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]
    attribute_map = {
        "num_hidden_layers": "num_layers",
        "num_attention_heads": "num_heads",
        "num_key_value_heads": "num_kv_heads",
        "tie_word_embeddings": "tie_embeddings",
        "initializer_range": "init_std",
    }

    vocab_size: int = 50304
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    num_kv_heads: int | None = None
    head_dim: int | None = None
    mlp_ratio: float = 4.0
    intermediate_size: int | None = None
    attention: str = "forgetting"
    fgate: str = "data_dependent"
    fgate_tmin: float = TIMESCALE_DEFAULTS["fgate_tmin"]
    fgate_tmax: float = TIMESCALE_DEFAULTS["fgate_tmax"]
    fgate_bias_init: str | None = None
    rope: bool = False
    rope_theta: float = ROPE_THETA_DEFAULT
    qk_norm: bool = False
    output_gate: bool = False
    output_norm: bool = False
    kv_shift: bool = False
    k_shift: bool | None = None
    v_shift: bool | None = None
    qk_norm_per_head: bool = False
    qk_norm_eps: float | None = None
    tie_embeddings: bool = False
    init_std: float = 0.02
    rms_norm_eps: float = 1e-6
    attention_backend: str = "auto"
    gradient_checkpointing: bool = False
    joint_input_projections: bool = False
    joint_gate_projections: bool = True
    fused_pro_ops: bool = True
    max_position_embeddings: int = 16384
    fgate_bias_shift: float | list = 0.0
    evict_eps: float | None = None
    evict_qk_bound: float | None = None
    evict_max_len: int | None = None
    prune_eps: float | None = None
    tokenizer: str | None = None
    train_len: int | None = None
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self, **kwargs):
        self._read_aliases(kwargs)
        self._read_numbers()
        # the widths derived below are computed from the given ones: `hidden_size: abc` failed there, in a bare
        # TypeError ("can't multiply sequence by non-int of type 'float'")
        self._check_widths(unset_ok=True)
        if self.num_kv_heads is None:
            self.num_kv_heads = self.num_heads
        if self.head_dim is None:
            heads_ok = isinstance(self.num_heads, int) and self.num_heads > 0
            if heads_ok and isinstance(self.hidden_size, int) and self.hidden_size % self.num_heads:
                raise ConfigError(f"num_heads ({self.num_heads}) must divide hidden_size "
                                  f"({self.hidden_size}) when head_dim is not given", "num_heads", "hidden_size")
            self.head_dim = self.hidden_size // max(self.num_heads, 1)
        if self.intermediate_size is None and 0 < self.mlp_ratio < math.inf:  # else _validate names mlp_ratio
            self.intermediate_size = _round_up(2.0 / 3.0 * self.mlp_ratio * self.hidden_size, 64)
        if self.k_shift is None:
            self.k_shift = self.kv_shift
        if self.v_shift is None:
            self.v_shift = self.kv_shift
        if self.qk_norm_eps is None:
            self.qk_norm_eps = self.rms_norm_eps
        self._fill_token_ids()
        super().__post_init__(**kwargs)
        # transformers keeps any key as an attribute: FoxConfig(num_hiden_layers=2) built 12 layers without a word.
        # Keys it reads itself (torch_dtype, generation settings, ...) it has taken out of the config by now.
        # Past __post_init__ and the dataclass __init__: the line that built the config.
        _warn_misspelled([k for k in kwargs if k in vars(self)], "it is kept as an attribute that no model reads",
                         stacklevel=3)
        self._validate()

    def _fill_token_ids(self) -> None:
        """bos / eos / pad left None, from the tokenizer the model reads. A built-in one's end-of-document token is
        all three: the token between documents in training, and the one its Hugging Face tokenizer pads with
        (data.hf_tokenizer). Other tokenizers are known only by loading them: training records eos from its data,
        and pad follows it, as their tokenizers pad with it too. pad stayed None, and exports said so although
        their tokenizer padded with eos: generate, pipelines and trainers that read the config's pad had none.
        Without a tokenizer (unknown), nothing is guessed."""
        document = document_token_ids(self.tokenizer)[1]
        if self.bos_token_id is None:
            self.bos_token_id = document
        if self.eos_token_id is None:
            self.eos_token_id = document
        eos = self.eos_token_id
        if self.pad_token_id is None and self.tokenizer is not None:
            self.pad_token_id = document if document is not None else (
                eos if isinstance(eos, int) and not isinstance(eos, bool) else None)

    def pad_token_id_beside(self, tokenizer) -> int | None:
        """The pad id an export records beside ``tokenizer``, the Hugging Face tokenizer of ``self.tokenizer`` that
        it saves: that tokenizer's own pad token where the config's pad is the eos that _fill_token_ids stood in
        with for a tokenizer known only by loading it (an hf: one padding with "<pad>" got pad = eos), else the
        config's. A tokenizer without a pad token, or one outside the vocabulary, keeps eos."""
        own = getattr(tokenizer, "pad_token_id", None)
        filled = document_token_ids(self.tokenizer)[1] is None and self.pad_token_id == self.eos_token_id
        if filled and isinstance(own, int) and not isinstance(own, bool) and 0 <= own < self.vocab_size:
            return own
        return self.pad_token_id

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """transformers' from_dict, with the keyword overrides of ``from_pretrained(dir, attention_backend=...)`` read
        as fields of the saved dict: transformers sets them on the built config, past ``__post_init__``, so a value
        no model reads (evict_eps on a Transformer) was kept unread, and a malformed one (a backend's typo, a
        per-layer list of the wrong length, "1e-5") failed in the forward or never."""
        own = {f.name for f in dataclasses.fields(cls)} - {f.name for f in dataclasses.fields(PretrainedConfig)}
        config_dict = dict(config_dict)
        for key in list(kwargs):
            name = cls.attribute_map.get(key, key)
            if name in own:
                for spelling in [name] + [a for a, n in cls.attribute_map.items() if n == name]:
                    config_dict.pop(spelling, None)
                config_dict[name] = kwargs.pop(key)
        # transformers sets an override only on an attribute the config has, and drops the others without a word;
        # with return_unused_kwargs it hands them back instead (from_pretrained of a model passes them to the model,
        # which refuses them: FoxPreTrainedModel), so "ignored" would be untrue there; AutoTokenizer's keywords are
        # the tokenizer's ("'padding_side' is no field of FoxConfig ... (did you mean 'hidden_size'?)" was untrue too)
        unread = [k for k in kwargs if not hasattr(cls, k)] if not kwargs.get("return_unused_kwargs") else []
        if unread and not _read_for_a_tokenizer():
            _warn_misspelled(unread, "the override is ignored", stacklevel=2)
        return super().from_dict(config_dict, **kwargs)

    def _read_aliases(self, kwargs: dict) -> None:
        """Hugging Face's names of fields (num_attention_heads, tie_word_embeddings, ...) as those fields, before
        anything is derived from them: transformers sets them after ``__post_init__``, so
        ``FoxConfig(num_attention_heads=24)`` got head_dim and num_kv_heads from the default 12 heads (a model
        twice as wide in attention, with GQA) and ``FoxConfig(hidden_size=64, num_attention_heads=4)`` was refused
        for 12 heads."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for alias, name in self.attribute_map.items():
            if alias not in kwargs:
                continue
            value = kwargs.pop(alias)
            current = getattr(self, name)
            if current != defaults[name] and current != value:
                raise ConfigError(f"{name} is given twice, as {name}={current!r} and as {alias}={value!r}", name)
            setattr(self, name, value)

    def set_attention_backend(self, backend: str) -> None:
        """The attention backend, checked: also a loaded model's override (`--attention-backend`), which was
        set after construction unchecked and then ignored or not depending on the prompt's length."""
        self.check_attention_backend(backend)
        self.attention_backend = backend

    @staticmethod
    def check_attention_backend(backend: str) -> None:
        """ConfigError for a backend no model runs: the check of set_attention_backend, for a loader to make
        before the weights it would set it on have loaded."""
        if backend not in BACKENDS:
            # in the words of every flag's refusal, which a command re-says after its flag (--attention-backend:)
            raise ConfigError(f"expected one of {', '.join(BACKENDS)}, got {backend!r}"
                              f"{did_you_mean(backend, BACKENDS)}", "attention_backend",
                              where="FoxConfig.attention_backend: ")

    def _read_numbers(self) -> None:
        """The real-valued fields as numbers, before anything is derived from them. YAML 1.1 reads `1e-5` (no dot)
        as a string, so `--model rms_norm_eps=1e-5` or `init_std: 2e-2` reached the checks below as text and
        failed with a bare TypeError (or, for mlp_ratio, was multiplied into the MLP width's rounding)."""
        for name in NUMBERS + OPTIONAL_NUMBERS:
            value = getattr(self, name)
            if value is None and name in OPTIONAL_NUMBERS:
                continue
            if isinstance(value, str):
                try:
                    value = float(value)
                except ValueError:
                    pass
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{name} must be a number{' or None' if name in OPTIONAL_NUMBERS else ''}, "
                                  f"got {value!r}", name)
            setattr(self, name, value)

    def _check_widths(self, unset_ok: bool = False) -> None:
        """The integer sizes are positive ints; with ``unset_ok``, those still None that are derived pass (a None
        hidden_size reached the MLP width's derivation as a bare TypeError)."""
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size"):
            value = getattr(self, name)
            derived = name in ("num_kv_heads", "head_dim", "intermediate_size")
            if not is_positive_int(value) and not (unset_ok and derived and value is None):
                raise ConfigError(f"{name} must be a positive int, got {value!r}", name)

    def _validate(self) -> None:
        # `not 0 < x < inf` (not `x <= 0`): NaN fails every comparison and would pass.
        for name in ("mlp_ratio", "init_std", "rope_theta", "rms_norm_eps", "qk_norm_eps"):
            value = getattr(self, name)
            if not 0 < value < math.inf:
                raise ConfigError(f"{name} must be positive and finite, got {value!r}", name)
        self._check_widths()
        for name in ("rope", "qk_norm", "qk_norm_per_head", "output_gate", "output_norm", "kv_shift", "k_shift",
                     "v_shift", "tie_embeddings", "gradient_checkpointing", "joint_input_projections",
                     "joint_gate_projections", "fused_pro_ops"):
            value = getattr(self, name)
            if not isinstance(value, bool):  # a string such as "false" would be truthy
                raise ConfigError(f"{name} must be True or False, got {value!r}", name)
        self.validate_token_ids()
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_heads ({self.num_heads}) must be a multiple of "
                              f"num_kv_heads ({self.num_kv_heads})", "num_heads", "num_kv_heads")
        if self.attention == "forgetting" and self.head_dim > MAX_HEAD_DIM:
            raise ConfigError(f"head_dim must be at most {MAX_HEAD_DIM} with attention='forgetting' (the "
                              f"op's kernels), got {self.head_dim}", "head_dim", "attention")
        if self.rope and self.head_dim % 2:
            raise ConfigError(f"head_dim must be even with rope=True, got {self.head_dim}", "head_dim", "rope")
        if self.attention not in ATTENTIONS:
            raise ConfigError(f"attention must be one of {ATTENTIONS}, got {self.attention!r}"
                              f"{did_you_mean(self.attention, ATTENTIONS)}", "attention")
        if self.fgate not in FGATES:
            # a bool from Python or from YAML (`fgate: off`, no, yes, on): the hint named 'none' for True too
            hint = ""
            if self.fgate is True:
                hint = (" (a bool, as YAML reads on / yes / true; for a forget gate name its kind: 'data_dependent', "
                        "the default, 'data_independent' or 'fixed')")
            elif self.fgate is False:
                hint = " (a bool, as YAML reads off / no / false; for no forget gate give 'none')"
            raise ConfigError(f"fgate must be one of {FGATES}, got {self.fgate!r}{did_you_mean(self.fgate, FGATES)}"
                              f"{hint}", "fgate")
        if self.attention == "softmax" and self.fgate != "none":
            raise ConfigError(f"fgate must be 'none' when attention='softmax', got {self.fgate!r}", "fgate",
                              "attention")
        if self.attention == "linear" and self.fgate == "none":
            raise ConfigError("fgate must not be 'none' when attention='linear' (gated linear attention "
                              "is defined by its forget gate; without one its state would only grow)", "fgate",
                              "attention")
        self.set_attention_backend(self.attention_backend)
        if not (0 < self.fgate_tmin <= self.fgate_tmax < math.inf):
            raise ConfigError(f"fgate_tmin and fgate_tmax need 0 < fgate_tmin <= fgate_tmax (finite), got "
                              f"{self.fgate_tmin} and {self.fgate_tmax}", "fgate_tmin", "fgate_tmax")
        self._validate_bias_init()
        self._validate_inference()
        self._validate_read()
        if self.tokenizer is not None and (not isinstance(self.tokenizer, str) or not self.tokenizer):
            raise ConfigError(f"tokenizer must be a tokenizer spec such as 'gpt2', or None, got "
                              f"{self.tokenizer!r}", "tokenizer")

    def validate_token_ids(self, vocab_size: int | None = None) -> None:
        """bos / eos / pad ids inside the vocabulary, or None. One outside it (or "3", 3.0) was taken unchecked:
        the model can never emit such an eos, so generation ran on to its limit, and a bos or pad id fed to the
        model was blamed on the input_ids (on a GPU, whose decode steps do not read the ids, a device-side assert
        in the embedding), far from the config. transformers only warns, and only at save, because configs on the
        Hub carry pad_token_id=-1; foxformer never writes one (its pad is the end-of-document token). eos may be
        a list of ids, as transformers' generate takes it (any of them stops a sequence). vocab_size: a size the
        vocabulary is about to take (resize_token_embeddings); None: the config's."""
        vocab_size = self.vocab_size if vocab_size is None else vocab_size
        document = document_token_ids(self.tokenizer)[1]
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(self, name)
            several = name == "eos_token_id" and isinstance(value, (list, tuple)) and len(value) > 0
            for token in value if several else [value]:
                if token is None and not several:
                    continue
                if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
                    # the tokenizer's end-of-document id fills bos, eos and pad when they are not given
                    whence = (f" (the end-of-document token of tokenizer {self.tokenizer!r})"
                              if document is not None and token == document else "")
                    raise ConfigError(f"{name} must be a token id in [0, vocab_size={vocab_size})"
                                      f"{' or a list of them' if name == 'eos_token_id' else ''} or None, got "
                                      f"{value!r}{whence}", name)

    def _validate_bias_init(self) -> None:
        init = self.fgate_bias_init
        if init is None:
            return
        if init not in FGATE_BIAS_INITS:
            raise ConfigError(f"fgate_bias_init must be one of {FGATE_BIAS_INITS} or None"
                              f"{did_you_mean(init, FGATE_BIAS_INITS)}, got {init!r}", "fgate_bias_init")
        if not self.has_fgate:
            raise ConfigError(f"fgate_bias_init must be None for a model with no forget gate "
                              f"(attention={self.attention!r}, fgate={self.fgate!r}), got {init!r}",
                              "fgate_bias_init", "attention", "fgate")
        if self.fgate == "fixed" and init == "zero":
            raise ConfigError("fgate_bias_init='zero' with fgate='fixed' would freeze f = 0.5 in every "
                              "head (a memory of ~1.4 tokens); use 'timescales' or None", "fgate_bias_init", "fgate")

    def _validate_read(self) -> None:
        """Settings the chosen model never reads, refused: `--model fgate_tmin=4` on fox-pro trained the zero-started
        gate while the run's config and card recorded the timescale."""
        if self.gate_bias_init != "timescales":
            for name, default in TIMESCALE_DEFAULTS.items():
                if getattr(self, name) != default:
                    here = (f"fgate_bias_init is {self.gate_bias_init!r} here" if self.has_fgate
                            else "this model has no forget gate")
                    raise ConfigError(f"{name} sets the timescales the forget-gate bias starts from, read only "
                                      f"with fgate_bias_init='timescales' ({here}): leave {name} out, got "
                                      f"{getattr(self, name)!r}", name, "fgate_bias_init", "fgate", "attention")
        if not self.rope and self.rope_theta != ROPE_THETA_DEFAULT:
            raise ConfigError(f"rope_theta is read only with rope=True; set rope=True or leave rope_theta "
                              f"out, got {self.rope_theta!r}", "rope_theta", "rope")
        if self.qk_norm_per_head and not self.qk_norm:
            raise ConfigError("qk_norm_per_head=True is read only with qk_norm=True; set qk_norm=True or "
                              "leave qk_norm_per_head out", "qk_norm_per_head", "qk_norm")
        if not self.has_fgate:
            # Softmax attention never forgets: no key is provably negligible, so nothing is skipped or evicted. FoX
            # with fgate='none' is softmax attention too, whose prune_eps SDPA dropped without a word.
            for name in ("evict_eps", "prune_eps"):
                if getattr(self, name) is not None:
                    raise ConfigError(f"{name} must be None for a model with no forget gate "
                                      f"(attention={self.attention!r}, fgate={self.fgate!r}), got "
                                      f"{getattr(self, name)!r}", name, "attention", "fgate")

    @property
    def gate_bias_init(self) -> str | None:
        """fgate_bias_init with None resolved to the kind's default (None without a forget gate)."""
        if not self.has_fgate:
            return None
        if self.fgate_bias_init is not None:
            return self.fgate_bias_init
        return "zero" if self.fgate == "data_dependent" else "timescales"

    def _validate_inference(self) -> None:
        shift = self.fgate_bias_shift
        if isinstance(shift, (list, tuple)):
            if len(shift) != self.num_layers:
                raise ConfigError(f"fgate_bias_shift as a list needs one entry per layer "
                                  f"({self.num_layers}), got {len(shift)}", "fgate_bias_shift", "num_layers")
            for row in shift:
                if isinstance(row, (list, tuple)) and len(row) != self.num_heads:
                    raise ConfigError(f"fgate_bias_shift rows need one value per head "
                                      f"({self.num_heads}), got {len(row)}", "fgate_bias_shift", "num_heads")
        elif not isinstance(shift, (int, float)) or isinstance(shift, bool):
            raise ConfigError(f"fgate_bias_shift must be a float or a per-layer (per-head) list, "
                              f"got {shift!r}", "fgate_bias_shift")
        rows = shift if isinstance(shift, (list, tuple)) else [shift]
        values = [x for row in rows for x in (row if isinstance(row, (list, tuple)) else [row])]
        if any(isinstance(x, (int, float)) and not math.isfinite(x) for x in values):
            raise ConfigError(f"fgate_bias_shift must be finite, got {shift!r}", "fgate_bias_shift")
        if not self.has_fgate:
            # No ForgetGate is built, so a shift would be dropped without a word (set_fgate_bias_shift
            # refuses it too).
            if any(x is not None and x != 0 for x in values):
                raise ConfigError(f"fgate_bias_shift must be 0 for a model with no forget gate "
                                  f"(attention={self.attention!r}, fgate={self.fgate!r}), got {shift!r}",
                                  "fgate_bias_shift", "attention", "fgate")
        if self.attention == "linear":
            # A recurrent state has no keys: nothing to evict, no tiles to skip.
            for name in ("evict_eps", "prune_eps"):
                if getattr(self, name) is not None:
                    raise ConfigError(f"{name} must be None when attention='linear' (the layer keeps a "
                                      f"recurrent state, not keys), got {getattr(self, name)!r}", name, "attention")
        for field, key in (("evict_eps", "eps"), ("evict_qk_bound", "qk_bound"), ("evict_max_len", "max_len")):
            try:  # one field a call: the error is about that one
                check_eviction(**{key: getattr(self, field)})
            except ValueError as e:
                raise ConfigError(str(e), field) from None
        if self.prune_eps is not None and not (0 < self.prune_eps < 1):
            raise ConfigError(f"prune_eps must be in (0, 1) or None, got {self.prune_eps!r}", "prune_eps")
        if not is_positive_int(self.max_position_embeddings):
            raise ConfigError(f"max_position_embeddings must be a positive int, "
                              f"got {self.max_position_embeddings!r}", "max_position_embeddings")
        if self.train_len is not None and not is_positive_int(self.train_len):
            raise ConfigError(f"train_len must be a positive int or None, got {self.train_len!r}", "train_len")

    def layer_bias_shift(self, layer_idx: int) -> list[float]:
        """fgate_bias_shift of one layer as one float per head."""
        shift = self.fgate_bias_shift
        if isinstance(shift, (list, tuple)):
            shift = shift[layer_idx]
        if isinstance(shift, (list, tuple)):
            return [float(x) for x in shift]
        return [float(shift)] * self.num_heads

    @property
    def has_fgate(self) -> bool:
        """Whether attention carries a forget gate (else it is causal softmax attention)."""
        return self.attention in ("forgetting", "linear") and self.fgate != "none"
