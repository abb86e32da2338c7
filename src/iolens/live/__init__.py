"""The live view: a full-screen picture of the watched devices, the job and its training loop.

- :mod:`iolens.live.history`: the recent records, running totals and the header (pure).
- :mod:`iolens.live.render`: records -> a ``rich`` renderable (pure, no terminal needed).
- :mod:`iolens.live.view`: :class:`~iolens.live.view.LiveView`, which draws it full screen.
- :mod:`iolens.live.top`: the ``iolens top`` loop.

Importing this package, :mod:`~iolens.live.history` or :mod:`~iolens.live.view`
does not import ``rich``: only rendering does, so ``iolens run`` can hold a
view without paying for it when the view is off.
"""
