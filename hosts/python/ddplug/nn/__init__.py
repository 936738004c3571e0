"""What models need from a run: collectives on tensors in Lightning's
conventions (:mod:`.functional`), bucketed gradient sync (:mod:`.gradsync`)
and synchronized batch norm (:mod:`.syncbn`)."""
