"""The model card save_pretrained writes: the Hub's header, what the model is, how to load it; a card of the
user's own is kept."""
from foxformer.models import FoxForCausalLM, get_preset
from foxformer.models.card import model_name


def test_save_pretrained_writes_a_card_and_keeps_the_users(tmp_path):
    model = FoxForCausalLM(get_preset("transformer-llama-tiny", vocab_size=257, tokenizer="bytes"))
    model.save_pretrained(tmp_path / "a")
    card = (tmp_path / "a" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\npipeline_tag: text-generation\n")
    for fact in ("# Transformer (LLaMA)", "| forget gate | none |", "RoPE", "bytes (257 ids, end of document 256)",
                 "trust_remote_code=True"):
        assert fact in card, fact
    assert "## Training" not in card  # a plain save knows nothing of training
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "README.md").write_text("my own card\n")
    model.save_pretrained(tmp_path / "b")
    assert (tmp_path / "b" / "README.md").read_text() == "my own card\n"


def test_names_follow_the_paper():
    assert [model_name(get_preset(p)) for p in ("fox-pro-tiny", "fox-llama-tiny", "linear-pro-tiny")] == [
        "FoX (Pro)", "FoX (LLaMA)", "Gated linear attention (Pro)"]
    assert model_name(get_preset("fox-llama-tiny", qk_norm=True)) == "FoX (custom block)"


def test_the_parameter_row_says_what_each_count_holds():
    """It said "embedding" of a count that holds the untied LM head too (twice the embedding's)."""
    from foxformer.models.card import model_card

    for tied, said in ((False, "12.9K in the token embedding and LM head |"),
                       (True, "6.5K in the token embedding and LM head (tied) |")):
        card = model_card(get_preset("fox-pro-tiny", vocab_size=101, tie_embeddings=tied))
        assert f"| parameters | 107.5K non-embedding, {said}" in card, card
