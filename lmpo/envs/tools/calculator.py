"""A safe arithmetic calculator: the expression is parsed with `ast` and only numbers and
arithmetic operators are evaluated — never eval/exec — with bounds on size and exponents."""

from __future__ import annotations

import ast
import math
import operator

from lmpo.envs.tools.schema import ToolError, quiet_parse, tool

MAX_LENGTH = 200
MAX_EXPONENT = 100
MAX_DIGITS = 1000
_ALLOWED = "only numbers, + - * / // % ** and parentheses are allowed"

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: Numbers with + - * / // % ** and parentheses, e.g. 37*48+5.
    """
    if not isinstance(expression, str):
        raise ToolError(f"the expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_LENGTH:
        raise ToolError(f"expression too long: {len(expression)} characters (at most {MAX_LENGTH})")
    if not expression.strip():
        raise ToolError("empty expression")
    try:
        tree = quiet_parse(expression.strip())
    except (SyntaxError, ValueError) as error:
        raise ToolError(f"invalid expression: {error.msg if isinstance(error, SyntaxError) else error}") from None
    return _format(_evaluate(tree.body))


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return _check_result(node.value)
        kind = "strings" if isinstance(node.value, (str, bytes)) else f"{type(node.value).__name__} values"
        raise ToolError(f"{kind} are not allowed: {_ALLOWED}")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        if isinstance(node.op, ast.Div) and isinstance(left, int) and isinstance(right, int) \
                and right != 0 and left % right == 0:
            return left // right  # exact: big integer quotients stay integers, never rounded floats
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        except OverflowError:
            raise ToolError("result too large") from None
        return _check_result(result)
    raise ToolError(_refusal(node))


def _check_power(base: int | float, exponent: int | float) -> None:
    if abs(exponent) > MAX_EXPONENT:
        raise ToolError(f"exponent too large: {_format(exponent)} (at most {MAX_EXPONENT} in magnitude)")
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1 \
            and exponent * math.log10(abs(base)) > MAX_DIGITS:
        raise ToolError(f"result too large: more than {MAX_DIGITS} digits")


def _check_result(result: object) -> int | float:
    if isinstance(result, complex):
        raise ToolError("the result is not a real number (fractional power of a negative number)")
    if isinstance(result, float) and not math.isfinite(result):
        raise ToolError("result too large")
    # bit_length * log10(2) bounds the digit count without building the decimal string
    if isinstance(result, int) and result.bit_length() * 0.30103 > MAX_DIGITS:
        raise ToolError(f"result too large: more than {MAX_DIGITS} digits")
    return result


def _format(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def _refusal(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"names are not allowed ({node.id!r}): {_ALLOWED}"
    if isinstance(node, ast.Call):
        return f"function calls are not allowed: {_ALLOWED}"
    if isinstance(node, ast.Attribute):
        return f"attribute access is not allowed: {_ALLOWED}"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
        return "^ is not allowed: write powers with **"
    return f"{type(node).__name__} is not allowed: {_ALLOWED}"


CALCULATOR = tool(calculate, name="calculator")
