"""Writes the Python API page of the rendered docs (Markdown for Doxygen) from the docstrings.

    PYTHONPATH=<build>/python python3 docs/python_api.py OUT.md

Imports the built package `orthros` (the compiled `orthros._core` and `orthros.testing`) and
writes, for every public function and class, its signature and docstring as the package
itself documents them (`help(orthros.attention)` shows the same text), so the page cannot drift
from the code. Run by the docs target (docs/CMakeLists.txt) when the module is built.
"""
import inspect
import sys

import orthros
import orthros.testing


def entry(qualname, obj):
    doc = inspect.getdoc(obj) or "(no docstring)"
    lines = [f"### {qualname}", ""]
    if inspect.isclass(obj):
        lines += ["```", f"class {qualname}", "", doc, "```", ""]
        for name, member in sorted(vars(obj).items()):
            if name.startswith("_") or not (callable(member) or isinstance(member, property)):
                continue
            mdoc = " ".join((inspect.getdoc(member) or "").split())
            lines += [f"- `{name}`: {mdoc}".rstrip(": ")]
        lines.append("")
        return lines
    try:
        sig = qualname + str(inspect.signature(obj))
    except (TypeError, ValueError):  # a compiled function: its docstring starts with the signature
        sig = ""
    return lines + ["```"] + ([sig, ""] if sig and not doc.startswith(obj.__name__ + "(") else []) + [doc, "```", ""]


def main(out_path):
    lines = ["# Python API {#python_api}", "",
             "The package `orthros` (`pip install .`, or `PYTHONPATH=build/python` after "
             "`cmake --build build --target orthros_python`): the CPU oracle, the SPEC §6 checker and the "
             "model regimes from the compiled module `orthros._core`, and `orthros.testing`, a port's "
             "golden-suite test in one call (docs/porting.md). Every C++ `orthros::Error` is raised as "
             "`orthros.Error`, a `ValueError` with the same message. This page is generated from the "
             "docstrings by docs/python_api.py.", "", "## orthros", ""]
    for name in sorted(orthros.__all__):
        obj = getattr(orthros, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            lines += [f"### orthros.{name}", "", "```", f"class orthros.{name}({obj.__bases__[0].__name__})", "",
                      "Raised for bad input by every function of the package, with the message of the C++",
                      "orthros::Error unchanged: it names the parameter and the values.", "```", ""]
        elif callable(obj):
            lines += entry(f"orthros.{name}", obj)
    lines += ["## orthros.testing", "", "```", inspect.getdoc(orthros.testing), "```", ""]
    for name in orthros.testing.__all__:
        lines += entry(f"orthros.testing.{name}", getattr(orthros.testing, name))
    with open(out_path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1])
