"""Parse CEL text with cel-python's Lark grammar and turn the parse tree into a small typed syntax tree.

The syntax tree is what the checker, the reference analysis and the closure compiler work on. Macros are
expanded here (`has`, `all`, `exists`, `exists_one`, `map`, `filter`, `cel.bind`), as cel-go's parser does, so
that `cel.bind` needs no fork of cel-python: it is recognised in the tree, not in the grammar.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import celpy.celparser
import lark
from celpy.celparser import CELParseError, CELParser
from celpy.evaluation import celbytes, celstr

from dra_gpu.cel.errors import CelCompileError
from dra_gpu.cel.library import QUALIFIED_FUNCTIONS, TYPE_NAMES
from dra_gpu.cel.optional_syntax import OptionalMarks, mark_optional_syntax
from dra_gpu.cel.values import INT64_MAX, INT64_MIN, UINT64_MAX, Uint

MAX_EXPRESSION_LENGTH = 10 * 1024  # CELSelectorExpressionMaxLength
SORT_BY_INPUT = "@__sortBy_input__"  # not a valid identifier, so expressions cannot refer to it


@dataclass
class Node:
    line: int | None = field(default=None, kw_only=True)
    column: int | None = field(default=None, kw_only=True)


@dataclass
class Literal(Node):
    value: Any


@dataclass
class Ident(Node):
    name: str


@dataclass
class Select(Node):
    operand: Node
    name: str
    test_only: bool = False  # has(operand.name)
    optional: bool = False  # operand.?name


@dataclass
class Index(Node):
    operand: Node
    index: Node
    optional: bool = False  # operand[?index]


@dataclass
class Call(Node):
    function: str
    target: Node | None
    args: list[Node]


@dataclass
class ListLit(Node):
    items: list[Node]
    optional: frozenset[int] = frozenset()  # positions of `?item` entries


@dataclass
class MapLit(Node):
    entries: list[tuple[Node, Node]]
    optional: frozenset[int] = frozenset()  # positions of `?key: value` entries


@dataclass
class Unary(Node):
    op: str  # "!_" or "-_"
    operand: Node


@dataclass
class Binary(Node):
    op: str  # "_+_", "_<_", "_==_", "_in_", ...
    left: Node
    right: Node


@dataclass
class Logical(Node):
    op: str  # "_&&_" or "_||_"
    left: Node
    right: Node


@dataclass
class Conditional(Node):
    condition: Node
    if_true: Node
    if_false: Node


@dataclass
class Comprehension(Node):
    macro: str  # all, exists, exists_one, map, filter
    range: Node
    var: str
    var2: str | None  # two-variable form: var = index/key, var2 = value
    body: Node
    transform: Node | None = None  # map(x, filter, transform)


@dataclass
class Bind(Node):
    var: str
    init: Node
    body: Node


_RELATIONS = {
    "relation_lt": "_<_",
    "relation_le": "_<=_",
    "relation_gt": "_>_",
    "relation_ge": "_>=_",
    "relation_eq": "_==_",
    "relation_ne": "_!=_",
    "relation_in": "_in_",
}
_ADDITIONS = {"addition_add": "_+_", "addition_sub": "_-_"}
_MULTIPLICATIONS = {"multiplication_mul": "_*_", "multiplication_div": "_/_", "multiplication_mod": "_%_"}
_MACROS = {"all", "exists", "exists_one", "existsOne", "map", "filter"}

_parser: CELParser | None = None


def _get_parser() -> CELParser:
    # CELParser keeps one class-level Lark parser; any tree class works for us because we only read the tree.
    global _parser
    if _parser is None:
        if CELParser.CEL_PARSER is None:
            CELParser.CEL_PARSER = _cached_lark()
        _parser = CELParser(tree_class=lark.Tree)
    return _parser


def _cached_lark() -> lark.Lark:
    """cel-python's parser, built with the options it uses, its LALR tables cached on disk.

    Building the tables takes ~0.1 s, paid by every `explain`, `lint` and webhook start; loading them takes
    ~7 ms. The cache is Lark's own: a file in the user's cache directory, used only when the grammar, the
    options and Lark's version hash to what it was made from, and silently skipped when it cannot be read or
    written (a read-only home in a container)."""
    grammar = (Path(celpy.celparser.__file__).parent / "cel.lark").read_text()
    cache: str | bool = False
    # A user with no home (an arbitrary UID in a container) gets "~" back: then no cache, not a "~" folder.
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if os.path.isabs(cache_home):
        cache_dir = Path(cache_home) / "dra-gpu"
        with contextlib.suppress(OSError):
            cache_dir.mkdir(parents=True, exist_ok=True)
        cache = str(cache_dir / f"cel-lalr-lark-{lark.__version__}.cache")
    return lark.Lark(
        grammar,
        parser="lalr",
        start="expr",
        debug=True,
        g_regex_flags=re.M,
        lexer_callbacks={"IDENT": CELParser.ambiguous_literals},
        propagate_positions=True,
        maybe_placeholders=False,
        priority="invert",
        tree_class=lark.Tree,
        cache=cache,
    )


def parse(expression: str) -> Node:
    if len(expression.encode("utf-8")) > MAX_EXPRESSION_LENGTH:
        raise CelCompileError(
            f"expression is longer than {MAX_EXPRESSION_LENGTH} bytes", expression, None, None
        )
    text, marks = mark_optional_syntax(expression)
    try:
        tree = _get_parser().parse(text)
    except CELParseError as error:
        raise CelCompileError(_syntax_message(error), expression, error.line, error.column) from None
    except lark.exceptions.LarkError as error:
        line = getattr(error, "line", None)
        column = getattr(error, "column", None)
        raise CelCompileError(
            f"Syntax error: {str(error).splitlines()[0]}", expression, line, column
        ) from None
    return _Converter(expression, marks).convert_root(tree)


def _syntax_message(error: CELParseError) -> str:
    inner = error.__context__
    if isinstance(inner, lark.exceptions.UnexpectedToken):
        token = inner.token
        if token.type == "$END":
            return "Syntax error: unexpected end of input"
        return f"Syntax error: mismatched input {str(token)!r}"
    if isinstance(inner, lark.exceptions.UnexpectedCharacters):
        return f"Syntax error: token recognition error at: {inner.char!r}"
    return "Syntax error: invalid expression"


class _Converter:
    def __init__(self, expression: str, marks: OptionalMarks | None = None):
        self.expression = expression
        self.marks = marks or OptionalMarks()
        self.used_marks: set[int] = set()

    def convert_root(self, tree: lark.Tree[Any]) -> Node:
        node = self.convert(tree)
        unused = self.marks.index_starts - self.used_marks
        if unused:
            offset = min(unused)
            line = self.expression.count("\n", 0, offset) + 1
            column = offset - (self.expression.rfind("\n", 0, offset) + 1)  # column of the `?`
            raise CelCompileError("Syntax error: mismatched input '?'", self.expression, line, column)
        return node

    def error(self, message: str, where: lark.Tree[Any] | lark.Token | None) -> CelCompileError:
        line, column = _position(where)
        return CelCompileError(message, self.expression, line, column)

    def convert(self, tree: lark.Tree[Any]) -> Node:
        method = getattr(self, "_" + str(tree.data), None)
        if method is None:
            raise self.error(f"unsupported syntax: {tree.data}", tree)
        node: Node = method(tree)
        if node.line is None:
            node.line, node.column = _position(tree)
        return node

    def _expr(self, tree: lark.Tree[Any]) -> Node:
        if len(tree.children) == 1:
            return self.convert(tree.children[0])
        condition, if_true, if_false = (self.convert(c) for c in tree.children)
        return Conditional(condition, if_true, if_false)

    def _conditionalor(self, tree: lark.Tree[Any]) -> Node:
        if len(tree.children) == 1:
            return self.convert(tree.children[0])
        return Logical("_||_", self.convert(tree.children[0]), self.convert(tree.children[1]))

    def _conditionaland(self, tree: lark.Tree[Any]) -> Node:
        if len(tree.children) == 1:
            return self.convert(tree.children[0])
        return Logical("_&&_", self.convert(tree.children[0]), self.convert(tree.children[1]))

    def _binary(self, tree: lark.Tree[Any], ops: dict[str, str]) -> Node:
        if len(tree.children) == 1:
            return self.convert(tree.children[0])
        op_tree, right = tree.children
        left = op_tree.children[0]
        node = Binary(ops[op_tree.data], self.convert(left), self.convert(right))
        node.line, node.column = _position(right)
        return node

    def _relation(self, tree: lark.Tree[Any]) -> Node:
        return self._binary(tree, _RELATIONS)

    def _addition(self, tree: lark.Tree[Any]) -> Node:
        return self._binary(tree, _ADDITIONS)

    def _multiplication(self, tree: lark.Tree[Any]) -> Node:
        return self._binary(tree, _MULTIPLICATIONS)

    def _unary(self, tree: lark.Tree[Any]) -> Node:
        if len(tree.children) == 1:
            return self.convert(tree.children[0])
        op_tree, operand = tree.children
        op = "!_" if op_tree.data == "unary_not" else "-_"
        inner = self.convert(operand)
        if (
            op == "-_"
            and isinstance(inner, Literal)
            and type(inner.value) in (int, float)
            and inner.value != 0
        ):
            pass  # keep as a negation of a literal; evaluation folds it
        return Unary(op, inner)

    def _member(self, tree: lark.Tree[Any]) -> Node:
        return self.convert(tree.children[0])

    def _member_dot(self, tree: lark.Tree[Any]) -> Node:
        operand, name = tree.children
        text = str(name)
        qualified = f"{_bare_ident(operand)}.{text}"
        if qualified in TYPE_NAMES:
            return Ident(qualified)  # a qualified type name such as net.CIDR
        optional = isinstance(name, lark.Token) and name.start_pos in self.marks.select_names
        node = Select(self.convert(operand), text[1:] if optional else text, optional=optional)
        node.line, node.column = _position(name)
        return node

    def _member_index(self, tree: lark.Tree[Any]) -> Node:
        operand, index = tree.children
        optional = self._optional_mark(index)
        return Index(self.convert(operand), self.convert(index), optional=optional)

    def _member_object(self, tree: lark.Tree[Any]) -> Node:
        raise self.error("message construction is not supported in the DRA selector environment", tree)

    def _member_dot_arg(self, tree: lark.Tree[Any]) -> Node:
        target_tree, name_token = tree.children[0], tree.children[1]
        args = (
            list(tree.children[2].children) if len(tree.children) > 2 and tree.children[2] is not None else []
        )
        name = str(name_token)
        target_name = _bare_ident(target_tree)
        if target_name == "cel" and name == "bind":
            return self._bind(tree, args)
        if target_name is not None and f"{target_name}.{name}" in QUALIFIED_FUNCTIONS:
            node: Node = Call(f"{target_name}.{name}", None, [self.convert(a) for a in args])
        elif name == "sortBy" and len(args) == 2 and _bare_ident(args[0]) is not None:
            node = self._sort_by(tree, target_tree, args)
        elif name in _MACROS and len(args) in (2, 3) and _bare_ident(args[0]) is not None:
            node = self._comprehension(tree, name, target_tree, args)
        else:
            node = Call(name, self.convert(target_tree), [self.convert(a) for a in args])
        node.line, node.column = _position(name_token)
        return node

    def _sort_by(self, tree: lark.Tree[Any], target_tree: lark.Tree[Any], args: list[Any]) -> Node:
        """ext.Lists' `sortBy` macro, expanded as cel-go does: bind the list to a hidden variable, then
        `@sortByAssociatedKeys(list, list.map(e, key))`."""
        target = self.convert(target_tree)
        if isinstance(target, Literal | MapLit):
            raise self.error(
                "sortBy can only be applied to a list, identifier, comprehension, call or select expression",
                target_tree,
            )
        var = _bare_ident(args[0])
        assert var is not None
        line, column = _position(tree.children[1])
        keys = Comprehension(
            "map", Ident(SORT_BY_INPUT, line=line, column=column), var, None, self.convert(args[1])
        )
        call = Call("@sortByAssociatedKeys", Ident(SORT_BY_INPUT, line=line, column=column), [keys])
        keys.line = call.line = line
        keys.column = call.column = column
        return Bind(SORT_BY_INPUT, target, call)

    def _bind(self, tree: lark.Tree[Any], args: list[Any]) -> Node:
        if len(args) != 3 or _bare_ident(args[0]) is None:
            raise self.error("cel.bind() variable name must be a simple identifier", tree)
        var = _bare_ident(args[0])
        assert var is not None
        return Bind(var, self.convert(args[1]), self.convert(args[2]))

    def _comprehension(
        self, tree: lark.Tree[Any], macro: str, target: lark.Tree[Any], args: list[Any]
    ) -> Node:
        macro = "exists_one" if macro == "existsOne" else macro
        var = _bare_ident(args[0])
        assert var is not None
        if len(args) == 2:
            return Comprehension(macro, self.convert(target), var, None, self.convert(args[1]))
        if macro == "map":
            # map(x, predicate, transform): filter then transform
            return Comprehension(
                macro, self.convert(target), var, None, self.convert(args[1]), self.convert(args[2])
            )
        var2 = _bare_ident(args[1])
        if var2 is None:
            raise self.error(f"{macro}() second argument must be a simple identifier", tree)
        if macro not in ("all", "exists", "exists_one"):
            raise self.error(f"{macro}() does not take two iteration variables", tree)
        return Comprehension(macro, self.convert(target), var, var2, self.convert(args[2]))

    def _primary(self, tree: lark.Tree[Any]) -> Node:
        return self.convert(tree.children[0])

    def _paren_expr(self, tree: lark.Tree[Any]) -> Node:
        return self.convert(tree.children[0])

    def _ident(self, tree: lark.Tree[Any]) -> Node:
        return Ident(str(tree.children[0]))

    def _dot_ident(self, tree: lark.Tree[Any]) -> Node:
        return Ident(str(tree.children[0]))

    def _dot_ident_arg(self, tree: lark.Tree[Any]) -> Node:
        return self._ident_arg(tree)

    def _ident_arg(self, tree: lark.Tree[Any]) -> Node:
        name = str(tree.children[0])
        args = (
            list(tree.children[1].children) if len(tree.children) > 1 and tree.children[1] is not None else []
        )
        if name == "has":
            if len(args) != 1:
                raise self.error("has() takes exactly one argument", tree)
            inner = self.convert(args[0])
            if not isinstance(inner, Select):
                raise self.error("invalid argument to has() macro", tree)
            inner.test_only = True
            return inner
        return Call(name, None, [self.convert(a) for a in args])

    def _optional_mark(self, tree: Any) -> bool:
        """Whether `tree` follows a rewritten `?`; the mark is used up."""
        start = _start_offset(tree)
        if start is not None and start in self.marks.index_starts:
            self.used_marks.add(start)
            return True
        return False

    def _list_lit(self, tree: lark.Tree[Any]) -> Node:
        if not tree.children or tree.children[0] is None:
            return ListLit([])
        children = list(tree.children[0].children)
        optional = frozenset(i for i, child in enumerate(children) if self._optional_mark(child))
        return ListLit([self.convert(c) for c in children], optional)

    def _map_lit(self, tree: lark.Tree[Any]) -> Node:
        if not tree.children or tree.children[0] is None:
            return MapLit([])
        children = list(tree.children[0].children)
        keys = children[0::2]
        optional = frozenset(i for i, key in enumerate(keys) if self._optional_mark(key))
        items = [self.convert(c) for c in children]
        return MapLit(list(zip(items[0::2], items[1::2], strict=True)), optional)

    def _literal(self, tree: lark.Tree[Any]) -> Node:
        token = tree.children[0]
        assert isinstance(token, lark.Token)
        kind = token.type
        text = str(token)
        try:
            if kind == "INT_LIT":
                value: Any = int(text, 16) if "x" in text.lower() else int(text, 10)
                if not INT64_MIN <= value <= INT64_MAX:
                    raise self.error(f"invalid int literal {text!r}: out of range", token)
            elif kind == "UINT_LIT":
                digits = text[:-1]
                if digits.startswith("-"):
                    raise self.error(f"invalid uint literal {text!r}", token)
                value = Uint(int(digits, 16) if "x" in digits.lower() else int(digits, 10))
                if value > UINT64_MAX:
                    raise self.error(f"invalid uint literal {text!r}: out of range", token)
            elif kind == "FLOAT_LIT":
                value = float(text)
            elif kind in ("STRING_LIT", "MLSTRING_LIT"):
                value = str(celstr(token))
            elif kind == "BYTES_LIT":
                value = bytes(celbytes(token))
            elif kind == "BOOL_LIT":
                value = text == "true"
            elif kind == "NULL_LIT":
                value = None
            else:
                raise self.error(f"unsupported literal {text!r}", token)
        except (ValueError, UnicodeError) as error:
            raise self.error(f"invalid literal {text!r}: {error}", token) from None
        return Literal(value)


def _bare_ident(tree: Any) -> str | None:
    """The identifier when `tree` is nothing but a plain identifier (through the precedence wrappers)."""
    node = tree
    while isinstance(node, lark.Tree):
        if node.data == "ident":
            return str(node.children[0])
        if len(node.children) != 1:
            return None
        node = node.children[0]
    return None


def _position(where: Any) -> tuple[int | None, int | None]:
    if isinstance(where, lark.Token):
        return where.line, where.column
    if isinstance(where, lark.Tree):
        meta = where.meta
        if not meta.empty:
            return meta.line, meta.column
        for child in where.children:
            line, column = _position(child)
            if line is not None:
                return line, column
    return None, None


def _start_offset(where: Any) -> int | None:
    if isinstance(where, lark.Token):
        return where.start_pos
    if isinstance(where, lark.Tree):
        start = None if where.meta.empty else getattr(where.meta, "start_pos", None)
        if start is not None:
            return int(start)
        for child in where.children:
            offset = _start_offset(child)
            if offset is not None:
                return offset
    return None


def children(node: Node) -> list[Node]:
    """Direct sub-expressions, for generic walks."""
    if isinstance(node, Select):
        return [node.operand]
    if isinstance(node, Index):
        return [node.operand, node.index]
    if isinstance(node, Call):
        return ([node.target] if node.target is not None else []) + list(node.args)
    if isinstance(node, ListLit):
        return list(node.items)
    if isinstance(node, MapLit):
        return [n for pair in node.entries for n in pair]
    if isinstance(node, Unary):
        return [node.operand]
    if isinstance(node, Binary | Logical):
        return [node.left, node.right]
    if isinstance(node, Conditional):
        return [node.condition, node.if_true, node.if_false]
    if isinstance(node, Comprehension):
        out = [node.range, node.body]
        if node.transform is not None:
            out.append(node.transform)
        return out
    if isinstance(node, Bind):
        return [node.init, node.body]
    return []
