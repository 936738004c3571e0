"""The data split: who splits a stream (:mod:`.ownership`), ddplug's samplers
(:mod:`.samplers`), what a sampler pads and drops (:mod:`.declarations`),
iterable datasets (:mod:`.iterable`), the per-epoch audit (:mod:`.audit`) and
the managed DataLoaders the adapters build from them (:mod:`.streams`)."""
