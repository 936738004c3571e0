"""What models need from a run: bucketed gradient sync (:mod:`.gradsync`) and
synchronized batch norm (:mod:`.syncbn`)."""
