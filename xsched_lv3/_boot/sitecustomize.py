"""Loaded by `xsched-lv3 run` children (PYTHONPATH): schedule PyTorch as soon as it is imported."""
import importlib.abc
import importlib.util
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
            from xsched_lv3.pytorch import enable_for_process
            enable_for_process()
        loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _AfterTorch())
