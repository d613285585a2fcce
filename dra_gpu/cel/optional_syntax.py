"""Optional field, index and entry syntax (cel-go's OptionalTypes, in Kubernetes since 1.28): `x.?field`,
`x[?key]`, and optional entries in literals, `[?a, ?b]` and `{?key: value}`.

cel-python's grammar has none of these. Instead of forking the grammar, the text is rewritten so that it
parses with the same positions: `.?name` becomes `._name`, and a `?` right after `[`, `{` or `,` becomes a
space; the offsets of the rewritten places are remembered so that the syntax tree converter marks exactly
those selections, indexes and entries as optional. (A `?` in those places cannot be the conditional
operator, which always follows an operand.) A mark that the converter does not use, as in `f(a, ?b)`, is a
syntax error. String literals and comments are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class OptionalMarks:
    select_names: set[int] = field(default_factory=set)  # offsets of the identifier after `.?` (now `_name`)
    # offsets where the expression after a rewritten `?` starts: the key of `[?key]`, or an optional entry
    index_starts: set[int] = field(default_factory=set)


def mark_optional_syntax(text: str) -> tuple[str, OptionalMarks]:
    marks = OptionalMarks()
    if "?" not in text:
        return text, marks
    chars = list(text)
    length = len(text)
    previous = ""  # the last character outside strings, comments and white space
    i = 0
    while i < length:
        char = text[i]
        if char in "'\"":
            i = _skip_string(text, i)
            previous = char
            continue
        if char == "/" and text.startswith("//", i):
            end = text.find("\n", i)
            i = length if end == -1 else end
            continue
        if char == "." and i + 1 < length and text[i + 1] == "?":
            chars[i + 1] = "_"
            marks.select_names.add(i + 1)
            previous = "_"
            i += 2
            continue
        if char == "?" and previous in ("[", "{", ","):
            chars[i] = " "
            j = i + 1
            while j < length and text[j].isspace():
                j += 1
            marks.index_starts.add(j)
            previous = "?"
            i += 1
            continue
        if not char.isspace():
            previous = char
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
