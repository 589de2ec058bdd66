"""Watching a Triton kernel's launch arguments without running it."""

from __future__ import annotations


def launch_spy(monkeypatch, module, kernel: str, flag: str) -> list:
    """Replace `module.<kernel>` by a stand-in whose launches (`kernel[grid](*args, **kwargs)`) run
    nothing and append `kwargs[flag]` to the returned list; `module.check_launchable` lets any
    device through. Only the launch's arguments are read: meta tensors will do."""
    launched = []

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.append(kwargs[flag])
            return launch
    monkeypatch.setattr(module, kernel, Spy())
    monkeypatch.setattr(module, "check_launchable", lambda kernel, device: None)
    return launched
