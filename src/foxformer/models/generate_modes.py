"""generate's options that foxformer models refuse, and the one wording of those refusals. FoxForCausalLM
(modeling.py) checks them where generate first holds its generation config (_prepare_generation_config), where it
first knows its mode (_get_deprecated_gen_repo) and before it builds its cache (_prepare_cache_for_generation).
"""
from __future__ import annotations

from typing import Optional

from transformers.generation import GenerationMode

from .kvcache.cache import FoxCache

# transformers 5 moved these modes to Hub code (custom_generate), run after asking for trust_remote_code: written
# for transformers' own caches and outputs, fetched unpinned, and beyond what foxformer's tests can run (no
# network). Contrastive search's repeats the cache per candidate token and crops it back, which FoxCache does not do.
# Each: what asks for the mode, the mode, the way out. check_hub_options refuses the options of all but contrastive
# search first, naming those given (penalty_alpha alone asks for nothing: beside sampling it is no mode of its own).
HUB_MODES = {
    GenerationMode.CONTRASTIVE_SEARCH: (
        "penalty_alpha with top_k > 1", "contrastive search",
        "leave penalty_alpha out (greedy), or sample (do_sample=True, top_k) or search beams (num_beams) instead"),
    GenerationMode.DOLA_GENERATION: (
        "dola_layers", "DoLa decoding (contrasting early layers' logits with the last's)",
        "leave dola_layers out (greedy, or sampling with do_sample=True); every layer's hidden states come back "
        "with output_hidden_states=True and return_dict_in_generate=True"),
    GenerationMode.GROUP_BEAM_SEARCH: (
        "num_beam_groups > 1", "group (diverse) beam search",
        "leave num_beam_groups and diversity_penalty out for beam search (num_beams), or sample several sequences "
        "(do_sample=True, num_return_sequences) for varied ones"),
    GenerationMode.CONSTRAINED_BEAM_SEARCH: (
        "constraints or force_words_ids", "constrained beam search",
        "leave them out; bad_words_ids keeps tokens out, prefix_allowed_tokens_fn allows only some at each step"),
}

# The options that ask for one of those modes, each with the value that asks for nothing (transformers' default).
# Refused in any form, before transformers derives its mode: outside their mode it runs another one instead, with
# dola_layers beside num_beams > 1 (beam search, after a logged warning), num_beam_groups > 1 without num_beams > 1
# (greedy) and diversity_penalty without num_beam_groups > 1 (in silence). An error rather than a warning, as for
# max_cache_len (cache_settings): the user asked for decoding foxformer does not run, and output of another mode
# under the same options reads as that decoding's.
HUB_OPTIONS = {"constraints": (GenerationMode.CONSTRAINED_BEAM_SEARCH, None),
               "force_words_ids": (GenerationMode.CONSTRAINED_BEAM_SEARCH, None),
               "dola_layers": (GenerationMode.DOLA_GENERATION, None),
               "num_beam_groups": (GenerationMode.GROUP_BEAM_SEARCH, 1),
               "diversity_penalty": (GenerationMode.GROUP_BEAM_SEARCH, 0.0)}

# Options whose paths need what FoxCache and these outputs do not have: they failed deep inside transformers (an
# AttributeError on the cache or on the output).
UNSUPPORTED_OPTIONS = {"prompt_lookup_num_tokens": "prompt-lookup decoding (it crops the cache)",
                       "assistant_early_exit": "assisted decoding (it crops the cache)",
                       "output_attentions": "attention weights (the fused kernels never form them)"}


def unsupported(asked: str, what: str, fix: str = "leave it out") -> ValueError:
    """The one wording of generate's refusals: the option the user gave, what it asks for, the way out."""
    return ValueError(f"generate: {asked} asks for {what}, which foxformer models do not support; {fix}")


def check_hub_options(generation_config) -> None:
    """Refuse a Hub mode's options however they are set, naming those given (of the first mode asked for)."""
    given = [(name, mode) for name, (mode, idle) in HUB_OPTIONS.items()
             if getattr(generation_config, name, None) not in (None, idle)]
    if given:
        mode = given[0][1]
        raise unsupported(" with ".join(name for name, of in given if of == mode), *HUB_MODES[mode][1:])


def check_mode(mode: GenerationMode) -> None:
    if mode in HUB_MODES:
        raise unsupported(*HUB_MODES[mode])


def check_options(generation_config, mode: Optional[GenerationMode], assistant_model) -> None:
    for name, what in UNSUPPORTED_OPTIONS.items():
        value = getattr(generation_config, name, None)
        if value:
            raise unsupported(f"{name}={value!r}", what)
    # transformers 5.25 keeps assistant_model out of model_kwargs and hands the generation mode instead: the check of
    # model_kwargs alone let it through to an AttributeError on FoxCache (activate_past_recording).
    if assistant_model is not None or mode == GenerationMode.ASSISTED_GENERATION:
        raise unsupported("an assistant_model", "assisted decoding (it crops the cache)")


def check_cache_batch(cache: Optional[FoxCache], generation_config, batch: Optional[int]) -> None:
    """ValueError for a filled cache passed beside num_beams or num_return_sequences > 1 that does not hold the rows
    generate expands its input to: the cache's own check then said only that the batch sizes differ. transformers
    does not expand a cache passed in either (its own caches fail in the attention)."""
    beams, returned = generation_config.num_beams or 1, generation_config.num_return_sequences or 1
    expand = max(beams, returned)
    held = cache.batch_size if cache is not None else None
    if expand == 1 or held is None or batch is None or held == batch * expand:
        return
    option = f"num_beams={beams}" if beams == expand else f"num_return_sequences={returned}"
    raise ValueError(f"generate: {option} repeats each of the input's {batch} row(s) {expand} times, to "
                     f"{batch * expand} rows, but the cache passed holds {held} (generate does not repeat a cache "
                     f"passed to it): fill the cache with each prompt row repeated (prompt.repeat_interleave({expand}, "
                     f"dim=0)), or leave the cache out and let generate build its own")
