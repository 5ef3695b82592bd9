"""A JSONL source as users write it: the forms that read, and a refusal for each line that does not, naming the
file and line with the command that fixes it."""
import codecs
import gzip
import json
import lzma
import os
import re
import shlex
import shutil
import subprocess

import pytest

from foxformer.cli import main
from foxformer.data.sources import iter_documents

ROWS = "".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(3))
TEXTS = ["doc 0", "doc 1", "doc 2"]
JOIN, HAS = '.text |= join("\\n")', 'select(has("text"))'


def fix(program: str, raw: bool = False) -> str:
    """The command a refusal of x.jsonl gives, that rewrites it by the jq ``program`` (quoted for the shell: the
    tests that run it tell whether it is quoted right)."""
    return f"`jq -{'R' if raw else ''}c {shlex.quote(program)} x.jsonl > fixed.jsonl`"


@pytest.mark.parametrize("data", [
    ("\n\n" + ROWS.replace("\n", "\n  \n\t\n")).encode(),
    ROWS.replace("\n", "\r\n").encode(),
    ROWS.rstrip("\n").encode(),
    codecs.BOM_UTF8 + ROWS.replace("\n", "\r\n").encode(),
    # `cat a.jsonl b.jsonl` of two files a Windows editor wrote: b's mark starts a line
    codecs.BOM_UTF8 + ROWS[:ROWS.index("\n") + 1].encode() + codecs.BOM_UTF8 + ROWS[ROWS.index("\n") + 1:].encode(),
], ids=["blank-lines", "crlf", "no-final-newline", "bom-and-crlf", "bom-of-a-joined-file"])
def test_forms_an_editor_writes_just_work(tmp_path, data):
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    assert [d.text for d in iter_documents(str(path))] == TEXTS


@pytest.mark.parametrize("content, said", [
    (ROWS + '{"text": "cut sho', "x.jsonl:4 ends inside a JSON value, with no newline after it: the file is cut "
                                 "short (an interrupted download or write?); fetch or write it again, or delete that "
                                 "line"),
    ("Once upon a time a fox forgot everything it ever knew.\nThe end.\n",
     "x.jsonl:1 is not JSON (the line starts 'Once upon a time a fox forgot everything...'): the file looks like "
     f"plain text; name it .txt to read it as one document, or make each line a document "
     f"({fix('{text: .}', raw=True)})"),
    (ROWS + "a stray note\n", "x.jsonl:4 is not valid JSON at column 1 (Expecting value) (the line starts "
                              "'a stray note')"),
    ('[\n  {"text": "a"}\n]\n', "x.jsonl:1 ends inside a JSON value (the line starts '['): JSONL takes one whole "
                                "object per line"),
    ('{"text": "line one\nline two"}\n', "x.jsonl:1 ends inside a JSON string (the line starts '{\"text\": \"line "
                                         "one'): a line break inside a text is written \\n in JSON Lines"),
    ('{"text": "a"}{"text": "b"}\n', "x.jsonl:1 holds more than one JSON value (the second at column 14) (the line "
                                     "starts '{\"text\": \"a\"}{\"text\": \"b\"}'): JSONL takes one object per line "
                                     f"({fix('.')} writes each one on its own)"),
    (ROWS + "{'text': 'a'}\n", "x.jsonl:4 is not valid JSON at column 2 (the line starts \"{'text': 'a'}\"): JSON "
                               "quotes with \", where a Python dict's repr has ' (write each row with json.dumps)"),
    ('{"text": "a"}\n{"text": "b",}\n', "x.jsonl:2 is not valid JSON at column 14 (Expecting property name "
                                        "enclosed in double quotes) (the line starts '{\"text\": \"b\",}')"),
    ('[{"text": "a"}, {"text": "b"}]\n', "x.jsonl:1 holds a JSON list, not an object: JSONL takes one object per "
                                         f"line, e.g. {{\"text\": \"...\"}} ({fix('.[]')} writes an array "
                                         f"one element a line)"),
], ids=["truncated-last-line", "plain-text-file", "stray-text-line", "pretty-printed-array", "raw-line-break",
        "two-objects-on-a-line", "python-repr", "trailing-comma", "array-on-one-line"])
def test_a_line_that_is_not_a_json_object_is_shown_with_its_fix(tmp_path, monkeypatch, content, said):
    """Each was "is not valid JSON at column N (json's message)", without the line or a way out."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.jsonl").write_text(content)
    with pytest.raises(ValueError, match=re.escape(said)):
        list(iter_documents("x.jsonl"))


@pytest.mark.parametrize("row, said", [
    ({"text": ["para one", "para two"]}, "has a list of texts in field 'text', not text: join them into one "
                                         f"({fix(JOIN)})"),
    ({"text": {"lang": "en", "body": "the text"}}, "has an object in field 'text', not text: a field inside it is "
                                                   f"not read; copy its text out ({fix('.text |= .body')})"),
    ({"label": "spam", "text": 3}, "has 3 (a number) in field 'text', not text; texts are JSON strings: quote it if "
                                   "it is one; the line has text in 'label'"),
    ({"text": True}, "has true (a boolean) in field 'text', not text; texts are JSON strings: quote it if it is "
                     "one"),
    ({"text": [1, "a"]}, "has a list in field 'text', not text"),
], ids=["list-of-texts", "object", "number", "boolean", "mixed-list"])
def test_a_text_that_is_not_a_string_says_how_to_make_it_one(tmp_path, monkeypatch, row, said):
    """Each was "has a value of type list in field 'text', not text", with no way to make it text."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.jsonl").write_text(ROWS + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=re.escape(f"x.jsonl:4 {said}")):
        list(iter_documents("x.jsonl"))


@pytest.mark.parametrize("content, field, said", [
    ('{"txt": "a", "id": 1}\n', "text", "x.jsonl:1 has no field 'text' (its fields: 'txt', 'id') (did you mean "
                                        "'txt'?); set text_field / --text-field"),
    ('{"body": "a", "id": 1}\n', "text", "x.jsonl:1 has no field 'text' (its fields: 'body', 'id'); set text_field "
                                         "/ --text-field"),
    (ROWS + '{"txt": "a"}\n', "text", "x.jsonl:4 has no field 'text', which the lines before it have (its fields: "
                                      "'txt') (did you mean 'txt'?): fix the line, or leave out the rows without it "
                                      f"({fix(HAS)})"),
    ('{"meta": {"text": "a"}}\n', "meta.text", "x.jsonl:1 has no field 'meta.text': a field inside another ('meta') "
                                               f"is not read; copy the text to a top-level field "
                                               f"({fix('. + {text: .meta.text}')}) and give that"),
], ids=["first-line-close-name", "first-line-other-name", "one-later-line", "nested-field"])
def test_a_missing_text_field_names_the_fields_there_are(tmp_path, monkeypatch, content, field, said):
    """The advice was "set --text-field" for a row gone wrong among rows that read, and for the field just set."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.jsonl").write_text(content)
    with pytest.raises(ValueError, match=re.escape(said)):
        list(iter_documents("x.jsonl", text_field=field))


def test_the_command_line_says_it_after_the_source_flag(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.jsonl").write_text('{"text": ["a", "b"]}\n')
    assert main(["data", "prepare", "--source", "x.jsonl", "--out", "d", "--tokenizer", "bytes", "--no-progress"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (f"error: --source: x.jsonl:1 has a list of texts in field "
                                                        f"'text', not text: join them into one ({fix(JOIN)})")


def test_the_note_of_empty_rows_names_the_first_by_file_and_line(tmp_path, monkeypatch, capsys):
    """A null text is an empty document, and the note said how many there were but not where: a row's own id
    (the usual JSONL dataset's) hides its line, so the file and line are kept beside it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.jsonl").write_text('{"id": "a", "text": "some text"}\n\n{"id": "b", "text": null}\n'
                                      '{"id": "c", "text": " "}\n')
    assert main(["data", "prepare", "--source", "x.jsonl", "--out", "d", "--tokenizer", "bytes", "--no-progress"]) == 0
    assert ("note: x.jsonl: 2 empty document(s) (or only whitespace) left out, the first at x.jsonl:3"
            in capsys.readouterr().err.splitlines())


def _written(path, content: str, compression: str) -> None:
    """``content`` written to ``path``, compressed as its name says."""
    opener = {"": open, ".gz": gzip.open, ".xz": lzma.open}[compression]
    with opener(path, "wt", encoding="utf-8") as f:
        f.write(content)


@pytest.mark.skipif(shutil.which("jq") is None, reason="needs jq")
@pytest.mark.parametrize("compression", ["", ".gz", ".xz"], ids=["plain", "gzip", "xz"])
@pytest.mark.parametrize("content, field, texts", [
    ('{"text": ["a", "b"]}\n', "text", ["a\nb"]),
    ('{"text": {"body": "a"}}\n', "text", ["a"]),
    ('[\n  {"text": "a"},\n  {"text": "b"}\n]\n', "text", ["a", "b"]),
    ('{"text": "a"}{"text": "b"}\n', "text", ["a", "b"]),
    ("first line\nsecond line\n", "text", ["first line", "second line"]),
    ('{"text": "a"}\n{"txt": "b"}\n', "text", ["a"]),
    ('{"it\'s text": ["a", "b"]}\n', "it's text", ["a\nb"]),
    ('{"it\'s text": "a"}\n{"txt": "b"}\n', "it's text", ["a"]),
    ("first line\n", "it's text", ["first line"]),
    ('{"meta": {"it\'s": "a"}}\n', "meta.it's", ["a"]),
], ids=["list-of-texts", "object", "pretty-printed-array", "two-objects-on-a-line", "plain-text", "one-later-line",
        "quote-in-field-list-of-texts", "quote-in-field-one-later-line", "quote-in-field-plain-text",
        "quote-in-nested-field"])
def test_the_jq_command_a_refusal_gives_fixes_the_file(tmp_path, monkeypatch, content, field, texts, compression):
    """The commands assumed a file jq reads (a .jsonl.gz is none) and broke the shell's quoting at a ' in a
    field's name. Run from another folder: the command names the file as given."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in dir").mkdir()
    path = os.path.join("in dir", f"x.jsonl{compression}")
    _written(path, content, compression)
    with pytest.raises(ValueError) as refused:
        list(iter_documents(path, text_field=field))
    command = re.findall(r"`([^`]*)`", str(refused.value))[0]
    assert command.startswith({"": "jq ", ".gz": "gzip -dc ", ".xz": "xz -dc "}[compression])
    subprocess.run(command, shell=True, check=True)
    # a nested field's fix copies it to "text", which is then the field to give
    read_as = "text" if "." in field else field
    assert [d.text for d in iter_documents("fixed.jsonl", text_field=read_as)] == texts


@pytest.mark.parametrize("content", ['{\n  "name": "pkg",\n  "version": "1.0"\n}\n', '["a", "b"]\n',
                                     '{"name": "pkg", "version": "1.0"}\n'],
                         ids=["pretty-printed", "array", "no-text-field"])
def test_a_json_file_of_no_documents_in_a_folder_is_refused_with_how_to_do_without_it(tmp_path, content):
    """A folder's package.json or settings file was refused with jq commands that rewrite it as documents, which
    it does not hold; a later line's refusal is of a row, and a file given alone is the user's choice."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("a document")
    (tmp_path / "docs" / "package.json").write_text(content)
    with pytest.raises(ValueError) as e:
        list(iter_documents(str(tmp_path / "docs")))
    assert str(e.value).startswith(f"source: {tmp_path}/docs/package.json:1 ")
    assert str(e.value).endswith(f"; if the file holds no documents, move it out of '{tmp_path}/docs'")
    with pytest.raises(ValueError) as e:
        list(iter_documents(str(tmp_path / "docs" / "package.json")))
    assert "if the file holds no documents" not in str(e.value)
    (tmp_path / "docs" / "package.json").write_text(ROWS + content)
    with pytest.raises(ValueError) as e:
        list(iter_documents(str(tmp_path / "docs")))
    assert "if the file holds no documents" not in str(e.value)
