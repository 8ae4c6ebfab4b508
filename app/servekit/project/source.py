"""Python models held in memory, written back as a module: their source and what it needs.

A function or class defined in a notebook exists only in the kernel. ``inspect.getsource``
gives its text; the globals that text uses are written before it: modules as imports, other
functions and classes of the notebook as their own source (recursively), importable objects
as ``from module import name``, and plain constants (numbers, strings, tuples of them ...) as
assignments. Whatever cannot be written that way (a lambda, a closure over local variables, a
function defined inside another one, an instance, a global holding an array) is refused with
its name and the reason: a saved project that imports but behaves differently would be worse.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import re
import sys
import textwrap
import types
import typing
from dataclasses import dataclass, field
from typing import Any

MODULE = "notebook_models"
"""The module the sources are written to (beside serve.yaml, which is on the Python path)."""

_OURS = {"app", "servekit"}
_LITERALS = (int, float, complex, str, bytes, bool, type(None))


class SourceError(ValueError):
    """An object whose source servekit cannot write; the message says which and why."""


@dataclass
class ModuleSource:
    """The module being written: imports, constants and definitions, in dependency order."""

    imports: list[str] = field(default_factory=list)
    constants: dict[str, str] = field(default_factory=dict)
    definitions: dict[str, str] = field(default_factory=dict)
    modules: set[str] = field(default_factory=set)
    """Top-level names of the modules the code imports (for requirements.txt)."""
    _seen: dict[int, str] = field(default_factory=dict)

    def add(self, obj: object, label: str) -> str:
        """Write ``obj`` (and what it uses); returns its name in the module. ``label`` names it
        in refusals (the model it serves)."""
        if id(obj) in self._seen:
            return self._seen[id(obj)]
        name = _check(obj, label)
        self._seen[id(obj)] = name
        if name in self.definitions or name in self.constants:
            raise SourceError(f"{label}: two different objects are both named {name!r}")
        try:
            text = textwrap.dedent(inspect.getsource(obj))  # type: ignore[arg-type]
        except (OSError, TypeError):
            raise SourceError(
                f"{label}: the source of {name!r} is not available (defined with exec or in a "
                "plain interactive shell?); put it in a .py file beside serve.yaml"
            ) from None
        namespace = _namespace(obj)
        for used in sorted(_free_names(text) - {name}):
            if used not in namespace:
                continue  # a builtin, or a name the code itself fails on when run
            self._use(used, namespace[used], f"{label} (global {used!r} of {name!r})")
        self.definitions[name] = text
        return name

    def _use(self, name: str, value: Any, label: str) -> None:
        if isinstance(value, types.ModuleType):
            self.modules.add(value.__name__.split(".")[0])
            self._import(_module_import(name, value.__name__))
            return
        module = getattr(value, "__module__", None)
        if (inspect.isfunction(value) or inspect.isclass(value)) and module == "__main__":
            self.add(value, label)
            return
        if _is_literal(value):
            self.constants[name] = f"{name} = {value!r}"
            return
        alias = _type_alias(value)
        if alias is not None:
            text, modules = alias
            for module in sorted(modules):
                self.modules.add(module.split(".")[0])
                self._import(f"import {module}")
            self.constants[name] = f"{name} = {text}"
            return
        home = _importable_from(name, value)
        if home is not None:
            self.modules.add(home.split(".")[0])
            self._import(f"from {home} import {name}")
            return
        raise SourceError(
            f"{label}: a {type(value).__name__} that servekit cannot write as source; build it "
            "inside load() (a class), or make it a constant"
        )

    def _import(self, line: str) -> None:
        if line not in self.imports:
            self.imports.append(line)

    def text(self) -> str:
        """The module's source."""
        parts = [
            f'"""Python models saved by servekit from a notebook (``{MODULE}:<name>`` in '
            'serve.yaml)."""',
            "\n".join(sorted(self.imports)),
            "\n".join(self.constants.values()),
            *self.definitions.values(),
        ]
        return "\n\n\n".join(p.rstrip() for p in parts if p.strip()) + "\n"


def _check(obj: object, label: str) -> str:
    """The object's name, or the reason its source would not run on its own."""
    if inspect.isfunction(obj):
        if obj.__name__ == "<lambda>":
            raise SourceError(f"{label}: a lambda cannot be saved; define it with def")
        if obj.__code__.co_freevars:
            names = ", ".join(obj.__code__.co_freevars)
            raise SourceError(
                f"{label}: {obj.__qualname__} is a closure over {names}; its source does not "
                "hold their values: define it at the top level of the notebook"
            )
    elif not inspect.isclass(obj):
        raise SourceError(
            f"{label}: an instance of {type(obj).__name__} holds state its source does not; "
            "add the class itself (its load() builds that state)"
        )
    qualname: str = obj.__qualname__
    if "<locals>" in qualname or "." in qualname:
        raise SourceError(
            f"{label}: {qualname} is defined inside another function or class; define it at "
            "the top level of the notebook"
        )
    return qualname


def _namespace(obj: object) -> dict[str, Any]:
    if inspect.isfunction(obj):
        return obj.__globals__
    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    return vars(module) if module is not None else {}


def _free_names(text: str) -> set[str]:
    """Names the code reads but never binds itself (a close approximation of its globals)."""
    tree = ast.parse(text)
    read: set[str] = set()
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
    # The top-level definition's own name is bound by the module, not by itself.
    top = tree.body[0] if tree.body else None
    if isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        bound.discard(top.name)
    return {n for n in read - bound if not hasattr(builtins, n)}


def _module_import(name: str, module: str) -> str:
    if module == name:
        return f"import {module}"
    parent, _, last = module.rpartition(".")
    if parent and last == name:
        return f"from {parent} import {name}"
    return f"import {module} as {name}"


def _is_literal(value: Any) -> bool:
    """A value whose repr is Python source giving an equal value back."""
    if isinstance(value, _LITERALS):
        return not isinstance(value, float) or value == value  # NaN's repr is not source
    if isinstance(value, tuple | list | frozenset | set):
        return all(_is_literal(v) for v in value)
    if isinstance(value, dict):
        return all(_is_literal(k) and _is_literal(v) for k, v in value.items())
    return False


def _type_alias(value: Any) -> tuple[str, set[str]] | None:
    """A type hint alias (``Rows = Annotated[NDArray[np.float32], (-1, 4)]``) as source: its
    repr spells every name with its module, kept when evaluating it gives the alias back."""
    if typing.get_origin(value) is None:
        return None
    text = repr(value)
    modules = {m for m in re.findall(r"\b([A-Za-z_][\w.]*)\.[A-Za-z_]\w*", text)}
    namespace: dict[str, Any] = {}
    try:
        for module in list(modules):
            while module and module not in sys.modules:
                modules.discard(module)
                module = module.rpartition(".")[0]
            if module:
                modules.add(module)
                namespace[module.split(".")[0]] = sys.modules[module.split(".")[0]]
        back = eval(text, namespace)  # our own repr of a live object, not anything received
    except Exception:
        return None
    return (text, modules) if back == value else None


def _importable_from(name: str, value: Any) -> str | None:
    """A module (not ``__main__``) that holds ``value`` as ``name``: its own module first, then
    its parents, then any public module already imported (``numpy.typing.NDArray``)."""
    candidates: list[str] = []
    module = getattr(value, "__module__", None)
    top = ""
    if isinstance(module, str) and module != "__main__":
        parts = module.split(".")
        top = parts[0]
        candidates += [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
    # Then the public modules, the value's own package first, shallow before deep: a name that
    # servekit (or another library) happens to re-export is found where its author put it.
    public = [m for m in list(sys.modules) if not any(p.startswith("_") for p in m.split("."))]
    candidates += sorted(
        public, key=lambda m: (m.split(".")[0] != top, m.split(".")[0] in _OURS, m.count("."), m)
    )
    for candidate in candidates:
        held = getattr(sys.modules.get(candidate), name, None)
        if held is value and candidate != "__main__":
            return candidate
    return None
