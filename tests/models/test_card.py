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
