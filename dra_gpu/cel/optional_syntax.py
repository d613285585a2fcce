"""Optional field and index syntax (`x.?field`, `x[?key]`: cel-go's OptionalTypes, in Kubernetes since 1.28).

cel-python's grammar has no `.?` or `[?`. Instead of forking the grammar, the text is rewritten so that it
parses with the same positions: `.?name` becomes `._name` and `[?key]` becomes `[ key]`, and the offsets of
the rewritten places are remembered so that the syntax tree converter marks exactly those selections as
optional. String literals and comments are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class OptionalMarks:
    select_names: set[int] = field(default_factory=set)  # offsets of the identifier after `.?` (now `_name`)
    index_starts: set[int] = field(default_factory=set)  # offsets where the key expression of `[?key]` starts


def mark_optional_syntax(text: str) -> tuple[str, OptionalMarks]:
    marks = OptionalMarks()
    if "?" not in text:
        return text, marks
    chars = list(text)
    length = len(text)
    i = 0
    while i < length:
        char = text[i]
        if char in "'\"":
            i = _skip_string(text, i)
            continue
        if char == "/" and text.startswith("//", i):
            end = text.find("\n", i)
            i = length if end == -1 else end
            continue
        if char == "." and i + 1 < length and text[i + 1] == "?":
            chars[i + 1] = "_"
            marks.select_names.add(i + 1)
            i += 2
            continue
        if char == "[" and i + 1 < length and text[i + 1] == "?":
            chars[i + 1] = " "
            j = i + 2
            while j < length and text[j].isspace():
                j += 1
            marks.index_starts.add(j)
            i += 2
            continue
        i += 1
    return "".join(chars), marks


def _skip_string(text: str, start: int) -> int:
    """The offset just after the string literal that starts with the quote at `start`."""
    quote = text[start]
    raw = start > 0 and text[start - 1] in "rR"
    if start > 1 and text[start - 1] in "bB" and text[start - 2] in "rR":
        raw = True
    triple = text.startswith(quote * 3, start)
    i = start + (3 if triple else 1)
    while i < len(text):
        if not raw and text[i] == "\\":
            i += 2
            continue
        if triple and text.startswith(quote * 3, i):
            return i + 3
        if not triple and text[i] == quote:
            return i + 1
        i += 1
    return len(text)
