"""Server-sent events from text that arrives in pieces of any size: the ``data`` of each
complete event, as the ``openai`` SDK's own SSE decoder dispatches it, in bounded memory.

Used for response bodies the user reads raw (``iter_lines``/``iter_text``/``iter_bytes``,
sync or async, or ``read()``/``text()``): one splitter takes whatever text arrives. The
JSON of an event, of a whole body, or of one LiteLLM logged, is decoded by
:func:`decode_json`, under the same bound.

- A line ends at ``\\r\\n``, ``\\n`` or ``\\r``; a ``\\r\\n`` split between two pieces is
  one line end.
- A blank line ends an event; its ``data:`` lines (one leading space dropped) are joined
  with ``\\n``. Comments (``:...``) and the other fields (``event``, ``id``, ``retry``)
  are skipped. An event without data yields nothing; an event the body never ends (no
  blank line after it) is not yielded either, as with the SDK.
- One exception: a ``data: [DONE]`` line that starts an event (OpenAI's end of stream) is
  yielded at once: a reader of ``iter_lines()`` may stop at that line, before the blank
  line that ends its event.
- Lines from ``iter_lines()`` (:meth:`SseSplitter.line`) come already split, and httpx
  splits them as ``str.splitlines`` does: also at U+0085, U+2028 and U+2029, which JSON
  strings may hold raw. A ``data:`` line that ends inside a JSON string was cut at one of
  them, and the next line continues it.
- An event holding more than ``MAX_EVENT_CHARS`` characters (its data so far plus the line
  being read) is dropped whole, with a rate-limited debug log: from then on its text is
  only scanned for line ends and never kept, until the blank line that ends it.
"""

from __future__ import annotations

import enum
import json
import logging
import re
from typing import Any

from spec_decode_otel._logging import rate_limited

#: The largest SSE event (or JSON body) read raw that is decoded: 16 Mi characters
#: (16 MiB of ASCII), the largest body SECURITY.md's worst-case cost covers and far above
#: any real chunk, the Responses API's ``response.completed`` (which repeats the whole
#: output) included. Larger ones give no record; the user's reads are untouched.
MAX_EVENT_CHARS = 16 * 1024 * 1024


class Undecoded(enum.Enum):
    """Why :func:`decode_json` gave no value."""

    TOO_LARGE = "over MAX_EVENT_CHARS"
    NOT_JSON = "not JSON"


def decode_json(text: str | bytes) -> Any:
    """A server's JSON text (a body or an event), decoded, or the :class:`Undecoded` reason
    it was not: over ``MAX_EVENT_CHARS`` (never handed to the decoder), or not JSON, nested
    too deep for the decoder included. It never raises and never logs: whether a text
    that is not JSON deserves a debug line (a body read raw) or is expected (the error
    text LiteLLM logs for a failed call) is for the caller to say."""
    if len(text) > MAX_EVENT_CHARS:
        return Undecoded.TOO_LARGE
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return Undecoded.NOT_JSON


#: What ends an SSE line (and a line of JSON lines). Not ``str.splitlines``, which also
#: splits at U+2028, U+2029 and U+0085: JSON strings may hold those raw (engines that
#: write UTF-8 JSON send them so), but never an unescaped line end.
LINE_END = re.compile(r"\r\n|\r|\n")
#: A run of line ends: one ends a line; more (a blank line, or a flood of them, which ends
#: an event and then does nothing) are dealt with once, not a line at a time.
_LINE_ENDS = re.compile(r"([\r\n]+)")  # one character class: no backtracking stack
_ONE_LINE_END = frozenset(("\n", "\r", "\r\n"))
#: Put back where ``iter_lines()`` cut a JSON string: which of U+0085, U+2028 and U+2029
#: it was is lost, and only the string's content, which is never read, differs.
CUT_LINE_END = "\u2028"
#: The SSE fields a server sends: a line that starts one is never part of a cut JSON string.
FIELD_STARTS = ("data:", "event:", "id:", "retry:")


def ends_in_json_string(text: str, inside: bool = False) -> bool:
    """Whether JSON text that begins inside a string (``inside``) or not ends inside one:
    each quote that no backslash escapes opens or closes a string. Escaped backslashes
    are taken out first, so a backslash left before a quote escapes it. Linear in
    ``text``, and it makes at most one copy of it (a regular expression's substitution
    made one object per escape: 25 times the text for a line of escapes)."""
    unpaired = text.replace("\\\\", "")
    quotes = unpaired.count('"') - unpaired.count('\\"')
    return inside != (quotes % 2 == 1)


class TextPieces:
    """Text that arrives in pieces, to be joined at the end. Every ``JOIN_EVERY`` pieces
    are joined into one, so a flood of tiny pieces (a body of one-character lines) costs
    about its characters, not a Python object each."""

    JOIN_EVERY = 1024

    def __init__(self) -> None:
        self._joined: list[str] = []
        self._pieces: list[str] = []

    def append(self, text: str) -> None:
        self._pieces.append(text)
        if len(self._pieces) >= self.JOIN_EVERY:
            self._joined.append("".join(self._pieces))
            self._pieces.clear()

    def text(self) -> str:
        return "".join(self._joined) + "".join(self._pieces)

    def clear(self) -> None:
        self._joined.clear()
        self._pieces.clear()

    def __bool__(self) -> bool:
        return bool(self._pieces or self._joined)


class SseSplitter:
    """Feed it text with :meth:`feed`; it returns the data of the events that text ended."""

    def __init__(self, max_event_chars: int = MAX_EVENT_CHARS) -> None:
        self._max = max_event_chars
        #: The line being read (nothing of it while dropping), and its length.
        self._line: list[str] = []
        self._line_chars = 0
        #: The current event's data lines, and their joined length (each line counts the
        #: ``\n`` that joins it to the next, so empty lines count too).
        self._data: list[str] = []
        self._data_chars = 0
        #: The current event went over the limit: skip it to its end.
        self._dropping = False
        #: The last piece ended with ``\r``: a ``\n`` starting the next one ends no line.
        self._after_cr = False
        #: A ``data:`` line that ``iter_lines()`` cut inside a JSON string: its pieces,
        #: their length, and the blank lines read after the last one.
        self._cut = TextPieces()
        self._cut_chars = 0
        self._cut_blanks = 0

    def feed(self, text: str) -> list[str]:
        if not text:
            return []
        if self._after_cr and text[0] == "\n":
            text = text[1:]
        self._after_cr = text.endswith("\r")
        *ended, rest = _LINE_ENDS.split(text)
        events: list[str] = []
        for piece, line_ends in zip(ended[::2], ended[1::2], strict=True):
            self._complete(piece, events)
            if line_ends not in _ONE_LINE_END:  # a blank line: the event ends
                self._complete("", events)
        if rest:
            self._line_chars += len(rest)
            if not self._dropping:
                if self._data_chars + self._line_chars > self._max:
                    self._drop()
                else:
                    self._line.append(rest)
        return events

    def line(self, line: str) -> list[str]:
        """One line from ``iter_lines()``, without its line end: the data of the event it
        ends, if any. A ``data:`` line that ends inside a JSON string was cut (the
        module's docstring says where) and is held: the lines after it continue it until
        its strings close, unless one starts a field, which shows it was no JSON string
        (a truncated event) but a line of its own. A blank line there is either two cuts
        in a row or the end of the event: the line after it tells which."""
        events: list[str] = []
        if self._cut and not line.startswith(FIELD_STARTS):
            self._cut_chars += len(line) + 1
            if not line:
                self._cut_blanks += 1
            else:
                self._cut.append(CUT_LINE_END * (self._cut_blanks + 1) + line)
                self._cut_blanks = 0
                if not ends_in_json_string(line, inside=True):
                    self._end_cut(events)
                    return events
            if self._data_chars + self._cut_chars > self._max:
                self._end_cut(events)  # dropped whole: over the bound
            return events
        if self._cut:
            self._end_cut(events)
        if line.startswith("data:") and ends_in_json_string(line):
            self._cut.append(line)
            self._cut_chars = len(line)
        else:
            self._complete(line, events)
        return events

    def _end_cut(self, events: list[str]) -> None:
        """The held line is complete; so is its event if a blank line followed it."""
        line, blank = self._cut.text(), self._cut_blanks > 0
        self._cut.clear()
        self._cut_chars = self._cut_blanks = 0
        self._complete(line, events)
        if blank:
            self._complete("", events)

    def _complete(self, piece: str, events: list[str]) -> None:
        """``piece`` ends the line being read."""
        size = self._line_chars + len(piece)
        if size == 0:
            self._end_event(events)
            return
        if not self._dropping:
            if self._data_chars + size > self._max:
                self._drop()
            else:
                self._field("".join(self._line) + piece if self._line else piece, events)
        self._line.clear()
        self._line_chars = 0

    def _field(self, line: str, events: list[str]) -> None:
        name, _, value = line.partition(":")
        if name != "data":
            return
        value = value.removeprefix(" ")
        if not self._data and value.startswith("[DONE]"):
            events.append(value)
            return
        self._data.append(value)
        self._data_chars += len(value) + 1

    def _end_event(self, events: list[str]) -> None:
        if self._data and not self._dropping:
            events.append("\n".join(self._data))
        self._data.clear()
        self._data_chars = 0
        self._dropping = False

    def _drop(self) -> None:
        self._dropping = True
        self._data.clear()
        self._data_chars = 0
        self._line.clear()
        rate_limited.log(
            logging.DEBUG,
            "sse.oversized",
            "spec_decode_otel: an SSE event of more than %d characters was not decoded",
            self._max,
        )
