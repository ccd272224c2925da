"""What-if knobs that no recording makes sense of are refused in words, never run under a
label that claims them (issue 43: block_size=0 and max_num_seqs=0 ran as recorded, a
rate_scale of 1e-300 printed a 300-digit span)."""

from __future__ import annotations

import pytest
from whatif_recordings import record_session

from kvscope.app.cli.main import main
from kvscope.engine.trace import read_trace
from kvscope.engine.whatif import WhatIf, resolve


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    return record_session(tmp_path_factory.mktemp("knobs"))


@pytest.mark.parametrize(
    "text, message",
    [
        ({"block_size": "0"}, "block_size 0 is not a count: it must be >= 1"),
        ({"max_num_seqs": "0"}, "max_num_seqs 0 is not a count: it must be >= 1"),
        ({"max_batched_tokens": "-4"}, "max_batched_tokens -4 is not a count"),
        ({"num_blocks": "0"}, "num_blocks 0 is not a count"),
        ({"rate_scale": "1e-300"}, r"rate_scale 1e-300 is not in \[0.01, 100\]"),
        ({"rate_scale": "nan"}, r"rate_scale nan is not in \[0.01, 100\]"),
        ({"rate_scale": "inf"}, r"rate_scale inf is not in \[0.01, 100\]"),
    ],
)
def test_a_knob_out_of_range_is_refused_in_words(session, text, message):
    with pytest.raises(ValueError, match=message):
        WhatIf.from_text(text)
    # Built in code rather than parsed, the same values are refused where they are resolved.
    what = WhatIf(**{k: (float if k == "rate_scale" else int)(v) for k, v in text.items()})
    with pytest.raises(ValueError, match=message):
        resolve(read_trace(session).settings, what)


def test_the_command_refuses_them_before_simulating(session, capsys):
    for setting in ("block_size=0", "max_num_seqs=0", "rate_scale=1e-300"):
        assert main(["whatif", str(session), "--set", setting, "--jobs", "1"]) == 2
        captured = capsys.readouterr()
        assert captured.err.startswith("error: ") and "Traceback" not in captured.err
        assert "simulations in" not in captured.out
