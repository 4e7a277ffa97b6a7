"""How SGLang's subprocesses start (see README.md)."""

from sglang_pd.srt.processes.start_method import StartMethodChoice, StartMethodPolicy

__all__ = ["StartMethodChoice", "StartMethodPolicy"]
