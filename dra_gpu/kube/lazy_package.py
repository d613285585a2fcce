"""Import `kubernetes.client` without running `kubernetes/__init__.py` and `kubernetes/config/__init__.py`.

Those two eagerly import every kubeconfig auth provider (requests, requests-oauthlib, oauthlib, google-auth
when present), the dynamic client, informers, leader election and websocket streams: ~20 MB of RSS and
~0.15 s of start-up that the kubelet plugin never uses (it needs ApiClient, a few typed APIs, watch lines and
the in-cluster loader); bench/bench_side_by_side.py measures the plugin's RSS and start-up.

`lazy_package("kubernetes")` registers the package with its `__path__` but without executing its
`__init__.py`: submodules import as usual (`from kubernetes import client` imports `kubernetes.client`), and
the first access to anything else (`kubernetes.config.load_kube_config`, `kubernetes.__version__`) runs the
real `__init__.py` then, so every other use of the package keeps working, only later. The composition root
calls it before anything imports kubernetes; when the package is already imported it does nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from types import ModuleType
from typing import Any

_init_lock = threading.RLock()


def lazy_package(name: str) -> bool:
    """Register package `name` uninitialised (see the module doc). False when it was already imported or is
    not an installed package."""
    if name in sys.modules:
        return False
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return False
    module = importlib.util.module_from_spec(spec)
    initialised = False

    def module_getattr(attribute: str) -> Any:  # PEP 562: called for names the module lacks (yet)
        nonlocal initialised
        submodule = f"{name}.{attribute}"
        if submodule in sys.modules or importlib.util.find_spec(submodule) is not None:
            return importlib.import_module(submodule)  # `from pkg import sub`: no need for __init__
        with _init_lock:
            if not initialised:
                initialised = True
                assert spec.loader is not None
                spec.loader.exec_module(module)  # the real __init__.py, on the same module object
        if attribute in module.__dict__:
            return module.__dict__[attribute]
        raise AttributeError(f"module {name!r} has no attribute {attribute!r}")

    module.__getattr__ = module_getattr  # type: ignore[method-assign]
    sys.modules[name] = module
    if "." in name:  # make it reachable as an attribute of its parent, as an import would
        parent, _, child = name.rpartition(".")
        parent_module: ModuleType | None = sys.modules.get(parent)
        if parent_module is not None:
            setattr(parent_module, child, module)
    return True


def lazy_kubernetes() -> None:
    """The kubernetes client for the kubelet plugin: `kubernetes` and `kubernetes.config` initialised on
    first use of anything but their submodules."""
    lazy_package("kubernetes")
    lazy_package("kubernetes.config")
