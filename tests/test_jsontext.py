from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from nanobotd.jsontext import json_string


def test_every_ascii_character_is_written_as_json_dumps_writes_it():
    for code in range(128):
        text = f"a{chr(code)}b{chr(code)}"
        assert json_string(text) == json.dumps(text, ensure_ascii=False)


@settings(max_examples=500, deadline=None)
@given(text=st.text() | st.text(alphabet=st.characters(max_codepoint=127)))
def test_any_text_is_written_as_json_dumps_writes_it(text):
    assert json_string(text) == json.dumps(text, ensure_ascii=False)
