"""PROBE ONLY (issue 41 item 6): work around the two CPU blockers of SGLang 0.5.23's KV canary so its
coverage can be observed. Active only when CANARY_CPU_SHIM=1. Touches nothing on disk.
 1. sglang.srt.utils.create_device_stream(cpu) -> torch.cpu.Stream(device=...) TypeError: drop the kwarg.
 2. pin_memory=True on a CPU-only torch (no pinned allocator) in kv_canary future_tensor /
    req_to_expected_token_ids_manager: drop pinning in those two modules only.
Optional: CANARY_SHIM_TRACE=1 logs every verify/write launch's sizes (kernel_kind, active entries)."""
import os, sys, types, importlib.abc, importlib.util

if os.environ.get("CANARY_CPU_SHIM") == "1":

    def _patch_utils(mod):
        import torch
        orig = mod.create_device_stream
        def create_device_stream(device):
            if not isinstance(device, torch.device):
                device = torch.device(device)
            if device.type == "cpu":
                return torch.cpu.Stream()
            return orig(device)
        mod.create_device_stream = create_device_stream
        try:
            import sglang.srt.utils.common as common
            common.create_device_stream = create_device_stream
        except Exception:
            pass

    class _TorchNoPin(types.ModuleType):
        def __init__(self):
            import torch
            super().__init__("torch_nopin"); self._t = torch
        def __getattr__(self, name):
            attr = getattr(self._t, name)
            if name in ("empty", "zeros", "tensor", "ones", "full"):
                def f(*a, **k):
                    k.pop("pin_memory", None); return attr(*a, **k)
                return f
            return attr

    def _patch_nopin(mod):
        mod.torch = _TorchNoPin()
        if hasattr(mod, "flatten_arrays_to_int64_tensor"):
            orig = mod.flatten_arrays_to_int64_tensor
            mod.flatten_arrays_to_int64_tensor = lambda parts, device, pin: orig(parts, device, False)

    def _patch_trace(mod):
        if os.environ.get("CANARY_SHIM_TRACE") != "1":
            return
        import logging
        log = logging.getLogger("canary_shim")
        ov, ow = mod.launch_canary_verify_kernel, mod.launch_canary_write_kernel
        def v(*, context, plan, check_verify_expected_token):
            n = int(plan.verify_num_valid[0]); en = int(plan.enable[0])
            before = int(context.violation_write_index[0])
            ov(context=context, plan=plan, check_verify_expected_token=check_verify_expected_token)
            log.warning("canary_shim verify %s n=%d enable=%d tok=%s new_violations=%d slots=%s",
                        context.kernel_kind.name, n, en, check_verify_expected_token,
                        int(context.violation_write_index[0]) - before,
                        plan.verify_slot_indices[:min(n, 6)].tolist())
        def w(**kw):
            p = kw["plan"]; nr = int(p.write_num_valid_reqs[0])
            ow(**kw)
            log.warning("canary_shim write %s entries=%d", kw["context"].kernel_kind.name,
                        int(p.write_offsets[min(nr, p.write_seed_slot_indices.shape[0])]) if nr > 0 else 0)
        mod.launch_canary_verify_kernel, mod.launch_canary_write_kernel = v, w

    _HOOKS = {
        "sglang.srt.utils": _patch_utils,
        "sglang.srt.kv_canary.runner.future_tensor": _patch_nopin,
        "sglang.srt.kv_canary.req_to_expected_token_ids_manager": _patch_nopin,
        "sglang.srt.kv_canary.endpoint": _patch_trace,
    }

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in _HOOKS:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return spec
            loader, hook = spec.loader, _HOOKS[name]
            class _L(importlib.abc.Loader):
                def create_module(self, s): return loader.create_module(s)
                def exec_module(self, m):
                    loader.exec_module(m); hook(m)
            spec.loader = _L()
            return spec

    sys.meta_path.insert(0, _Finder())
