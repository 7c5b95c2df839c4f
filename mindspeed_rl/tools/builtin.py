"""The built-in tools: an exact calculator and a Python executor (ReTool-style code interpreter). Both run in
the sandbox's child process."""

from __future__ import annotations

import ast
import contextlib
import io
import operator
import traceback
from fractions import Fraction
from typing import Union

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 256
MAX_DIGITS = 4000

Number = Union[int, Fraction]


def _evaluate(node: ast.AST) -> Number:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return Fraction(str(node.value)) if isinstance(node.value, float) else node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            if not isinstance(right, int) and not (isinstance(right, Fraction) and right.denominator == 1):
                raise ValueError("only whole-number exponents")
            if abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent above {MAX_EXPONENT}")
            right = int(right)
        if isinstance(node.op, ast.Div):
            left = Fraction(left)
        result = _BINARY[type(node.op)](left, right)
        if isinstance(result, Fraction) and result.denominator == 1:
            result = int(result)
        if isinstance(result, int) and abs(result).bit_length() > MAX_DIGITS * 3.33:
            raise ValueError(f"result longer than {MAX_DIGITS} digits")
        return result
    raise ValueError(f"unsupported element {type(node).__name__}")


def calculator(expression: str) -> str:
    """The exact value of an arithmetic expression: an integer, or a decimal to 12 significant digits."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    value = _evaluate(tree)
    if isinstance(value, Fraction):
        return f"{float(value):.12g}"
    return str(value)


def python(code: str) -> str:
    """Run ``code`` as a fresh module; returns what it printed, then the error if it raised (the program's
    own errors are the model's to read, not tool failures)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            exec(compile(code, "<program>", "exec"), {"__name__": "__main__"})  # noqa: S102 (sandboxed)
        except BaseException as exc:  # SystemExit included: the program's end, reported like any error
            if isinstance(exc, SystemExit) and exc.code in (None, 0):
                pass
            else:
                lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
                out.write("".join(lines[-1:]) if not isinstance(exc, SyntaxError) else "".join(lines[-4:]))
    return out.getvalue()
