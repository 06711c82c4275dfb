"""Import-time stand-in for ``torchvision``, on ``sys.path`` of the SGLang engine tests only.

SGLang's ``sglang.srt.configs`` package imports ``torchvision.transforms`` at module level (for
multimodal image preprocessing, never on the HiCache storage path). PyPI's torchvision wheels
link ``libtorch_cuda.so`` and do not load against the CPU build of torch, and no CPU wheel is
reachable from this machine's registries, so this stub lets the import succeed. Every name it
hands out raises when used, so a test that did reach image preprocessing would fail loudly.
Any ``torchvision.<sub>`` module resolves to a placeholder module of the same kind, because
``transformers`` also finds this package (it checks ``find_spec``) and imports a few names
from ``torchvision.io`` and ``torchvision.transforms`` at module level.
"""

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

__version__ = "0.0.0+stub"


class _Unavailable:
    """A placeholder for any torchvision name: attribute access works, calls raise."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> "_Unavailable":
        return _Unavailable(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"torchvision stub: {self._name} is not available in engine tests")


def __getattr__(name: str) -> _Unavailable:
    if name.startswith("__"):
        raise AttributeError(name)
    return _Unavailable(f"torchvision.{name}")


class _StubModule(types.ModuleType):
    """A placeholder submodule: every public attribute is an :class:`_Unavailable`."""

    def __getattr__(self, name: str) -> _Unavailable:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(f"{self.__name__}.{name}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves every ``torchvision.*`` submodule to a :class:`_StubModule`."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith(__name__ + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


# Appended, not prepended: real files of this stub package (none besides this one) win.
sys.meta_path.append(_StubFinder())
