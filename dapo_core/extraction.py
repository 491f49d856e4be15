"""Which text of a response is its final answer (the reward's first half, ``dapo_core.reward``).

What counts as the final answer depends on how the prompt asked for it (``answer_format``):

- ``dapo`` (training, and DAPO's own prompt "The last line of your response should be of the
  form Answer: $Answer"): what follows the LAST ``Answer:`` marker, wherever it stands in its
  line (``So we get it. Answer: 540``; ``Answer: 12`` then ``Wait. Answer: 13`` reads 13), up
  to the end of that line. The marker is matched case-insensitively and may carry markdown
  (``**Answer:**``, ``**Answer**:``, ``Final Answer:``). If nothing follows it on its line, the
  next non-blank line is used (models often break the line after the marker); an empty marker
  at the very end counts as truncated. Without a marker, the content of the LAST
  ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces, or LaTeX's unbraced ``\\boxed 4``).
  verl's ``math_dapo`` reward takes the last match of ``(?i)Answer\\s*:\\s*([^\\n]+)`` in the
  response's last 300 characters and has no box fallback. We read the whole response (its
  last ``SCAN_CHARS`` characters), so an answer followed by a long check still counts, where
  verl scores it wrong; the prompt asks for the answer on the last line, and a policy that
  writes it earlier is not punished for the check it adds.
- ``boxed`` ("put your final answer within \\boxed{}": Qwen2.5-Math, DeepSeek-R1, lighteval):
  the last box only.
- ``minerva`` (the Minerva / lm-evaluation-harness prompt, "Final Answer: The final answer is
  $X$. I hope it is correct."): X of the last "final answer is" sentence only.
- ``auto`` (a prompt of unknown style): whichever of those markers comes last in the
  response, ``Final Answer:`` counting anywhere in a line; with none, the sentence that
  Minerva's "I hope it is correct" closes; else a response that is one short line (or one
  display formula) is itself the answer. An answer written as a sentence of prose (``Final
  Answer: Jane started 3 hours ago.``) is the one number it names, if it names exactly one.

Under ``dapo`` (and wherever Answer lines are read) a display formula ``\\[ ... \\]`` or
``$$ ... $$`` opened after the marker is read whole, across its lines.

A Minerva sentence on an Answer line (``Final Answer: The final answer is $100$. I hope it
is correct.``) is read as its value (``$100$``) wherever Answer lines are read.

Cost is bounded: only the last ``SCAN_CHARS`` characters of a response are read, and every
answer text is clipped to ``MAX_PRED_CHARS``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

from dapo_core.answers import box_argument

__all__ = [
    "ANSWER_FORMATS",
    "MAX_PRED_CHARS",
    "SCAN_CHARS",
    "AnswerFormat",
    "extract_answer",
    "sentence_value",
]

AnswerFormat = Literal["dapo", "boxed", "minerva", "auto"]
ANSWER_FORMATS: tuple[str, ...] = ("dapo", "boxed", "minerva", "auto")

# --- limits (each one bounds the work done on adversarial input) -------------------------------

# Only the last SCAN_CHARS characters of a response are searched. DAPO's 20k-token responses are
# ~80 KB, so the last Answer line of any realistic response is inside this window.
SCAN_CHARS = 200_000
# pred strings for answers that are not integers are clipped to this length.
MAX_PRED_CHARS = 200
# A whole response read as a bare answer (format auto) is one line of at most this many chars.
_MAX_BARE_CHARS = 100


def extract_answer(response: str, answer_format: AnswerFormat = "dapo") -> str | None:
    """Return the raw final-answer text of ``response`` in ``answer_format``, or None.

    ``dapo``: the last ``Answer:`` line wins; without one, the content of the last box.
    ``boxed``: the last box. ``minerva``: the last "final answer is X" sentence. ``auto``: the
    latest of the three; else the response itself when it is one short line.
    """
    if not isinstance(response, str):
        return None
    reader = _READERS.get(answer_format)
    if reader is None:
        raise ValueError(f"unknown answer format {answer_format!r}: one of {ANSWER_FORMATS}")
    fast = _last_line_answer(response, answer_format)
    if fast is not None:
        return fast or None
    text = response if len(response) <= SCAN_CHARS else response[-SCAN_CHARS:]
    return reader(text)


def _last_line_answer(response: str, answer_format: str) -> str | None:
    """What the format's reader returns when the last line starts with a plain ``Answer:``, else
    None (then the reader decides; '' is a truncated answer).

    Most training responses end this way, and nothing after the last line can outrank it, so
    reading it costs a few string operations where the reader walks the text. The cases where
    the reader would read the line otherwise are left to it: a later marker on the line, and
    decoration right after the colon (``Answer: **12**``, ``Answer:} 12``). Under ``auto`` only
    a bare integer is read here (a box on that line would be a later marker).
    """
    start = response.rfind("\n") + 1
    if not response.startswith("Answer:", start) or len(response) - start > SCAN_CHARS:
        return None
    content = response[start + 7 :].strip()
    if content.isdigit():
        return content if answer_format == "dapo" or answer_format == "auto" else None
    later_marker = "nswer" in content or "NSWER" in content
    if answer_format != "dapo" or content[:1] in _DECORATION or later_marker:
        return None
    return sentence_value(_without_emphasis(content))


def _dapo_answer(text: str) -> str | None:
    """DAPO's rule: the last Answer marker, wherever it stands in its line, else the last box."""
    found = _last_answer_line(text, anywhere=True)
    if found is not None:
        # An Answer marker with nothing after it is a truncated answer, not a cue to look
        # elsewhere: the model did commit to the Answer-line format.
        return sentence_value(found[1]) or None
    found = _last_boxed(text)
    return None if found is None else found[1]


def _boxed_answer(text: str) -> str | None:
    found = _last_boxed(text)
    return None if found is None else found[1]


def _minerva_answer(text: str) -> str | None:
    found = _last_final_answer_sentence(text)
    return None if found is None else found[1]


def _auto_answer(text: str) -> str | None:
    """The marked answer that comes last (Answer line, Minerva sentence, ``Final Answer:``
    anywhere in a line, box), else the sentence closed by "I hope it is correct", else a bare one.

    A tie cannot happen between different markers' starts, except an Answer line starting with
    "Final Answer:", which both read alike. A box inside an Answer line starts after it, so
    ``Answer: $\\boxed{5}$`` reads the box's content. An answer given in a sentence of prose
    (``Final Answer: Jane started 3 hours ago.``) is the one number it names, if it names one.
    """
    candidates = [
        found
        for found in (
            _last_answer_line(text),
            _last_final_answer_sentence(text),
            _last_final_answer_colon(text),
            _last_boxed(text),
        )
        if found is not None
    ]
    if candidates:
        start, value = max(candidates)
        value = sentence_value(value)
        if not value:
            return None
        return value if text.startswith(("\\boxed", "\\fbox"), start) else _prose_value(value)
    hoped = _hoped_sentence(text)
    if hoped is not None:
        return _prose_value(hoped)
    bare = text.strip()
    if not bare or len(bare) > _MAX_BARE_CHARS:
        return None
    if (m := _BARE_LEAD_RE.match(bare)) is not None:
        bare = bare[m.end() :]
    if "\n" not in bare:
        return bare or None
    # Over several lines only as one display formula: "Answer \\[ \n 9 \n \\]".
    block = _display_block(bare, 0)
    return block[0] if block is not None and block[1] == len(bare) else None


# "Answer $9$", "The answer: 9": a word before a bare answer, which a response of one line may
# carry without a colon.
_BARE_LEAD_RE = re.compile(r"(?:the[ \t]+)?(?:final[ \t]+)?answer\b[ \t]*:?[ \t]*", re.IGNORECASE)

_READERS: dict[str, Callable[[str], str | None]] = {
    "dapo": _dapo_answer,
    "boxed": _boxed_answer,
    "minerva": _minerva_answer,
    "auto": _auto_answer,
}

# Head of an answer line, matched at the start of a line. Allows markdown decoration before and
# around the marker: "**Answer:**", "**Answer**:", "## Final Answer:", "> answer :",
# "\textbf{Answer:}".
_ANSWER_HEAD = (
    r"[ \t]*(?:[>#*_\-][ \t]*)*(?:\\textbf\{[ \t]*)?(?:final[ \t]+)?answer"
    r"[ \t]*(?:\}|[*_]+)?[ \t]*[:：][ \t]*(?:\}|[*_]+)?"
)
_ANSWER_HEAD_RE = re.compile(_ANSWER_HEAD, re.IGNORECASE)
# The marker itself, wherever it stands (format dapo): "Answer:", "answer :", "Answer**:",
# "Answer:**", "\textbf{Answer:}".
_MARKER_RE = re.compile(r"answer[ \t]*(?:\}|[*_]+)?[ \t]*[:：][ \t]*(?:\}|[*_]+)?", re.IGNORECASE)
# What may sit between the word "answer" and its colon; the colon must come within this window.
_COLON_WINDOW = 16
_NEXT_LINE_RE = re.compile(r"\S[^\n]*")


def _last_answer_line(text: str, anywhere: bool = False) -> tuple[int, str] | None:
    """(start, content) of the last answer marker, else None; the content is '' when the
    marker has nothing after it. The marker must start its line (after markdown decoration),
    or, with ``anywhere``, may stand anywhere in it (then ``start`` is the marker's own).

    Walks occurrences of "answer" backwards with str.rfind (a fast C scan) instead of running a
    multiline regex over the whole text: the last occurrence is nearly always the Answer line
    itself, so a normal response costs one iteration. Matching "nswer"/"NSWER" covers Answer,
    answer and ANSWER without lowercasing the text. Each occurrence is looked at once and each
    line is matched at most once, so the walk is linear even on adversarial text.
    """
    rfind, find = text.rfind, text.find  # bound once: this loop is the hot path
    is_ascii = text.isascii()  # O(1); a full-width colon can only occur in non-ASCII text
    end = len(text)
    while True:
        hit = rfind("nswer", 0, end)
        upper = rfind("NSWER", hit + 1, end)  # only a later one matters
        if upper > hit:
            hit = upper
        if hit < 1:
            return None
        window = hit + 5 + _COLON_WINDOW
        if find(":", hit + 5, window) < 0 and (is_ascii or find("：", hit + 5, window) < 0):
            end = hit  # prose such as "the answer is": no colon follows
            continue
        at = hit - 1  # where "answer" starts
        if anywhere:
            m = _MARKER_RE.match(text, at)
            if m is not None:
                return at, _without_emphasis(_line_content(text, m.end()))
            end = hit
            continue
        line_start = rfind("\n", 0, at) + 1
        if at == line_start and text[at] in "aA" and text.startswith(":", hit + 5):
            # "Answer: ...", regex-free
            return line_start, _without_emphasis(_line_content(text, hit + 6))
        m = _ANSWER_HEAD_RE.match(text, line_start)
        if m is not None:
            return line_start, _without_emphasis(_line_content(text, m.end()))
        if line_start == 0:
            return None
        end = line_start  # no other occurrence on this line can start it


_DECORATION = "*_}"  # what a marker may carry right after its colon (_MARKER_RE)


def _without_emphasis(content: str) -> str:
    """An answer line's content without the markdown emphasis around it: ``**12**``, ``12**``
    (the marker took the opening pair: ``Answer: **12**``, ``**Answer: 12**``) -> ``12``. No
    answer starts or ends with ``*`` or ``_``."""
    if content[:1] in "*_" or content[-1:] in "*_":
        return content.strip("*_").strip()
    return content


def _line_content(text: str, start: int) -> str:
    """The rest of the line from ``start``; if blank, the next non-blank line (or ''). A display
    formula opened there (``\\[``, ``$$``) is read to its end, across lines, as one line."""
    line_end = text.find("\n", start)
    if line_end < 0:
        return text[start:].strip()
    content = text[start:line_end].strip()
    if content:
        if (
            content.startswith(_DISPLAY_OPENERS)
            and _DISPLAY_CLOSERS[content[:2]] not in content[2:]
        ):
            block = _display_block(text, text.index(content[0], start))
            if block is not None:
                return block[0]
        return content
    m = _NEXT_LINE_RE.search(text, line_end)
    if m is None:
        return ""
    if m.group().startswith(_DISPLAY_OPENERS):
        block = _display_block(text, m.start())
        if block is not None:
            return block[0]
    return m.group().strip()


# Display formulas, which may span lines: \[ ... \] and $$ ... $$ (inline $...$ and \(...\) may
# not). Read up to MAX_PRED_CHARS characters.
_DISPLAY_OPENERS = ("\\[", "$$")
_DISPLAY_CLOSERS = {"\\[": "\\]", "$$": "$$"}


def _display_block(text: str, start: int) -> tuple[str, int] | None:
    """(the display formula opening at ``start`` and the rest of the line it closes on, joined
    into one line; where that line ends in ``text``), else None. What follows the formula stays
    (``\\[ 5 \\] or \\[ 6 \\]`` is a hedge)."""
    opener = text[start : start + 2]
    closer = _DISPLAY_CLOSERS.get(opener)
    if closer is None:
        return None
    close = text.find(closer, start + 2, start + 2 + MAX_PRED_CHARS)
    if close < 0:
        return None
    end = text.find("\n", close, close + MAX_PRED_CHARS)  # at most a long answer's worth
    end = min(len(text), close + MAX_PRED_CHARS) if end < 0 else end
    return " ".join(text[start:end].split()), end


def _last_boxed(text: str) -> tuple[int, str] | None:
    """(start, content) of the last ``\\boxed``/``\\fbox`` when its argument is whole, else None.

    Only the last box counts: a broken one (a truncated response) is no answer, not a cue to
    read an earlier box."""
    boxed = text.rfind("\\boxed")
    fbox = text.rfind("\\fbox", boxed + 1)  # only a later \fbox matters
    if boxed < 0 and fbox < 0:
        return None
    start, end = (boxed, boxed + 6) if boxed > fbox else (fbox, fbox + 5)
    if text.startswith("{", end):  # the usual flat "\boxed{540}", read without brace_group
        close = text.find("}", end)
        if 0 < close - end <= MAX_PRED_CHARS and "{" not in text[end + 1 : close]:
            content = text[end + 1 : close].strip()
            if text[close - 1] != "\\":
                return (start, content) if content else None
    found = box_argument(text, end)
    if found is None:
        return None
    content = found[0].strip()
    return (start, content) if content else None


# "The final answer is $X$. I hope it is correct." (Minerva; lm-evaluation-harness's minerva_math
# reads X between "The final answer is" and ". I hope it is correct.").
_FINAL_ANSWER_IS_RE = re.compile(r"final[ \t]+answer[ \t]+is\b[ \t]*:?[ \t]*", re.IGNORECASE)
_SENTENCE_HEAD_RE = re.compile(r"(?:the[ \t]+)?final[ \t]+answer[ \t]+is\b[ \t]*:?", re.IGNORECASE)
_HOPE_RE = re.compile(r"I hope it is correct", re.IGNORECASE)


def _last_final_answer_sentence(text: str) -> tuple[int, str] | None:
    """(start, X) of the last "final answer is X" sentence, X up to the end of its line (or on
    the next line when the sentence breaks there), else None."""
    last = None
    for m in _FINAL_ANSWER_IS_RE.finditer(text):
        last = m
    if last is None:
        return None
    # The sentence's own full stop is no part of X ("... is $\frac{1}{2}$.").
    value = sentence_value(_line_content(text, last.end())).rstrip(" .")
    return (last.start(), value) if value else None


def sentence_value(content: str) -> str:
    """``content`` without the Minerva sentence around its value: "The final answer is $100$. I
    hope it is correct." -> "$100$"; anything else is returned as it is.

    Substring tests keep the regexes off the hot path: most answer lines are a bare value.
    """
    if "hope" not in content and "inal answer" not in content and "INAL ANSWER" not in content:
        return content
    hope = _HOPE_RE.search(content)
    if hope is not None:  # what follows it is chatter ("<|im_start|>user", a note)
        content = content[: hope.start()]
    head = _SENTENCE_HEAD_RE.match(content)
    if head is not None:
        content = content[head.end() :]
    return content.strip().rstrip(".").strip()


# "Final Answer:" anywhere in a line (a Minerva-style marker that lost its line break), read by
# the auto format only: DAPO's own marker must start a line.
_FINAL_ANSWER_COLON_RE = re.compile(r"final[ \t]+answer[ \t]*[:：]", re.IGNORECASE)


def _last_final_answer_colon(text: str) -> tuple[int, str] | None:
    """(start, content) of the last "Final Answer:" anywhere in a line, else None."""
    last = None
    for m in _FINAL_ANSWER_COLON_RE.finditer(text):
        last = m
    if last is None:
        return None
    content = _line_content(text, last.end())
    return (last.start(), content) if content else None


# Where a sentence ends: a full stop, "!" or "?" before a blank (not "7.78"), or a line break.
_SENTENCE_END_RE = re.compile(r"[.!?](?=\s)|\n")


def _hoped_sentence(text: str) -> str | None:
    """The sentence before the last "I hope it is correct" (Minerva's closing words) when no
    marker names the answer, e.g. "Therefore, there are 12 sequences. I hope it is correct."."""
    last = None
    for m in _HOPE_RE.finditer(text):
        last = m
    if last is None:
        return None
    head = text[max(0, last.start() - MAX_PRED_CHARS) : last.start()].rstrip().rstrip(".!?")
    ends = [m.end() for m in _SENTENCE_END_RE.finditer(head)]
    sentence = head[ends[-1] if ends else 0 :].strip()
    return sentence or None


# Prose around an answer: words of two letters or more outside math and LaTeX commands.
_MATH_SEGMENT_RE = re.compile(r"\$\$.+?\$\$|\$.+?\$|\\\(.+?\\\)|\\\[.+?\\\]", re.DOTALL)
_PROSE_WORD_RE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_PROSE_NUMBER_RE = re.compile(r"(?<![\w.,])[-+]?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?(?![\w])")
_MIN_PROSE_WORDS = 3


def _prose_value(content: str) -> str:
    """The one number a sentence of prose names ("Jane started 3 hours ago" -> "3"; a formula
    with a digit counts as one, "$\\frac{1}{2}$"); ``content`` itself when it is not prose, has
    LaTeX outside math, or names no number or several (a hedge stays a hedge)."""
    if len(content) > MAX_PRED_CHARS or not any(c.isalpha() for c in content):
        return content
    outside = _MATH_SEGMENT_RE.sub(" ", content)
    if "\\" in outside or len(_PROSE_WORD_RE.findall(outside)) < _MIN_PROSE_WORDS:
        return content  # LaTeX outside math ("2\\frac12 cups"): which number is meant is unclear
    found = [m.group() for m in _MATH_SEGMENT_RE.finditer(content) if _has_digit(m.group())]
    found += _PROSE_NUMBER_RE.findall(outside)
    return found[0] if len(found) == 1 else content


def _has_digit(text: str) -> bool:
    return any(c.isdigit() for c in text)
