"""Loaded into schemathesis' virtual environment by scripts/schemathesis.sh (a .pth file).

CPython 3.11's ast.parse can fail with SystemError("AST constructor recursion depth mismatch")
when called deep in a stack. Hypothesis parses a module's source to describe a filter's lambda
and expects only a SyntaxError there (then it describes the lambda as "<unknown>"). This turns
that one SystemError into a SyntaxError; only descriptions change.
"""

import ast

_parse = ast.parse


def parse(*args, **kwargs):
    try:
        return _parse(*args, **kwargs)
    except SystemError as error:
        if "recursion depth mismatch" not in str(error):
            raise
        raise SyntaxError(str(error)) from error


ast.parse = parse
