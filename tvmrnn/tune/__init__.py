"""Tuning: the tasks a build's programs give (:mod:`.tasks`), the search spaces
(:mod:`.spaces`), the records that ``build`` reads (:mod:`.records`), and MetaSchedule's tuning
loop with our builders and runners (:mod:`.tuner`). ``build`` imports :mod:`.records` alone."""
