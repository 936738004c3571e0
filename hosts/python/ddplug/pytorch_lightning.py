"""The ``ddplug`` strategy for the standalone ``pytorch_lightning`` package
(``pytorch_lightning.Trainer``): :mod:`ddplug.lightning`, built against
``pytorch_lightning`` and ``lightning_fabric`` instead of ``lightning.pytorch``
and ``lightning.fabric`` (see :mod:`ddplug._flavours`)::

    import pytorch_lightning as pl
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddplug")   # after import ddplug
    trainer = pl.Trainer(devices=2, strategy=ddplug.pytorch_lightning.DdplugStrategy(config="ddplug.json"))
"""

from ._flavours import exec_rewritten

exec_rewritten(globals(), "lightning.py")
