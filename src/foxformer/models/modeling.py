"""Hugging Face classes: FoxModel (the stack) and FoxForCausalLM (LM head, loss, generate)."""
from __future__ import annotations

import inspect
import os
import shutil
import sys
import warnings

from dataclasses import dataclass
from functools import partial
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import GenerationMixin, PreTrainedModel
from transformers.generation import GenerationMode
from transformers.utils import ModelOutput
from transformers.utils.generic import TransformersKwargs, can_return_tuple

from ..argtypes import did_you_mean, setting_name
from ..ops.forgetting_attn.checks import BACKENDS
from .cache_settings import (CACHE_DECODE_MODES, DYNAMIC_CACHE, PAGED_ATTENTION, STATIC_CACHE, UNCOMPILED_STATIC_DECODE,
                             check_cache_settings, paged_refusal)
from .config import FoxConfig, field_hint
from .generate_modes import check_cache_batch, check_hub_options, check_mode, check_options
from .kvcache.cache import FoxCache, check_total_len
from .kvcache.dense import DenseKV
from .kvcache.graphs import DecodeGraphs, step_kind
from .kvcache.paged import PagedKV
from .kvcache.policy import EvictionPolicy
from .kvcache.recurrent import RecurrentState
from .layers import (Block, ForgetGate, GateProjection, RMSNorm, SeqContext, initial_gate_bias, packed_starts,
                     rope_tables)
from .loss import IGNORE_INDEX, check_token_ids, chunked_token_losses, fused_causal_lm_loss, next_token_targets
from .packing import HF_PACKING_KWARGS, masked_packing, one_row, packed_documents, position_restarts
from .trained_length import warn_past_train_len

try:  # respects "already loaded" flags during from_pretrained (transformers v5)
    from transformers import initialization as _init
except ImportError:  # pragma: no cover
    _init = torch.nn.init



# transformers 5.24 renamed the cache field of model outputs to `cache` (reading `past_key_values`
# through a property); 5.17 still has `past_key_values`. Outputs use whichever name generate reads.
_NEW_CACHE_NAME = isinstance(getattr(ModelOutput, "past_key_values", None), property)
CACHE_FIELD = "cache" if _NEW_CACHE_NAME else "past_key_values"

# FoxModelOutput.cu_seqlens: int32 [N + 1] offsets of the documents the forward ran packed, given or derived from
# transformers' markers (packed_documents), into the rows' tokens one row after another; None when none were packed.
# FoxForCausalLM's loss reads them there: deriving them again from position_ids cost a second device sync.

if _NEW_CACHE_NAME:
    @dataclass
    class FoxModelOutput(ModelOutput):
        """last_hidden_state [B, T, d]; cache (also readable as past_key_values); cu_seqlens (above)."""

        last_hidden_state: Optional[torch.Tensor] = None
        cache: Optional[FoxCache] = None
        hidden_states: Optional[tuple[torch.Tensor, ...]] = None
        cu_seqlens: Optional[torch.Tensor] = None

    @dataclass
    class FoxCausalLMOutput(ModelOutput):
        """loss: scalar mean, or fp32 [B, T-1] with loss_reduction="none"; logits [B, T, V]."""

        loss: Optional[torch.Tensor] = None
        logits: Optional[torch.Tensor] = None
        cache: Optional[FoxCache] = None
        hidden_states: Optional[tuple[torch.Tensor, ...]] = None
else:  # pragma: no cover - exercised with transformers < 5.24
    @dataclass
    class FoxModelOutput(ModelOutput):
        """last_hidden_state [B, T, d]; past_key_values (also readable as cache); cu_seqlens (above)."""

        last_hidden_state: Optional[torch.Tensor] = None
        past_key_values: Optional[FoxCache] = None
        hidden_states: Optional[tuple[torch.Tensor, ...]] = None
        cu_seqlens: Optional[torch.Tensor] = None

        @property
        def cache(self) -> Optional[FoxCache]:
            return self.past_key_values

    @dataclass
    class FoxCausalLMOutput(ModelOutput):
        """loss: scalar mean, or fp32 [B, T-1] with loss_reduction="none"; logits [B, T, V]."""

        loss: Optional[torch.Tensor] = None
        logits: Optional[torch.Tensor] = None
        past_key_values: Optional[FoxCache] = None
        hidden_states: Optional[tuple[torch.Tensor, ...]] = None

        @property
        def cache(self) -> Optional[FoxCache]:
            return self.past_key_values


# transformers' attn_implementation for a model's own attention code: the one value foxformer models take
EAGER_ATTENTION = "eager"

# Called as writer(directory, config) after save_pretrained: foxformer.models registers the standalone export (code
# and tokenizer files, models/standalone.py). An export's copy of this file has none registered: a model loaded from
# it re-saves the code files it was loaded from (_save_loaded_code).
SAVE_WRITERS: list = []


def _save_loaded_code(model, directory) -> None:
    """The files of the modules ``model``'s classes were loaded from (the copy an export carries, loaded with
    trust_remote_code where foxformer is not installed), into ``directory``: the entry modules the export's auto_map
    names and the fox_*.py files beside them. transformers copied only the modules defining the classes and named
    those in auto_map: the re-saved folder lacked modeling_foxformer.py, which its AutoModel entry still named, and
    with foxformer installed it loaded this copy, not foxformer's classes."""
    files = {}
    for cls in (type(model), type(model.config)):
        package = cls.__module__.rpartition(".")[0] + "."
        for name, module in list(sys.modules.items()):
            path = getattr(module, "__file__", None)
            if name.startswith(package) and path and os.path.basename(path) != "__init__.py":
                files[os.path.basename(path)] = path
    for name, path in files.items():
        shutil.copyfile(path, os.path.join(directory, name))


# Keyword arguments that transformers and the libraries around it may pass to a model's forward beyond those the
# forwards below name, taken without a warning: the typed model kwargs (TransformersKwargs: output flags,
# is_causal, ...), cache_position and mm_encoder_outputs (transformers' own prepare_inputs_for_generation;
# foxformer's passes neither), token_type_ids (tokenizers return it, `model(**batch)` passes it on, PEFT sets it to
# None), task_ids (PEFT's poly adapters). foxformer reads none of them. generate, Trainer and PEFT's LoRA pass only
# names the forwards have (tests/models/test_hf).
HF_FORWARD_KWARGS = (frozenset(TransformersKwargs.__annotations__) - set(HF_PACKING_KWARGS)) | {
    "cache_position", "mm_encoder_outputs", "token_type_ids", "task_ids"}


def _as_rows(out: FoxModelOutput, rows: int) -> FoxModelOutput:
    """FoxModel's output of one_row's packed row, as the batch's ``rows`` rows: hidden states [B, T, d]."""
    def split(h: torch.Tensor) -> torch.Tensor:
        return h.reshape(rows, -1, h.shape[-1])

    return FoxModelOutput(last_hidden_state=split(out.last_hidden_state),
                          hidden_states=None if out.hidden_states is None else tuple(map(split, out.hidden_states)),
                          cu_seqlens=out.cu_seqlens)


class FoxPreTrainedModel(PreTrainedModel):
    config_class = FoxConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["Block"]

    def __init__(self, config: FoxConfig, **kwargs):
        """from_pretrained hands the model every keyword that is neither a loading option nor an attribute of the
        config (the config only warned, "ignored"): ``from_pretrained(dir, num_hiden_layers=1)`` ended in a bare
        TypeError from __init__. Refused as transformers refuses it for its own models, in one line naming the
        field meant."""
        if kwargs:
            key = next(iter(kwargs))
            raise TypeError(f"{type(self).__name__}: unknown keyword argument {key!r}{field_hint(key)}: "
                            f"from_pretrained takes FoxConfig's fields and transformers' loading options; fix the name "
                            f"or leave it out")
        super().__init__(config)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' save_pretrained, then the SAVE_WRITERS (on the main process only); an export's copy of this
        code, loaded with trust_remote_code, saves the files it was loaded from instead (_save_loaded_code)."""
        # Loading a folder with trust_remote_code registers these classes for transformers' own copying of remote
        # code, which would drop foxformer's package modules (not standalone) into the folder, or the copy's modules
        # under auto_map entries of their own: the writers put the code there instead, and auto_map stays the
        # export's (the config keeps the one it was loaded with).
        owners = (type(self), type(self.config))
        registered = [cls.__dict__.get("_auto_class") for cls in owners]
        if not SAVE_WRITERS and not any(registered):
            return super().save_pretrained(save_directory, *args, **kwargs)
        for cls in owners:
            cls._auto_class = None
        try:
            out = super().save_pretrained(save_directory, *args, **kwargs)
        finally:
            for cls, value in zip(owners, registered):
                if value is None:
                    del cls._auto_class
                else:
                    cls._auto_class = value
        if kwargs.get("is_main_process", True):
            self._write_beside_weights(save_directory)
        return out

    def _write_beside_weights(self, directory) -> None:
        """The SAVE_WRITERS' files, or in an export's copy of this code the files it was loaded from."""
        for writer in SAVE_WRITERS:
            writer(directory, self.config)
        if not SAVE_WRITERS:
            _save_loaded_code(self, directory)

    def _upload_modified_files(self, working_dir, *args, **kwargs):
        """transformers' Hub upload, after the SAVE_WRITERS: save_pretrained(push_to_hub=True) uploads from inside
        transformers' save_pretrained, before the writers above ran, and the repository got weights and a config
        without the code, auto_map and tokenizer files that load it where foxformer is not installed."""
        self._write_beside_weights(working_dir)
        return super()._upload_modified_files(working_dir, *args, **kwargs)

    def resize_token_embeddings(self, new_num_tokens: Optional[int] = None, pad_to_multiple_of: Optional[int] = None,
                                mean_resizing: bool = True) -> nn.Embedding:
        """transformers' resize, refused where the config's bos / eos / pad ids would fall outside the new vocabulary:
        transformers set vocab_size alone, so a shrunk model kept an eos it can never emit (generate ran on to its
        limit) without a word."""
        if new_num_tokens is not None:
            multiple = pad_to_multiple_of or 1  # transformers rounds the size up to it
            size = -(-new_num_tokens // multiple) * multiple
            try:
                self.config.validate_token_ids(size)
            except ValueError as e:
                raise ValueError(f"resize_token_embeddings({new_num_tokens}): {e}; set it inside the new vocabulary "
                                 f"first") from None
        return super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)

    def _set_gradient_checkpointing(self, enable: bool = True, gradient_checkpointing_func=checkpoint, **kwargs):
        """transformers' own, which hands FoxModel its checkpoint function (use_reentrant, offload, ... bound in);
        every_n_layers reaches only transformers' GradientCheckpointingLayer blocks, so FoxModel keeps it too."""
        super()._set_gradient_checkpointing(enable, gradient_checkpointing_func, **kwargs)
        every = kwargs.get("every_n_layers", 1)
        for module in self.modules():
            if isinstance(module, FoxModel):
                module.checkpoint_every = every

    def _warn_unread_kwargs(self, kwargs: dict) -> None:
        """forward's **kwargs (transformers' Trainer passes num_items_in_batch only to a forward that has them)
        swallowed a misspelled argument without a word: `attention_maks=mask` ran unmasked. Once per model and
        name (training calls forward every step); a warning, not an error, for callers that pass more than
        HF_FORWARD_KWARGS knows. is_causal=False (one of those names) is refused: the attention is causal
        whatever is asked, and a bidirectional request ran causal without a word."""
        if kwargs.get("is_causal") is False:
            raise ValueError(f"{type(self).__name__}.forward: is_causal=False, but foxformer's attention is causal "
                             f"(the forget gate decays along one direction); leave it out")
        unknown = [k for k in kwargs if k not in HF_FORWARD_KWARGS and k not in getattr(self, "_said_kwargs", ())]
        if not unknown:
            return
        self._said_kwargs = {*getattr(self, "_said_kwargs", ()), *unknown}
        named = [k for k in inspect.signature(self.forward).parameters if k != "kwargs"]
        for name in unknown:
            # pointed at the line calling model(...): past forward, can_return_tuple and nn.Module's two call frames
            warnings.warn(f"{type(self).__name__}.forward: unknown keyword argument {name!r} is ignored"
                          f"{did_you_mean(name, named)}", stacklevel=6)

    def _check_and_adjust_attn_implementation(self, attn_implementation, *args, **kwargs):
        """transformers' check, with paged attention refused (see cache_settings.PAGED_CACHE): from_pretrained's and
        the config's attn_implementation and set_attn_implementation pass here, and so does a ContinuousBatchingManager
        built by hand, which switches the model to "paged|eager". transformers accepts "paged|eager" from any model,
        and foxformer's attention, reading none of it, ran as if it was not asked. Any other value but "eager"
        (transformers' name for a model's own attention) is refused too, pointing at attention_backend."""
        if isinstance(attn_implementation, str) and attn_implementation.startswith(PAGED_ATTENTION):
            raise paged_refusal(f"attn_implementation={attn_implementation!r} (continuous batching's attention)")
        if isinstance(attn_implementation, str) and attn_implementation != EAGER_ATTENTION:
            # transformers' refusal asked the user to request support on the model's Hub page, at a URL built from a
            # local folder's path; the setting that picks foxformer's kernels is another one
            raise ValueError(f"attn_implementation={attn_implementation!r} picks among transformers' attention "
                             f"functions, which foxformer models do not call: their attention is their own (Forgetting "
                             f"Attention's kernels, SDPA for softmax attention); choose its kernels with "
                             f"attention_backend (one of {BACKENDS}) and leave attn_implementation out")
        return super()._check_and_adjust_attn_implementation(attn_implementation, *args, **kwargs)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # The model builds its own FoxCache (the HF DynamicCache has no room for c and shift states).
        return False

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.init_std
        if isinstance(module, GateProjection):
            _init.normal_(module.weight, mean=0.0, std=std)
            _init.copy_(module.bias, initial_gate_bias(self.config).to(module.bias.device, module.bias.dtype))
        elif isinstance(module, nn.Linear):
            _init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                _init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            _init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, RMSNorm):
            _init.ones_(module.weight)
        elif isinstance(module, ForgetGate) and module.kind != "data_dependent":
            _init.copy_(module.bias, initial_gate_bias(self.config).to(module.bias.device, module.bias.dtype))


class FoxModel(FoxPreTrainedModel):
    """Embedding, blocks, final RMSNorm. Returns FoxModelOutput."""

    def __init__(self, config: FoxConfig, **kwargs):
        super().__init__(config, **kwargs)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.gradient_checkpointing = False
        self.checkpoint_every = 1
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def new_cache(self, eviction: EvictionPolicy | str | None = "config", *, total_len: Optional[int] = None,
                  decode: str = "auto", label: str = "{}") -> FoxCache:
        """An empty FoxCache: the one constructor (generate, eval, bench and Hugging Face generate call it).

        eviction: "config" (the config's evict_* settings; no evict_eps there: keep every key), None (keep
            every key), or an EvictionPolicy (its unset qk_bound / max_len taken from the config).
        total_len: the tokens the cache will be fed (prompt + new tokens - 1), if known (None or -1: not known;
            kvcache.cache.check_total_len): storage is sized for it at once (up to max_position_embeddings; it
            grows past that), and without an explicit max_len the bound's N covers it when it exceeds
            max_position_embeddings (else the eps tolerance would be void past it; FoX may go there).
        decode: how one-token steps run (FoxCache: "auto", "graphs", "static" or "eager").
        label: how an eviction policy this model cannot serve is named (argtypes.setting_name): the keyword
            evict_eps, or "--{}" a command's flag.

        An explicit max_len (policy or config) is the cache's max_len: the eviction bound holds for at most that
        many keys, so the model refuses to go past it. It caps storage and never sizes it (it may be 10**11)."""
        total_len = check_total_len(total_len)
        cfg = self.config
        if eviction == "config":
            policy = EvictionPolicy.resolve(cfg)
        elif eviction is None or isinstance(eviction, EvictionPolicy):
            policy = None if eviction is None else eviction.with_defaults(cfg)
            if policy is not None and not cfg.has_fgate:
                # Softmax attention never forgets: every layer would keep every key, without a word.
                raise ValueError(f"{setting_name(label, 'evict_eps')}: KV eviction needs a forget gate (a FoX model); "
                                 f"this model is a softmax Transformer")
        else:
            raise TypeError(f"eviction: expected 'config', None or an EvictionPolicy, got {eviction!r}")
        linear = cfg.attention == "linear"
        if policy is not None and linear:
            raise ValueError(f"{setting_name(label, 'evict_eps')}: KV eviction needs keys to evict; a gated linear "
                             f"attention model (attention='linear') keeps a fixed-size recurrent state")
        deltas = [None] * cfg.num_layers
        if policy is not None:
            n_keys = policy.n_keys(cfg.max_position_embeddings, total_len)
            deltas = policy.deltas([block.attn.eviction_bound(policy.qk_bound) for block in self.layers], n_keys)
            if cfg.has_fgate and all(d is None for d in deltas):
                # named by label as the refusals above are: `foxformer generate --evict-eps` was told to pass
                # evict_qk_bound, which no flag is called
                warnings.warn(f"{setting_name(label, 'evict_eps')} is set but no layer can evict: without QK-norm no "
                              f"bound on |q.k| is known; pass {setting_name(label, 'evict_qk_bound')} (your bound on "
                              f"|q.k| * scale) to evict", stacklevel=2)
        evicting = any(d is not None for d in deltas)
        max_len = policy.max_len if evicting else None
        # Storage for the whole sequence at once, but no more than the model's context: past that it grows by
        # doubling as tokens come (max_new_tokens=1e9 asked for 256 GB before the first token). N only caps it:
        # evict_max_len=10**11 sized the page tables for N: 6 GB per kv head and layer, on the device and the host.
        hint = min(int(total_len or 0), cfg.max_position_embeddings)
        if max_len is not None:
            hint = min(hint, max_len)
        layers = [RecurrentState() if linear else DenseKV(hint) if d is None else PagedKV(d, hint, max_len=max_len)
                  for d in deltas]
        return FoxCache(layers, max_len=max_len, policy=policy if evicting else None, decode=decode,
                        bound_len=n_keys if evicting and max_len is None else None)

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def _positions(self, batch: int, length: int, past_len: int, attention_mask, position_ids, cu_seqlens,
                   device) -> tuple[Optional[torch.Tensor], torch.Tensor]:
        """(starts, positions) of the chunk: see SeqContext.starts; positions int64 [B, T] for RoPE."""
        starts = positions = None
        if cu_seqlens is not None:  # packed_documents refused a cache or an attention_mask beside it
            starts, positions = packed_starts(cu_seqlens, batch, length, device)
        elif attention_mask is not None:
            if attention_mask.dim() != 2 or attention_mask.shape != (batch, past_len + length):
                raise ValueError(f"attention_mask must be [batch, past + new] = {(batch, past_len + length)}, "
                                 f"got {tuple(attention_mask.shape)}")
            given = attention_mask.to(device=device)
            mask = given.bool()
            # Any value but 0 and 1 changes on the way to bool and back (2 and 0.5 read as 1, NaN too): a mask of
            # other values (weights, counts) has no meaning here, so it is refused rather than rounded.
            other = given != mask.to(given.dtype)
            # Left padding: each row's first real token cuts off everything before it.
            first = mask.int().argmax(dim=1)
            abs_pos = torch.arange(past_len, past_len + length, device=device)
            starts = (abs_pos[None] == first[:, None]) & (first[:, None] > 0)
            # Only padding around a row's real tokens is modelled (keys are hidden by cutting c at the first
            # one): a 0 between real tokens would still be attended to, so refuse it instead of ignoring it.
            last = mask.shape[1] - 1 - mask.flip(1).int().argmax(dim=1)
            holed = (last - first + 1 > mask.sum(1)) & mask.any(1)
            restarted = holed.new_zeros(())
            if position_ids is not None and length > 1:  # left to this sync by packed_documents
                restarted = position_restarts(position_ids.to(device), mask[:, past_len:]).any()
            flags = torch.stack((other.any(), holed.any(), starts.any(), restarted)).tolist()  # one sync
            not_binary, holed, any_start, restarted = flags
            if not_binary:
                raise ValueError(f"attention_mask: expected only 0 (padding) and 1 (real token), got "
                                 f"{given[other][0].item()!r}; pass a bool or 0/1 mask")
            if restarted:
                raise masked_packing("position_ids")
            if holed:
                raise ValueError("attention_mask: a 0 between two real tokens (1s) is not supported; only "
                                 "left padding (and right padding without a cache continuing it) is")
            if not any_start:
                starts = None
            positions = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, past_len:]
        if position_ids is not None:
            positions = position_ids.to(device)
        elif positions is None:
            positions = torch.arange(past_len, past_len + length, device=device)[None].expand(batch, length)
        return starts, positions

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple:
        if not self.config.rope:
            return None, None
        return rope_tables(positions, self.config.head_dim, self.config.rope_theta, dtype)

    def static_step(self, x: torch.Tensor, positions: torch.Tensor, cache: FoxCache, scan: bool) -> torch.Tensor:
        """One token through the stack on ``cache``, graph-safe (models.kvcache.graphs): x [B, 1, d] the embedded
        token, positions int64 [B, 1] (RoPE); the new token's place in the cache is ``cache.step_at`` (on the
        device). Returns the final hidden state [B, 1, d]."""
        cos, sin = self._rope(positions, x.dtype)
        ctx = SeqContext(cos=cos, sin=sin, cache_at=cache.step_at, evict_scan=scan)
        for i, layer in enumerate(self.layers):
            x = layer(x, ctx, cache[i])
        return self.norm(x)

    @can_return_tuple
    def forward(self, input_ids: Optional[torch.LongTensor] = None, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.LongTensor] = None, past_key_values: Optional[FoxCache] = None,
                inputs_embeds: Optional[torch.Tensor] = None, use_cache: Optional[bool] = None,
                cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None,
                output_hidden_states: Optional[bool] = None, cache: Optional[FoxCache] = None,
                return_dict: Optional[bool] = None, output_attentions: Optional[bool] = None,
                **kwargs) -> FoxModelOutput:
        """input_ids [B, T] (or inputs_embeds [B, T, d]); attention_mask [B, past + T] (1 = real token,
        left padding supported); cu_seqlens int32 [N + 1] for a packed batch with B = 1.
        Pass the returned cache back as ``past_key_values`` to continue (chunked prefill, decoding).
        return_dict=False (or config.return_dict False): the output's non-None fields as a tuple, as in transformers.
        Packed documents may also be marked as transformers marks them (packed_documents), in several rows too; the
        offsets the forward ran come back as the output's cu_seqlens."""
        cu_seqlens, max_seqlen, rows = packed_documents(
            kwargs, input_ids if input_ids is not None else inputs_embeds, position_ids, cu_seqlens, max_seqlen,
            attention_mask, bool(use_cache) or cache is not None or past_key_values is not None)
        input_ids, inputs_embeds, position_ids = one_row(rows, input_ids, inputs_embeds, position_ids)
        if kwargs:
            self._warn_unread_kwargs(kwargs)
        if output_attentions:
            raise ValueError("output_attentions=True: foxformer models never form attention weights (the fused "
                             "kernels compute the output directly); leave it out")
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        if input_ids is not None:
            check_token_ids(input_ids, self.config.vocab_size, "input_ids")
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        if x.dim() != 3:
            raise ValueError(f"input_ids must be [batch, seq], got shape {tuple(x.shape[:-1])}")
        if x.shape[0] == 0 or x.shape[1] == 0:  # an IndexError deep in a layer otherwise
            raise ValueError(f"input_ids must hold at least one token in each of at least one row, got shape "
                             f"{tuple(x.shape[:-1])}")
        cache = cache if cache is not None else past_key_values
        if cache is not None and not isinstance(cache, FoxCache):
            raise TypeError(f"past_key_values must be a FoxCache, got {type(cache).__name__}")
        if use_cache is None:
            # Plain forwards (training, evaluation) skip the cache; generate asks for it explicitly.
            use_cache = cache is not None
        if use_cache and cache is None:
            # sized, and its eviction bound derived, for this input at least (a prompt past max_position_embeddings)
            cache = self.new_cache(total_len=x.shape[1])
        # use_cache=False only means "build no cache" (as in transformers): a cache passed in holds the
        # prefix, and dropping it would attend to the new tokens alone.
        B, T, _ = x.shape
        if cache is not None:
            cache.check_fits(self.config.num_layers, B, self.config.num_kv_heads, self.config.head_dim,
                             recurrent=self.config.attention == "linear")
        past_len = cache.seq_len if cache is not None else 0
        if cache is not None:
            cache.check_length(past_len + T)
        starts, positions = self._positions(B, T, past_len, attention_mask, position_ids, cu_seqlens, x.device)
        scan = cache.next_scan(T) if cache is not None else True
        if cache is not None and T == 1 and past_len and starts is None and not output_hidden_states:
            kind = step_kind(cache, self.config, x)
            if kind is not None:
                if cache.graphs is None:
                    cache.graphs = DecodeGraphs(compile=cache.decode == "compiled")
                x = cache.graphs.run(self.static_step, cache, x, positions, scan, capture=kind == "graphs")
                return FoxModelOutput(last_hidden_state=x, **{CACHE_FIELD: cache})
        cos, sin = self._rope(positions, x.dtype)
        ctx = SeqContext(starts=starts, cos=cos, sin=sin, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                         evict_scan=scan)

        hidden = [] if output_hidden_states else None
        ckpt = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        if ckpt and cache is not None:
            warnings.warn("gradient checkpointing: this forward runs without it, as it writes a cache (use_cache=True "
                          "or past_key_values) that the recompute would write twice; pass use_cache=False and no "
                          "cache to checkpoint", stacklevel=3)
            ckpt = False
        # Set by transformers' gradient_checkpointing_enable; a flag set directly (training's
        # activation_checkpointing) gets the non-reentrant default.
        ckpt_fn = getattr(self, "_gradient_checkpointing_func", None) or partial(checkpoint, use_reentrant=False)
        for i, layer in enumerate(self.layers):
            if hidden is not None:
                hidden.append(x)
            layer_cache = cache[i] if cache is not None else None
            if ckpt and i % self.checkpoint_every == 0:
                x = ckpt_fn(layer, x, ctx, layer_cache)
            else:
                x = layer(x, ctx, layer_cache)
        x = self.norm(x)
        if hidden is not None:
            hidden.append(x)
        if cache is not None:
            cache.seq_len += T
        out = FoxModelOutput(last_hidden_state=x, hidden_states=tuple(hidden) if hidden is not None else None,
                             cu_seqlens=cu_seqlens, **{CACHE_FIELD: cache})
        return _as_rows(out, rows) if rows > 1 else out


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, cu_seqlens: Optional[torch.Tensor] = None,
                   reduction: str = "mean", num_items_in_batch: Optional[int | torch.Tensor] = None) -> torch.Tensor:
    """Next-token cross-entropy in fp32. logits [B, T, V], labels [B, T] (shifted here; -100 ignored).

    With cu_seqlens the last token of a packed sequence does not predict the next sequence's first.
    reduction "mean" (over counted tokens) or "none" (fp32 [B, T-1], 0 where ignored).
    num_items_in_batch: with "mean", divide the summed loss by this count instead (the counted tokens of
    every accumulated micro-batch, as transformers' Trainer passes it).
    """
    if reduction not in ("mean", "none"):
        raise ValueError(f"loss_reduction must be 'mean' or 'none', got {reduction!r}")
    if labels.shape != logits.shape[:2]:
        raise ValueError(f"labels must be [batch, seq] = {tuple(logits.shape[:2])}, got {tuple(labels.shape)}")
    targets = next_token_targets(labels, cu_seqlens)
    V = logits.shape[-1]
    loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, V), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="none" if reduction == "none" else "sum")
    if reduction == "none":
        return loss.view(targets.shape)
    # The sum over the counted targets, not F.cross_entropy's mean: with no target at all (every label -100,
    # or T = 1) that is 0 / 0 = NaN, and its backward NaN in every gradient; the fused loss gives 0 too.
    count = (targets != IGNORE_INDEX).sum().clamp_min(1) if num_items_in_batch is None else num_items_in_batch
    return loss / count


# generate's bookkeeping, never a forward argument (transformers drops the first two too); transformers leaves the
# tokenizer (for stop_strings, token healing) among the model kwargs of its decoding loops, where the forward warned
# that it ignores it
_NOT_FORWARDED = ("labels", "next_sequence_length", "is_first_iteration", "tokenizer")


class FoxForCausalLM(FoxPreTrainedModel, GenerationMixin):
    """FoxModel + LM head. ``model(ids, labels=ids)`` gives the mean next-token loss (shifted inside)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: FoxConfig, **kwargs):
        super().__init__(config, **kwargs)
        self.model = FoxModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' from_pretrained, with the config saying whether the LM head is the embedding: a checkpoint
        holding two different matrices stays untied under ``tie_word_embeddings=True`` (transformers warns), but
        the config kept saying tied, and a model saved again wrote that lie into its config.json. The generation
        config takes the config's pad_token_id where it has none."""
        loaded = super().from_pretrained(*args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # output_loading_info=True: (model, info)
        if model.config.tie_embeddings and model.lm_head.weight is not model.model.embed_tokens.weight:
            model.config.tie_embeddings = False
        # exports from before the config filled pad_token_id in saved a generation_config.json without one, and
        # generate reads that file, not the config (whose pad now comes from the tokenizer)
        if model.generation_config.pad_token_id is None and model.config.pad_token_id is not None:
            model.generation_config.pad_token_id = model.config.pad_token_id
        return loaded

    def _adjust_missing_and_unexpected_keys(self, loading_info, *args, **kwargs):
        """transformers' clean-up of the load report, after the weights are in and tied: a checkpoint saved tied holds
        no lm_head.weight, so loading it untied (``tie_word_embeddings=False``) left the head randomly initialised
        (reported missing), and the model computed other logits than the one saved. The head starts as a copy of
        the embedding instead, which is what the saved model computed with, and is no longer reported missing.
        loading_info: the load's LoadStateDictInfo (in earlier transformers 5 releases, the missing keys themselves)."""
        missing = getattr(loading_info, "missing_keys", loading_info)
        head, embedding = self.lm_head.weight, self.model.embed_tokens.weight
        if ("lm_head.weight" in missing and "model.embed_tokens.weight" not in missing and head is not embedding
                and head.shape == embedding.shape and "meta" not in (head.device.type, embedding.device.type)):
            with torch.no_grad():
                head.copy_(embedding)
            missing.remove("lm_head.weight")
        return super()._adjust_missing_and_unexpected_keys(loading_info, *args, **kwargs)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def num_parameters_non_embedding(self) -> int:
        """Parameters outside the token embedding and the LM head (the paper's N, presets.count_non_embedding).
        transformers' ``num_parameters(exclude_embeddings=True)`` counts an untied LM head among them."""
        skip = {id(self.model.embed_tokens.weight), id(self.lm_head.weight)}
        return sum(p.numel() for p in self.parameters() if id(p) not in skip)

    @can_return_tuple
    def forward(self, input_ids: Optional[torch.LongTensor] = None, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.LongTensor] = None, past_key_values: Optional[FoxCache] = None,
                inputs_embeds: Optional[torch.Tensor] = None, labels: Optional[torch.LongTensor] = None,
                use_cache: Optional[bool] = None, cu_seqlens: Optional[torch.Tensor] = None,
                max_seqlen: Optional[int] = None, loss_reduction: str = "mean",
                logits_to_keep: int | torch.Tensor = 0, output_hidden_states: Optional[bool] = None,
                cache: Optional[FoxCache] = None, return_dict: Optional[bool] = None,
                return_logits: bool = True, num_items_in_batch: Optional[int | torch.Tensor] = None,
                output_attentions: Optional[bool] = None, **kwargs) -> FoxCausalLMOutput:
        """See FoxModel.forward. labels [B, T] (the inputs themselves for LM training; -100 ignored);
        num_items_in_batch (transformers' Trainer under gradient accumulation): the mean loss is the summed
        loss divided by this count of targets over all accumulated micro-batches;
        loss_reduction "none" returns fp32 per-token losses [B, T-1]; logits_to_keep > 0 computes
        logits only for the last positions (generation). return_logits=False with labels and the
        mean loss computes the loss through the LM head in chunks and returns no logits (training:
        no [B, T, V] tensor at all); so do the per-token losses under torch.no_grad (evaluation)."""
        packing = {name: kwargs.pop(name) for name in HF_PACKING_KWARGS if name in kwargs}  # FoxModel reads them
        if kwargs:
            self._warn_unread_kwargs(kwargs)
        if isinstance(logits_to_keep, int) and logits_to_keep < 0:
            raise ValueError(f"logits_to_keep must be >= 0 (0: every position), got {logits_to_keep}")
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=past_key_values, cache=cache, inputs_embeds=inputs_embeds,
                         use_cache=use_cache, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
                         output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                         return_dict=True, **packing)
        # the documents FoxModel ran packed: a document's last token must not predict the next one's first
        cu_seqlens = out.cu_seqlens
        h = out.last_hidden_state
        if labels is not None:
            if not isinstance(labels, torch.Tensor) or labels.shape != h.shape[:2]:
                raise ValueError(f"labels must be [batch, seq] = {tuple(h.shape[:2])} like the input, got "
                                 f"{tuple(getattr(labels, 'shape', ())) or type(labels).__name__}")
            check_token_ids(labels, self.config.vocab_size, "labels", ignore=IGNORE_INDEX)
        if not return_logits and labels is not None and not logits_to_keep:
            if loss_reduction == "mean":
                loss = fused_causal_lm_loss(h, self.lm_head.weight, labels, cu_seqlens, num_items_in_batch)
            elif loss_reduction == "none" and not torch.is_grad_enabled():
                loss = chunked_token_losses(h, self.lm_head.weight, labels, cu_seqlens)
            else:
                loss = None
            if loss is not None:
                return FoxCausalLMOutput(loss=loss, logits=None, hidden_states=out.hidden_states,
                                         **{CACHE_FIELD: getattr(out, CACHE_FIELD)})
        if isinstance(logits_to_keep, int):
            if logits_to_keep:
                h = h[:, -logits_to_keep:]
        else:
            h = h[:, logits_to_keep]
        logits = self.lm_head(h)
        loss = None
        if labels is not None:
            if logits.shape[1] != labels.shape[1]:
                raise ValueError("labels need logits for every position: leave logits_to_keep at 0")
            loss = causal_lm_loss(logits, labels, cu_seqlens, loss_reduction, num_items_in_batch)
        return FoxCausalLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                 **{CACHE_FIELD: getattr(out, CACHE_FIELD)})

    def generate(self, *args, **kwargs):
        """transformers' generate, with cache_implementation and max_cache_len checked first: passed as keywords
        they are read before the generation config is built (its "paged" switches to continuous batching, see
        cache_settings.PAGED_CACHE; transformers said max_cache_len is for static caches, where FoxCache's "static"
        ignores it)."""
        check_cache_settings(kwargs.get("cache_implementation"), kwargs.get("max_cache_len"))
        return super().generate(*args, **kwargs)

    def init_continuous_batching(self, *args, **kwargs):
        """Refused (see cache_settings.PAGED_CACHE): generate_batch and continuous_batching_context_manager start
        here."""
        raise paged_refusal("continuous batching (generate_batch, continuous_batching_context_manager, "
                            "init_continuous_batching)")

    def _prepare_generation_config(self, *args, **kwargs):
        """Refuse the options of the modes transformers moved to Hub code (generate_modes.HUB_OPTIONS) as soon as
        generate's config holds them: beside some other options transformers runs another mode instead."""
        generation_config, model_kwargs = super()._prepare_generation_config(*args, **kwargs)
        check_hub_options(generation_config)
        return generation_config, model_kwargs

    def _get_deprecated_gen_repo(self, generation_mode, *args, **kwargs):
        """Refuse the modes transformers moved to Hub code (generate_modes.HUB_MODES) where generate first knows its
        mode: before it asks for trust_remote_code, and again when the Hub's code calls generate with its own loop."""
        check_mode(generation_mode)
        return super()._get_deprecated_gen_repo(generation_mode, *args, **kwargs)

    def _prepare_cache_for_generation(self, generation_config, model_kwargs: dict, *args, **kwargs):
        """transformers builds no cache for a model without DynamicCache support, and its chunked prefill
        (prefill_chunk_size) then refuses to run: start generate with an empty FoxCache (the config's eviction
        settings, as forward's own) unless one was passed or use_cache is False."""
        mode = next((a for a in (*args, *kwargs.values()) if isinstance(a, GenerationMode)), None)
        check_options(generation_config, mode, model_kwargs.get("assistant_model"))
        check_cache_settings(generation_config.cache_implementation, getattr(generation_config, "max_cache_len", None))
        given = next((model_kwargs[k] for k in ("cache", "past_key_values") if model_kwargs.get(k) is not None), None)
        call = inspect.signature(super()._prepare_cache_for_generation).bind(generation_config, model_kwargs, *args,
                                                                                **kwargs)
        check_cache_batch(given, generation_config, call.arguments.get("batch_size"))
        # The last new token is never fed back: the cache sees max_length - 1 tokens, and transformers adds an
        # inputs_embeds prompt to that (its max_length counts only the ids, none with embeddings alone)
        fed = call.arguments.get("max_cache_length", (generation_config.max_length or 0) - 1)
        warn_past_train_len(self, fed + 1, self.config.train_len)
        passed = given is not None
        asked = generation_config.cache_implementation
        if asked in CACHE_DECODE_MODES and not passed:
            # transformers would say it ignores the request: FoxCache grants it (transformers refuses it beside a
            # cache passed in, as it does for its own caches, so it keeps it there)
            generation_config.cache_implementation = None
        try:
            result = super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
        finally:
            generation_config.cache_implementation = asked
        if generation_config.use_cache is not False and not passed:
            decode = CACHE_DECODE_MODES[asked or DYNAMIC_CACHE]  # any other value was refused above
            if asked == STATIC_CACHE and getattr(generation_config, "disable_compile", False):
                decode = UNCOMPILED_STATIC_DECODE
            model_kwargs[CACHE_FIELD] = self.model.new_cache(total_len=fed, decode=decode)
        return result

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, next_sequence_length: Optional[int] = None,
                                      past_key_values: Optional[FoxCache] = None,
                                      attention_mask: Optional[torch.Tensor] = None,
                                      inputs_embeds: Optional[torch.Tensor] = None, cache: Optional[FoxCache] = None,
                                      use_cache: bool = True, logits_to_keep: Optional[int] = None, **kwargs):
        """Feed only the tokens the cache has not seen; the full attention mask carries the left padding."""
        cache = cache if cache is not None else past_key_values
        past = cache.get_seq_length() if cache is not None else 0
        if attention_mask is not None:  # always full length, also per chunk of a chunked prefill
            new = attention_mask.shape[1] - past
        elif next_sequence_length is not None:
            new = next_sequence_length
        elif input_ids.shape[1] > past:  # the whole sequence so far
            new = input_ids.shape[1] - past
        else:  # only the new chunk (chunked prefill without a mask)
            new = input_ids.shape[1]
        if new < 1 and past:
            # A cache passed to generate holds the start of the sequence its inputs continue; a cache from another
            # generation took this input as new tokens past its own (or, shorter still, as an empty input). Without
            # a filled cache no new token means an empty input, which the forward refuses in its own words (here it
            # was told "the cache already holds 0 tokens" and to pass a new cache).
            held = attention_mask.shape[1] if attention_mask is not None else input_ids.shape[1]
            raise ValueError(f"generate: the cache already holds {past} tokens and the whole input is {held}, no new "
                             f"token past them: pass the whole sequence (the cached tokens, then the new ones), or a "
                             f"new cache (model.model.new_cache())")
        inputs = {"attention_mask": attention_mask, "past_key_values": cache, "use_cache": use_cache}
        if inputs_embeds is not None and past == 0:
            inputs["inputs_embeds"] = inputs_embeds[:, -new:]
        else:
            inputs["input_ids"] = input_ids[:, -new:].contiguous()
        if logits_to_keep is not None:
            inputs["logits_to_keep"] = logits_to_keep
        position_ids = kwargs.pop("position_ids", None)
        if position_ids is not None:  # generate extends them by one per new token, as it does the mask
            inputs["position_ids"] = position_ids[..., -new:]
        # The rest of generate's model inputs (output_hidden_states, arguments of a user's own) reach the forward, as
        # transformers' own prepare_inputs_for_generation hands them on: dropped, return_dict_in_generate's
        # hidden_states were a tuple of None and RoPE read positions of the mask instead of the ones passed.
        for key, value in kwargs.items():
            if key not in _NOT_FORWARDED and key not in inputs:
                inputs[key] = value
        return inputs
