"""Runs inside the code sandbox (standard library only): replays an episode's earlier cells with their output
discarded, then runs the new cell, printing its output, its last expression's value (as a notebook does) and,
if it raises, its traceback. Reads ``{"history": [source, ...], "cell": source}`` as JSON from stdin.

Exit status 0 when the new cell ran to its end, 1 when it raised (the traceback is on stdout).
"""

import ast
import contextlib
import io
import json
import sys
import traceback

CELL = "<cell>"


def print_error(exc):
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != CELL:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb, file=sys.stdout)


def main():
    request = json.loads(sys.stdin.read())
    sys.stdin = io.StringIO("")  # input() in a cell reads EOF, not the request
    namespace = {"__name__": "__main__"}
    for source in request["history"]:
        sink = io.StringIO()
        # A cell that raised when it first ran raises again; its effects up to there are the state.
        with (
            contextlib.redirect_stdout(sink),
            contextlib.redirect_stderr(sink),
            contextlib.suppress(BaseException),
        ):
            exec(compile(source, CELL, "exec"), namespace)
    sys.stderr = sys.stdout
    try:
        tree = ast.parse(request["cell"], CELL, "exec")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, CELL, "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), CELL, "eval"), namespace)
            if value is not None:
                print(repr(value))
    except SystemExit:
        pass
    except BaseException as exc:
        print_error(exc)
        sys.stdout.flush()
        sys.exit(1)


main()
