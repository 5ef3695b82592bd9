"""`foxformer data prepare` flags as a shell hands them over."""
import json

from foxformer.cli import main
from foxformer.data.layout import MANIFEST
from foxformer.data.preparation import read_manifest


def _docs(folder, n):
    folder.mkdir()
    for i in range(n):
        (folder / f"{i}.md").write_text(f"document {i} " * 20)
    return [str(folder / f"{i}.md") for i in range(n)]


def test_an_unquoted_glob_gives_one_source_a_file(tmp_path, capsys):
    """`--source docs/*.md` reaches the command as one flag and many words: it failed with 'unrecognized
    arguments: docs/1.md docs/2.md ...', where a folder or repeated --source worked."""
    paths = _docs(tmp_path / "docs", 4)
    out = str(tmp_path / "d")
    assert main(["data", "prepare", "--source", *paths[:3], "--source", paths[3], "--leave-out", *paths[:2],
                 "--out", out, "--tokenizer", "bytes", "--no-progress"]) == 0
    assert [s["spec"] for s in json.loads(capsys.readouterr().out)["sources"]] == paths
    assert read_manifest(out)["config"]["leave_out"] == paths[:2]


def test_max_tokens_per_source_takes_the_token_counts_train_takes(tmp_path, capsys):
    """--max-tokens-per-source 2K was 'invalid int value', while every token count of train takes 2K, 512Ki."""
    paths = _docs(tmp_path / "docs", 1)
    out = str(tmp_path / "d")
    assert main(["data", "prepare", "--source", *paths, "--max-tokens-per-source", "1Ki", "--out", out,
                 "--tokenizer", "bytes", "--val-fraction", "0", "--no-progress"]) == 0
    assert read_manifest(out)["config"]["max_tokens_per_source"] == 1024


def test_a_whitespace_file_among_sources_is_left_out_as_a_folders_would_be(tmp_path, capsys):
    """`--source a.md b.md ws.md`, ws.md only whitespace, stopped the whole prepare ("'ws.md' yielded no non-empty
    documents"), where the same files in a folder gave a dataset and a note; only sources with no document at all
    between them are refused."""
    a, b = _docs(tmp_path / "docs", 2)
    blank, blank_too = tmp_path / "ws.md", tmp_path / "ws2.md"
    blank.write_text("  \n\t\n")
    blank_too.write_text("")
    out = str(tmp_path / "d")
    assert main(["data", "prepare", "--source", a, b, str(blank), "--out", out, "--tokenizer", "bytes",
                 "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert f"note: {blank}: 1 empty document(s) (or only whitespace) left out\n" in captured.err  # no "the first"
    assert json.loads(captured.out)["docs"] == 2
    assert [s["docs"] for s in read_manifest(out)["sources"]] == [1, 1, 0]
    assert main(["data", "prepare", "--source", str(blank), str(blank_too), "--out", str(tmp_path / "none"),
                 "--tokenizer", "bytes", "--no-progress"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (f"error: --source: {str(blank)!r}, {str(blank_too)!r} "
                                                        f"yielded no non-empty documents (2 empty or only whitespace)")


def test_a_non_ascii_path_is_printed_and_written_as_it_is(tmp_path, capsys):
    """The summary printed "Donn\\u00e9es" for a folder named Données, and the manifest kept it so."""
    paths = _docs(tmp_path / "Données", 2)
    out = str(tmp_path / "jeu de données")
    assert main(["data", "prepare", "--source", *paths, "--out", out, "--tokenizer", "bytes", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert f'"out_dir": "{out}"' in printed and f'"{paths[0]}"' in printed and "\\u" not in printed
    manifest = (tmp_path / "jeu de données" / MANIFEST).read_text(encoding="utf-8")
    assert f'"{paths[0]}"' in manifest and "\\u" not in manifest
    assert [s["spec"] for s in read_manifest(out)["sources"]] == paths
