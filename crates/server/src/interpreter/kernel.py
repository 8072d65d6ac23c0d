# corral's Python kernel: runs cells sent as JSON lines on stdin, one at a time, in one
# namespace, and answers JSON lines on stdout. Started by the daemon inside a sandbox as
# `python3 -u -c <this>`; needs nothing but the standard library.
#
# Requests:  {"id": "...", "code": "...", "env": {...} | null}
# Answers:   {"id", "type": "stdout"|"stderr", "text"} | {"id", "type": "result", <mime fields>,
#            "is_main_result"} | {"id", "type": "error", "name", "value", "traceback"} |
#            {"id", "type": "end"}  (always last for a request)
#
# fds 1 and 2 are replaced by pipes read here, so output of `!shell` lines, subprocesses and C
# extensions is captured like print(); the protocol uses private duplicates of fds 0 and 1.

import ast
import base64
import builtins
import codecs
import json
import linecache
import os
import re
import signal
import subprocess
import sys
import threading
import traceback
import types

_proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
_proto_in = os.fdopen(os.dup(0), "rb")
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)

_write_lock = threading.Lock()
_current = [None]
_SYNC = "\x00corral-sync-"


def _send(message):
    data = (json.dumps(message, default=repr) + "\n").encode()
    with _write_lock:
        _proto_out.write(data)


class _Pump:
    """Forwards what arrives on one captured fd, and notices sync markers in it."""

    def __init__(self, fd, name):
        self.name = name
        self.seen = threading.Condition()
        self.last_marker = None
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        self.read_end = read_end
        threading.Thread(target=self.run, daemon=True).start()

    def emit(self, text):
        if text:
            _send({"id": _current[0], "type": self.name, "text": text})

    def run(self):
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        pending = ""
        while True:
            try:
                chunk = os.read(self.read_end, 65536)
            except InterruptedError:
                continue
            except KeyboardInterrupt:
                continue
            if not chunk:
                return
            pending += decoder.decode(chunk)
            while True:
                start = pending.find(_SYNC)
                if start < 0:
                    break
                end = pending.find("\x00", start + 1)
                if end < 0:
                    break
                self.emit(pending[:start])
                marker = pending[start + len(_SYNC):end]
                pending = pending[end + 1:]
                with self.seen:
                    self.last_marker = marker
                    self.seen.notify_all()
            # Hold back what may be the start of a marker split across reads.
            hold = pending.rfind("\x00")
            if hold >= 0 and len(pending) - hold < 64:
                self.emit(pending[:hold])
                pending = pending[hold:]
            else:
                self.emit(pending)
                pending = ""

    def sync(self, fd, marker):
        """Returns once everything written to `fd` before now has been forwarded."""
        with self.seen:
            os.write(fd, (_SYNC + marker + "\x00").encode())
            self.seen.wait_for(lambda: self.last_marker == marker, timeout=5)


_pumps = {1: _Pump(1, "stdout"), 2: _Pump(2, "stderr")}
# Line-buffered like a notebook's streams: `print("x")` arrives as one "x\n", not "x" and "\n".
sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
sys.stdin = open(os.devnull)

_MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}
_REPR_METHODS = [
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_pdf_", "application/pdf"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
    ("_repr_javascript_", "application/javascript"),
]
_BINARY = {"image/png", "image/jpeg", "application/pdf"}


def _figure_png(value):
    import io

    buffer = io.BytesIO()
    value.savefig(buffer, format="png", bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode()


def _is_figure(value):
    figure = sys.modules.get("matplotlib.figure")
    return figure is not None and isinstance(value, figure.Figure)


def _bundle(value):
    bundle = {}
    # Classes have these methods too, unbound; only instances can render themselves.
    if not isinstance(value, type):
        method = getattr(value, "_repr_mimebundle_", None)
        if callable(method):
            try:
                got = method()
                if isinstance(got, tuple):
                    got = got[0]
                if isinstance(got, dict):
                    bundle.update(got)
            except Exception:
                pass
        for name, mime in _REPR_METHODS:
            method = getattr(value, name, None)
            if mime in bundle or not callable(method):
                continue
            try:
                got = method()
            except Exception:
                continue
            if isinstance(got, tuple):
                got = got[0]
            if got is not None:
                bundle[mime] = got
        if _is_figure(value) and "image/png" not in bundle:
            try:
                bundle["image/png"] = _figure_png(value)
            except Exception:
                pass
    if "text/plain" not in bundle:
        try:
            bundle["text/plain"] = repr(value)
        except Exception as error:
            bundle["text/plain"] = "<unrepresentable object: %s>" % error
    return bundle


def _send_result(value, main):
    message = {"id": _current[0], "type": "result", "is_main_result": main}
    extra = {}
    for mime, data in _bundle(value).items():
        if mime in _BINARY and isinstance(data, (bytes, bytearray)):
            data = base64.b64encode(data).decode()
        elif isinstance(data, (bytes, bytearray)):
            data = data.decode("utf-8", "replace")
        field = _MIME_FIELDS.get(mime)
        if field == "json" and isinstance(data, str):
            try:
                data = json.loads(data)
            except ValueError:
                pass
        if field:
            message[field] = data
        else:
            extra[mime] = data
    if extra:
        message["extra"] = extra
    _send(message)


def display(*objects, **_ignored):
    for value in objects:
        _send_result(value, False)


builtins.display = display


def _install_display_shim():
    """`from IPython.display import display, HTML` is common; serve it without IPython."""
    try:
        import IPython.display  # noqa: F401

        return
    except Exception:
        pass

    class _Rich:
        mime = "text/plain"

        def __init__(self, data=None, url=None, filename=None, **_ignored):
            if filename is not None:
                with open(filename, "rb") as f:
                    data = f.read()
            self.data = data

        def _repr_mimebundle_(self):
            return {self.mime: self.data}

        def __repr__(self):
            return "<%s object>" % type(self).__name__

    module = types.ModuleType("IPython.display")
    for name, mime in [("HTML", "text/html"), ("Markdown", "text/markdown"), ("Latex", "text/latex"),
                       ("SVG", "image/svg+xml"), ("JSON", "application/json"), ("Javascript", "application/javascript")]:
        setattr(module, name, type(name, (_Rich,), {"mime": mime}))

    class Image(_Rich):
        mime = "image/png"

    module.Image = Image
    module.display = display
    package = types.ModuleType("IPython")
    package.display = module
    # Libraries probe for a running IPython (matplotlib does on import); there is none.
    package.get_ipython = lambda: None
    package.__path__ = []
    sys.modules.setdefault("IPython", package)
    sys.modules.setdefault("IPython.display", module)


_install_display_shim()


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _shell(command):
    # The interrupt that stops a cell must stop its shell commands too.
    subprocess.run(command, shell=True, executable="/bin/bash" if os.path.exists("/bin/bash") else None,
                   preexec_fn=_default_sigint)


def _magic(line):
    name, _, rest = line.partition(" ")
    rest = rest.strip()
    if name in ("cd", "%cd"):
        os.chdir(os.path.expanduser(rest or "~"))
        print(os.getcwd())
    elif name == "pwd":
        return os.getcwd()
    elif name == "env":
        if "=" in rest:
            key, _, value = rest.partition("=")
            os.environ[key.strip()] = value.strip()
        elif rest:
            return os.environ.get(rest)
        else:
            return dict(os.environ)
    elif name in ("pip", "conda"):
        _shell("%s -m pip %s" % (sys.executable, rest))
    else:
        raise NameError("unknown magic %%%s (corral's kernel knows %%cd, %%pwd, %%env, %%pip)" % name)


_SHELL_LINE = re.compile(r"^(\s*)!(.*)$")
_MAGIC_LINE = re.compile(r"^(\s*)%(?!%)(\w.*)$")


def _transform(code):
    """IPython's `!command` and `%magic` lines, as calls (line based, like IPython's)."""
    lines = []
    for line in code.split("\n"):
        shell = _SHELL_LINE.match(line)
        magic = _MAGIC_LINE.match(line)
        if shell:
            lines.append("%s__corral_shell__(%r)" % (shell.group(1), shell.group(2)))
        elif magic:
            lines.append("%s__corral_magic__(%r)" % (magic.group(1), magic.group(2)))
        else:
            lines.append(line)
    return "\n".join(lines)


_namespace = {"__name__": "__main__", "__builtins__": builtins, "__corral_shell__": _shell, "__corral_magic__": _magic}
_count = [0]


def _flush_figures(skip):
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    try:
        for number in pyplot.get_fignums():
            figure = pyplot.figure(number)
            if figure is not skip:
                _send({"id": _current[0], "type": "result", "is_main_result": False,
                       "png": _figure_png(figure), "text": repr(figure)})
        pyplot.close("all")
    except Exception as error:
        _send({"id": _current[0], "type": "stderr", "text": "corral: could not render figures: %s\n" % error})


def _send_error(error):
    tb = error.__traceback__
    # Frames of this kernel are not the user's business.
    while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next
    if isinstance(error, SyntaxError):
        text = "".join(traceback.format_exception_only(type(error), error))
    else:
        text = "".join(traceback.format_exception(type(error), error, tb))
    _send({"id": _current[0], "type": "error", "name": type(error).__name__, "value": str(error), "traceback": text})


def _run(request):
    _count[0] += 1
    filename = "<cell-%d>" % _count[0]
    source = _transform(request.get("code") or "")
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree = ast.parse(source, filename, "exec")
    last = None
    # IPython convention: a trailing semicolon hides the last value.
    if tree.body and isinstance(tree.body[-1], ast.Expr) and not source.rstrip().endswith(";"):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec"), _namespace)
    value = None
    if last is not None:
        value = eval(compile(last, filename, "eval"), _namespace)
        if value is not None:
            _namespace["_"] = value
            _send_result(value, True)
    _flush_figures(value)


def _pickler():
    """dill or cloudpickle when the sandbox has them (they save functions and classes defined
    in cells, by value), else the standard library's pickle."""
    for name in ("dill", "cloudpickle"):
        try:
            return __import__(name)
        except Exception:
            pass
    import pickle

    return pickle


def _save(path):
    """Pickles each variable of the namespace on its own, so one that cannot be saved (an
    open file, a socket, a thread) is listed with the reason and the rest still are."""
    import pickle

    pickler = _pickler()
    values, modules, saved, failed = {}, {}, [], []
    for name, value in list(_namespace.items()):
        if name.startswith("__") or name == "_":
            continue
        if isinstance(value, types.ModuleType):
            modules[name] = value.__name__
            saved.append(name)
            continue
        defined_here = getattr(value, "__module__", None) == "__main__" and isinstance(value, (type, types.FunctionType))
        if defined_here and pickler is pickle:
            failed.append({"name": name, "reason": "defined in a cell: plain pickle saves it by reference only (install dill or cloudpickle)"})
            continue
        try:
            values[name] = pickler.dumps(value)
            saved.append(name)
        except BaseException as error:
            failed.append({"name": name, "reason": "%s: %s" % (type(error).__name__, error)})
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    with open(path + ".tmp", "wb") as f:
        pickle.dump({"pickler": pickler.__name__, "values": values, "modules": modules, "cwd": os.getcwd()}, f)
    os.replace(path + ".tmp", path)
    _send({"id": _current[0], "type": "saved", "pickler": pickler.__name__, "saved": saved, "failed": failed})


def _load(path):
    import importlib
    import pickle

    with open(path, "rb") as f:
        state = pickle.load(f)
    loaded, failed = [], []
    try:
        pickler = __import__(state.get("pickler") or "pickle")
    except Exception:
        pickler = pickle
    for name, module in (state.get("modules") or {}).items():
        try:
            _namespace[name] = importlib.import_module(module)
            loaded.append(name)
        except BaseException as error:
            failed.append({"name": name, "reason": "%s: %s" % (type(error).__name__, error)})
    for name, data in (state.get("values") or {}).items():
        try:
            _namespace[name] = pickler.loads(data)
            loaded.append(name)
        except BaseException as error:
            failed.append({"name": name, "reason": "%s: %s" % (type(error).__name__, error)})
    try:
        os.chdir(state.get("cwd") or os.getcwd())
    except OSError:
        pass
    try:
        os.unlink(path)
    except OSError:
        pass
    _send({"id": _current[0], "type": "loaded", "loaded": loaded, "failed": failed})


def _control(request):
    """`{"id", "op": "save"|"load", "path"}`: the daemon saving or restoring the namespace."""
    _current[0] = request.get("id")
    try:
        if request.get("op") == "save":
            _save(request["path"])
        else:
            _load(request["path"])
    except BaseException as error:
        _send_error(error)
    finally:
        _send({"id": request.get("id"), "type": "end"})
        _current[0] = None


def _handle(request):
    if request.get("op") in ("save", "load"):
        return _control(request)
    _current[0] = request.get("id")
    env = request.get("env") or {}
    saved = {key: os.environ.get(key) for key in env}
    try:
        os.environ.update({str(k): str(v) for k, v in env.items()})
        _run(request)
    except BaseException as error:  # SystemExit and KeyboardInterrupt are the cell's errors too
        _send_error(error)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        for fd, pump in _pumps.items():
            pump.sync(fd, str(request.get("id")))
        _send({"id": request.get("id"), "type": "end"})
        _current[0] = None


def _main():
    # The kernel may be started with SIGINT ignored (inherited); interrupts are how cells
    # are stopped, so they must raise KeyboardInterrupt here.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.setdefault("MPLBACKEND", "Agg")
    try:
        import warnings

        warnings.filterwarnings("ignore", message=".*non-interactive.*")
    except Exception:
        pass
    while True:
        try:
            line = _proto_in.readline()
            if not line:
                return
            if not line.strip():
                continue
            _handle(json.loads(line))
        except KeyboardInterrupt:
            # An interrupt meant for a cell that had just finished.
            continue


_main()
