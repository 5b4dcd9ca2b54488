"""Loaded by `xsched-lv3 run` children (PYTHONPATH): schedule a framework as soon as it is imported.

Each framework we can schedule without code changes, and the integration that hooks it:"""
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

INTEGRATIONS = {
    "torch": "xsched_lv3.pytorch",              # PyTorch (CUDA, or HIP on ROCm)
    "kfdtool.sim.hip": "xsched_lv3.simhip",     # the simulator's HIP-like runtime (simulated GPU processes)
}


class _AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in INTEGRATIONS or name in _hooked:
            return None
        _hooked.add(name)
        if len(_hooked) == len(INTEGRATIONS):
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            if _enabled:
                return                              # one process, one client: the first framework wins
            # another Python than the one xsched-lv3 runs from may lack the package: reach it there
            # (appended, so this Python's own packages still come first), or run unscheduled, saying so
            home = os.environ.get("XSCHED_LV3_HOME")
            if home and home not in sys.path and importlib.util.find_spec("xsched_lv3") is None:
                sys.path.append(home)
            try:
                integration = importlib.import_module(INTEGRATIONS[name])
            except ImportError as e:
                if sys.stderr is not None:          # (closed: print would write to stdout)
                    print(f"xsched-lv3: this Python cannot import xsched_lv3 ({e}); running unscheduled",
                          file=sys.stderr)
                return
            _enabled.append(name)
            integration.enable_for_process()
        loader.exec_module = exec_module
        return spec


def _run_the_one_we_hide():
    """Our directory comes first on PYTHONPATH, so Python imported this module as `sitecustomize`
    instead of the one it would have found (a distribution's, a virtual environment's, the
    program's own): run that one too, as site.py would have, and let it be `sitecustomize`. An
    error in it is reported by site.py as one of its own would be."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_hooked = set()
_enabled = []
sys.meta_path.insert(0, _AfterImport())
_run_the_one_we_hide()
