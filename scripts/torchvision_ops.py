"""Lets PyPI's torchvision import on the CPU build of torch (scripts/install.sh copies this file into the venv's
site-packages as _mindspeed_rl_torchvision_ops.py, with a .pth line that imports it at interpreter start).

PyPI's torchvision wheels link torch's CUDA libraries, so on torch's CPU build their C++ operators (nms,
roi_align, ...) do not load. torchvision copes with that everywhere but in two unconditional registrations of
fake kernels for ``torchvision::nms`` and ``torchvision::qnms``, which fail when those operators do not exist,
and with them ``import torchvision``. Qwen2-VL-style image and video processors (transformers, vLLM) only
resize, rescale and normalise tensors and never call those operators. This hook defines the two operator
schemas, without kernels, just before torchvision's registrations run and only when its C++ operators did not
load; calling nms then fails with "no kernel" instead of the import failing. Nothing is imported at
interpreter start but this module.
"""

import importlib.abc
import sys

SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_library = None  # the torch.library.Library holding the schemas (kept alive with this module)


class _DefineWhenTheOpsAreMissing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        global _library
        if name != "torchvision._meta_registrations":
            return None
        sys.meta_path.remove(self)
        extension = sys.modules.get("torchvision.extension")
        if extension is not None and not extension._has_ops():
            import torch

            _library = torch.library.Library("torchvision", "DEF")
            for schema in SCHEMAS:
                _library.define(schema)
        return None  # the regular finders load the module


sys.meta_path.insert(0, _DefineWhenTheOpsAreMissing())
