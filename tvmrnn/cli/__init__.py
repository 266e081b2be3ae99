"""Command-line tools: ``tvmrnn-tune`` (:mod:`.tune`), ``tvmrnn-export`` (:mod:`.export`) and
``tvmrnn-bench`` (:mod:`.bench`)."""
