"""Errors of the CEL environment: compile time (expression rejected) and runtime (evaluation failed)."""

from __future__ import annotations


class CelCompileError(Exception):
    """The expression does not compile in the Kubernetes DRA selector environment.

    `line` and `column` are 1-based positions in the expression text (None when unknown).
    """

    def __init__(self, message: str, expression: str, line: int | None = None, column: int | None = None):
        super().__init__(message)
        self.message = message
        self.expression = expression
        self.line = line
        self.column = column

    def describe(self) -> str:
        """One line: where and why, like cel-go's `ERROR: <input>:1:5: message`."""
        where = f"{self.line}:{self.column}" if self.line is not None else "?:?"
        return f"<input>:{where}: {self.message}"

    def __str__(self) -> str:
        return self.describe()


class CelEvalError(Exception):
    """A runtime error: no such key, no such overload, overflow, cost limit exceeded, non-bool result...

    In the scheduler any such error aborts the allocation of the claim on the node being checked.
    """

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class CostLimitExceededError(CelEvalError):
    """The evaluation ran past the runtime cost limit (Kubernetes: 1,000,000 for DRA selectors)."""
