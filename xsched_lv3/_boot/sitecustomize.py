"""Loaded by `xsched-lv3 run` children (PYTHONPATH): schedule PyTorch as soon as it is imported."""
import importlib.abc
import importlib.util
import os
import sys


class _AfterTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            # another Python than the one xsched-lv3 runs from may lack the package: reach it there
            # (appended, so this Python's own packages still come first), or run unscheduled, saying so
            home = os.environ.get("XSCHED_LV3_HOME")
            if home and home not in sys.path and importlib.util.find_spec("xsched_lv3") is None:
                sys.path.append(home)
            try:
                from xsched_lv3.pytorch import enable_for_process
            except ImportError as e:
                print(f"xsched-lv3: this Python cannot import xsched_lv3 ({e}); running unscheduled", file=sys.stderr)
                return
            enable_for_process()
        loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _AfterTorch())
