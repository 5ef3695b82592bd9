"""A command's one-line error under torchrun: said once for the job, and named in torchrun's closing summary.

torchrun's summary (ChildFailedError) shows, for each rank that failed, what the rank left in the file its
TORCHELASTIC_ERROR_FILE names (torch.distributed.elastic.multiprocessing.errors): ``record`` leaves the traceback
of an exception that escapes it, and an error the command turned into an exit status left nothing there
("error_file: <N/A>", "To enable traceback see: ..."). Light: no torch import.
"""

from __future__ import annotations

import json
import os
import sys
import time


def one_of_several() -> bool:
    """Whether this process is one of several of a job (torchrun sets WORLD_SIZE)."""
    world = os.environ.get("WORLD_SIZE", "1")
    return world.isdigit() and int(world) > 1


def says_for_the_job() -> bool:
    """Whether this process speaks for the job: rank 0, or a process of its own. Every rank of a job stops on a
    setting's error, and a rank that stops alone reaches rank 0 as a peer's failure (train.distributed), so the
    other ranks' copies of the line only repeated it."""
    return not one_of_several() or os.environ.get("RANK", "0") == "0"


def say_error(line: str, said: str | None = None) -> None:
    """``line`` (``error: ...``) for the user: on stderr, in one write (under torchrun every rank runs with
    ``python -u``, where print wrote the text and its newline apart, and two ranks' lines ran into one), by the
    process that speaks for the job; under torchrun it is each rank's entry in the launcher's summary too.
    ``said``: what stderr gets, where it is more than the line (argparse's usage above its error)."""
    leave_for_launcher(line)
    if says_for_the_job():
        sys.stderr.write(line + "\n" if said is None else said)
        sys.stderr.flush()


def leave_for_launcher(line: str) -> None:
    """``line`` as this rank's entry in torchrun's summary, where torchrun gave the rank an error file. The
    summary shows an entry's ``py_callstack`` where it has one, else its ``message``: the line, in place of
    ``record``'s traceback of it. The timestamp orders the ranks' failures (the root cause is the first)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    entry = {"message": {"message": line, "extraInfo": {"timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as f:
            json.dump(entry, f)
    except OSError:  # the summary then says <N/A>: no reason to hide the error itself
        pass
