"""The ``ddplug`` strategy for the standalone ``lightning_fabric`` package
(``lightning_fabric.Fabric``): :mod:`ddplug.fabric`, built against
``lightning_fabric`` (and ``pytorch_lightning``) instead of ``lightning.fabric``
(see :mod:`ddplug._flavours`)::

    import lightning_fabric as lf
    fabric = lf.Fabric(accelerator="cpu", devices=2, strategy="ddplug")        # after import ddplug
"""

from ._flavours import exec_rewritten

exec_rewritten(globals(), "fabric.py")
