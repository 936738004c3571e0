"""The torch.distributed backend ``"ddplug"`` (see :mod:`ddplug.distributed`):
the errors it raises (:mod:`.errors`), its Work objects (:mod:`.work`), the
process group (:mod:`.group`) and the function torch calls to create one
(:mod:`.create`)."""
