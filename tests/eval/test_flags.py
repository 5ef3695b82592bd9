"""Flags of the eval commands as users and scripts pass them: token lengths spelled as elsewhere in the project,
typos in lists caught, and the flags every command shares."""
import numpy as np
import pytest

from foxformer import argtypes
from foxformer.cli import build_parser, main
from foxformer.train import config


def _parsed(argv):
    return build_parser().parse_args(argv)


def test_lengths_take_the_suffixes_of_the_training_config():
    """`--lengths 1Ki` was refused while `context: 16Ki` and `total_tokens: 1Gi` were read everywhere else."""
    args = _parsed(["eval", "niah", "m", "--lengths", "1Ki,4K,2048", "--train-len", "2Ki"])
    assert args.lengths == [1024, 4000, 2048] and args.train_len == 2048
    args = _parsed(["eval", "loss", "m", "--lengths", "512,1Ki", "--seq-len", "4Ki"])
    assert args.lengths == [512, 1024] and args.seq_len == 4096
    assert config.parse_count is argtypes.parse_count  # one reading of a count for the whole project


@pytest.mark.parametrize("text, tokens", [("1k", 1000), ("1K", 1000), ("1Ki", 1024), ("1ki", 1024), ("2M", 2 * 10**6),
                                          ("2Mi", 2 * 2**20), ("1.5Ki", 1536), ("4096", 4096)])
def test_k_and_m_are_powers_of_1000_and_ki_and_mi_of_1024(text, tokens):
    """As the help of each such option says (argtypes.COUNT_SUFFIXES); a sequence length reads them alike."""
    assert argtypes.count(text) == tokens and argtypes.length(text) == tokens


def test_a_sequence_length_written_with_k_runs_as_typed_and_says_so(capsys):
    """`eval loss --seq-len 1k` ran at 1000 tokens without a word, where a length so written is usually meant as
    1Ki (and P(l)'s powers of two then stop at 512): the value is kept, and a note gives the binary spelling."""
    args = _parsed(["eval", "loss", "m", "--seq-len", "1k", "--lengths", "256,2k,1Ki", "--train-len", "1.1k"])
    assert args.seq_len == 1000 and args.lengths == [256, 2000, 1024] and args.train_len == 1100
    said = "(k/M: powers of 1000, Ki/Mi: of 1024)"
    assert capsys.readouterr().err.splitlines() == [f"note: 1k is 1,000 tokens {said}; 1Ki is 1,024",
                                                    f"note: 2k is 2,000 tokens {said}; 2Ki is 2,048",
                                                    f"note: 1.1k is 1,100 tokens {said}"]  # 1.1Ki is no count


def test_a_count_that_is_no_sequence_length_takes_k_without_a_note(capsys):
    """2M documents' tokens are two million as meant: only sequence lengths are noted."""
    args = _parsed(["data", "prepare", "--max-tokens-per-source", "2M"])
    assert args.max_tokens_per_source == 2 * 10**6
    args = _parsed(["eval", "loss", "m", "--seq-len", "4Ki", "--lengths", "512,2048"])
    assert args.seq_len == 4096 and capsys.readouterr().err == ""


def test_an_unknown_niah_mode_is_answered_with_the_closest_one(capsys):
    """`--modes standart` was refused without the hint --preset and --tokenizer give."""
    assert main(["eval", "niah", "no-such-run", "--modes", "easy,standart"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --modes: expected a non-empty subset of ('standard', 'easy'), "
                                               "got 'standart' (did you mean 'standard'?)")


def test_unknown_words_names_each_unknown_word_with_the_closest_choice():
    choices = ("standard", "easy")
    assert argtypes.unknown_words(["easy", "standart", "xyz"], choices) == ("'standart' (did you mean "
                                                                            "'standard'?), 'xyz'")
    assert argtypes.unknown_words(["easy", "standard"], choices) == ""


@pytest.mark.parametrize("lengths", ["256,,512", "256,512,", ""], ids=["double-comma", "trailing-comma", "empty"])
def test_an_empty_item_in_a_list_is_refused(lengths, capsys):
    """"256,,512" ran the grid at 256 and 512 only: the length the typo lost went unnoticed."""
    with pytest.raises(SystemExit) as exc:
        main(["eval", "niah", "m", "--lengths", lengths])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(f"argument --lengths: empty item in {lengths!r}: separate the values with single commas")


@pytest.mark.parametrize("flag", ["--depths", "--modes", "--seeds"])
def test_every_list_flag_refuses_empty_items(flag, capsys):
    with pytest.raises(SystemExit):
        main(["eval", "niah", "m", flag, "1,,0"])
    assert "empty item in '1,,0'" in capsys.readouterr().err


def test_a_length_that_is_no_count_names_the_bad_item(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "niah", "m", "--lengths", "1Ki,2Kb"])
    assert "argument --lengths: expected a token count such as 4096 or 4Ki, got '2Kb'" in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag, text, twice", [
    (["eval", "loss", "m"], "--lengths", "512,1Ki,512", 512),
    (["eval", "loss", "m"], "--lengths", "1Ki,1024", 1024),  # two spellings of one length
    (["eval", "compare", "run"], "--positions", "8,32,8", 8),
], ids=["loss-lengths", "loss-lengths-spelled-twice", "compare-positions"])
def test_a_value_given_twice_is_refused_in_one_line(argv, flag, text, twice, capsys):
    """`eval loss --lengths 512,1Ki,512` dropped the repeat without a word (as eval niah and bench refuse it)."""
    with pytest.raises(SystemExit) as exc:
        main([*argv, flag, text])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(f"error: argument {flag}: {text!r} gives {twice} more than once")


def test_loss_lengths_in_any_order_are_reported_ascending_as_the_help_says(capsys):
    from foxformer.eval.loss import loss_curve

    assert _parsed(["eval", "loss", "m", "--lengths", "4,1,2"]).lengths == [4, 1, 2]
    rows = np.random.default_rng(0).normal(3.0, 0.1, size=(2, 7))
    assert loss_curve(rows, lengths=[4, 1, 2], n_boot=20).lengths == [1, 2, 4]
    assert "results list them in ascending order" in _help(["eval", "loss"], capsys)


def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines where it likes


def test_the_eviction_help_describes_its_one_model(capsys):
    """`eval eviction --help` offered "comma-separated labels for the models" for a command of one model."""
    text = _help(["eval", "eviction"], capsys)
    assert "--names NAME label of the model in the results" in text and "labels for the models" not in text
    assert "override the attention backend of the model " in text
    assert "comma-separated labels for the models" in _help(["eval", "loss"], capsys)


def _options(parser, path=()):
    """(command path, the option's first flag, its action) of every option under ``parser``."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, (*path, name))
        elif action.option_strings:
            yield path, action.option_strings[0], action


def test_every_eval_option_with_a_value_says_what_it_takes_or_its_default():
    """`eval niah --help` listed --max-new-tokens with nothing after it (its default, the answer's tokens + 4, could
    only be read in the code), as eval harness did --num-fewshot and eval mqar --lr and --batch-size."""
    silent = [f"{' '.join(path)} {flag}" for path, flag, action in _options(build_parser())
              if path[:1] in (("eval",), ("analyze",)) and action.nargs != 0 and not action.help
              and action.default is None]
    assert silent == []


def _evaluated_run(tmp_path, name):
    """A folder with the loss.json `eval loss` leaves."""
    from foxformer.eval.loss import loss_curve
    from foxformer.eval.outputs import save_loss

    rows = np.random.default_rng(len(name)).normal(3.0, 0.1, size=(2, 31))
    save_loss([loss_curve(rows, name=name, n_boot=20)], str(tmp_path / name / "eval"),
              {"data": "d", "split": "val", "seq_len": 32, "num_seqs": 2})
    return str(tmp_path / name)


def test_compare_and_report_accept_no_progress_as_every_eval_command_does(tmp_path, capsys):
    """Scripts pass --no-progress to every eval command; compare and report stopped them with "unrecognized
    arguments". Neither shows a progress bar, which their help says."""
    a, b = _evaluated_run(tmp_path, "a"), _evaluated_run(tmp_path, "b")
    assert main(["eval", "compare", a, b, "--out", str(tmp_path / "cmp"), "--no-progress"]) == 0
    assert (tmp_path / "cmp" / "compare.md").exists()
    assert main(["report", a, "--out", str(tmp_path / "report"), "--no-progress"]) == 0
    assert (tmp_path / "report" / "report.md").exists()
    for argv in (["eval", "compare"], ["report"]):
        assert "--no-progress accepted as by the other commands; this one shows no progress bar" in _help(
            argv, capsys)
