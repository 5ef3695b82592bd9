"""JSON as a person reads it (foxformer.json_text): the printed summaries and written reports kept every non-ASCII
character as \\uXXXX ("Donn\\u00e9es")."""
import io
import json
import sys

from foxformer.json_text import json_text, print_json
from foxformer.paths import write_json

OBJ = {"out_dir": "/data/Données/東京", "emoji": "😀", "n": 3}


def test_non_ascii_characters_are_themselves_and_read_back():
    text = json_text(OBJ, indent=2)
    assert '"/data/Données/東京"' in text and '"😀"' in text and "\\u" not in text
    assert json.loads(text) == OBJ


def test_an_encoding_that_cannot_hold_a_character_gets_json_s_escape_for_it_alone():
    """A cp1252 terminal holds é but not 東 or 😀: printing raised UnicodeEncodeError."""
    text = json_text(OBJ, encoding="cp1252")
    assert "Données" in text and "\\u6771\\u4eac" in text and "\\ud83d\\ude00" in text
    text.encode("cp1252")
    assert json.loads(text) == OBJ


def test_an_undecodable_file_name_s_lone_surrogate_keeps_its_escape_in_utf_8(tmp_path):
    """os.fsdecode(b"caf\\xe9") is 'caf\\udce9', which no UTF-8 file can hold: writing the report raised."""
    obj = {"path": "caf\udce9", "name": "é"}
    path = tmp_path / "r.json"
    write_json(path, obj)
    data = path.read_bytes()
    assert b'"caf\\udce9"' in data and "é".encode() in data
    assert json.loads(data.decode("utf-8")) == obj


def test_print_json_follows_stdout_s_encoding(monkeypatch):
    out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", out)
    print_json(OBJ)
    out.seek(0)
    printed = out.read()
    assert "\\u00e9" in printed and json.loads(printed) == OBJ
