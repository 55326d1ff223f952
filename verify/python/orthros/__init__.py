"""Orthros attention CPU oracle (arXiv 2610.13735): the attention operator and its backward, the
SPEC §6 checker, the model regimes, and `orthros.testing` (a port's golden-suite test in one call).

The compiled part is `orthros._core` (verify/python/orthros_py.cpp); everything in it is
re-exported here, so `orthros.attention(...)`, `orthros.check_attention(...)`, `orthros.Model`,
`orthros.Error`, ... are used as `orthros.<name>`. `orthros.testing` is pure Python and is
imported on first use (`import orthros.testing` or `orthros.testing.assert_matches_golden`).
`orthros.torch` (the PyTorch custom ops and `OrthrosAttention`, docs/torch.md) needs torch and is
imported only explicitly (`import orthros.torch`); nothing here imports torch.
"""
from . import _core
from ._core import *  # noqa: F401,F403  (attention, attention_backward, check, check_attention, ...)

__doc__ = (__doc__ or "") + "\n" + (_core.__doc__ or "")
__all__ = [n for n in dir(_core) if not n.startswith("_")]

# Names as users write them (orthros.Model, orthros.Error), not orthros._core.Model.
for _n in __all__:
    try:
        _obj = getattr(_core, _n)
        if isinstance(_obj, type) and getattr(_obj, "__module__", None) == _core.__name__:
            _obj.__module__ = __name__
    except (AttributeError, TypeError):  # a type that does not allow it keeps its name
        pass
del _n, _obj


def __getattr__(name):  # PEP 562: `orthros.testing` without an explicit import
    if name == "testing":
        import importlib
        return importlib.import_module(".testing", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | {"testing"})
