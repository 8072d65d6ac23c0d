"""The code interpreter with the sync client (e2b_code_interpreter.Sandbox)."""

import base64
import time

import pytest
from e2b import TimeoutException

RICH_CLASS = '''
class Rich:
    def _repr_html_(self):
        return "<b>bold</b>"
    def _repr_markdown_(self):
        return "**bold**"
    def _repr_json_(self):
        return {"answer": 42}
    def _repr_png_(self):
        return bytes([137, 80, 78, 71])
    def __repr__(self):
        return "Rich()"
'''


def test_state_persists_and_last_expression_is_the_result(code_sandbox):
    code_sandbox.run_code("x = 41")
    execution = code_sandbox.run_code("x += 1; x")
    assert execution.text == "42"
    assert execution.results[0].is_main_result
    assert execution.error is None
    assert code_sandbox.run_code("x = 5;").results == []


def test_stdout_stderr_stream_as_they_happen(code_sandbox):
    seen = []
    code = "import sys, time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.3)\nprint('bad', file=sys.stderr)"
    execution = code_sandbox.run_code(code, on_stdout=lambda m: seen.append((m.line, time.monotonic())))
    assert "".join(execution.logs.stdout) == "0\n1\n2\n"
    assert "".join(execution.logs.stderr) == "bad\n"
    assert [line for line, _ in seen] and seen[-1][1] - seen[0][1] > 0.4, "output arrived all at once"


def test_errors_have_name_value_traceback(code_sandbox):
    execution = code_sandbox.run_code("def f():\n    raise ValueError('boom')\nf()")
    assert execution.error.name == "ValueError"
    assert execution.error.value == "boom"
    assert "f()" in execution.error.traceback and "ValueError: boom" in execution.error.traceback
    syntax = code_sandbox.run_code("def (")
    assert syntax.error.name == "SyntaxError"


def test_shell_lines_and_cwd(code_sandbox):
    execution = code_sandbox.run_code("!echo from-shell\n!pwd")
    assert "".join(execution.logs.stdout) == "from-shell\n/home/user\n"
    assert code_sandbox.run_code("import os; os.getcwd()").text == "'/home/user'"


def test_env_vars_per_call_do_not_leak(code_sandbox):
    execution = code_sandbox.run_code("import os; os.environ.get('CELL_VAR')", envs={"CELL_VAR": "set"})
    assert execution.text == "'set'"
    assert code_sandbox.run_code("os.environ.get('CELL_VAR')").text is None


def test_timeout_interrupts_but_keeps_state(code_sandbox):
    code_sandbox.run_code("kept = 'still here'")
    with pytest.raises(TimeoutException):
        code_sandbox.run_code("import time\nwhile True:\n    time.sleep(0.1)", timeout=2)
    deadline = time.monotonic() + 15
    while True:
        execution = code_sandbox.run_code("kept")
        if execution.text == "'still here'" or time.monotonic() > deadline:
            break
    assert execution.text == "'still here'"


def test_rich_results(code_sandbox):
    code_sandbox.run_code(RICH_CLASS)
    result = code_sandbox.run_code("Rich()").results[0]
    assert result.text == "Rich()"
    assert result.html == "<b>bold</b>"
    assert result.markdown == "**bold**"
    assert result.json == {"answer": 42}
    assert base64.b64decode(result.png) == bytes([137, 80, 78, 71])
    assert set(result.formats()) >= {"html", "markdown", "json", "png"}
    shown = code_sandbox.run_code("from IPython.display import display, HTML\ndisplay(HTML('<i>x</i>'))\n1")
    assert [r.html for r in shown.results if not r.is_main_result] == ["<i>x</i>"]
    assert shown.text == "1"


def test_contexts(code_sandbox):
    ctx = code_sandbox.create_code_context(cwd="/tmp")
    assert ctx.cwd == "/tmp" and ctx.language == "python"
    code_sandbox.run_code("y = 'in ctx'", context=ctx)
    assert code_sandbox.run_code("y", context=ctx).text == "'in ctx'"
    assert code_sandbox.run_code("import os; os.getcwd()", context=ctx).text == "'/tmp'"
    assert code_sandbox.run_code("y").error.name == "NameError"  # the default context is separate
    assert ctx.id in [c.id for c in code_sandbox.list_code_contexts()]
    code_sandbox.restart_code_context(ctx)
    assert code_sandbox.run_code("y", context=ctx).error.name == "NameError"
    code_sandbox.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in code_sandbox.list_code_contexts()]


def test_execution_count_increments(code_sandbox):
    first = code_sandbox.run_code("1").execution_count
    assert code_sandbox.run_code("2").execution_count == first + 1


def test_javascript_context(code_sandbox):
    execution = code_sandbox.run_code("const a = 20; console.log('js'); a + 22", language="javascript")
    assert execution.text == "42"
    assert execution.logs.stdout == ["js\n"]
    assert code_sandbox.run_code("a * 2", language="js").text == "40"
    assert code_sandbox.run_code("null.x", language="js").error.name == "TypeError"


def test_commands_and_files_work_next_to_the_interpreter(code_sandbox):
    code_sandbox.run_code("open('/tmp/from-kernel.txt', 'w').write('k')")
    assert code_sandbox.files.read("/tmp/from-kernel.txt") == "k"
    assert code_sandbox.commands.list() == []


def test_matplotlib_figures_come_back_as_png(code_sandbox):
    code = (
        "import matplotlib\nimport matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [1, 4, 9])\nplt.title('squares')\nplt.show()"
    )
    execution = code_sandbox.run_code(code)
    assert execution.error is None, execution.error
    pngs = [r.png for r in execution.results if r.png]
    assert len(pngs) == 1, execution.results
    assert base64.b64decode(pngs[0])[:8] == b"\x89PNG\r\n\x1a\n"
