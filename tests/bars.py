"""What a command's progress test needs: a stderr that is a terminal, and the three places a bar is asked for."""
import io

import pytest


class Terminal(io.StringIO):
    """A stderr that says it is a terminal, where progress.bars_shown draws a bar."""

    def isatty(self):
        return True


# (terminal, flags, shown): the bar on a terminal, --no-progress there, and a log (`2> run.log`) without the flag
BARS_BY_PLACE = pytest.mark.parametrize("terminal, flag, shown",
                                        [(True, [], True), (True, ["--no-progress"], False), (False, [], False)],
                                        ids=["on-a-terminal", "no-progress", "into-a-log"])
