"""Every function SGLang calls into: one module per upstream module (or class) patched, and the table.

`table.py` lists each hook (target, type, process, why); `plugin.register()` applies exactly those
rows. Hooks stay thin: they read this process's state (`srt/state.py`) and call the logic classes.
"""
