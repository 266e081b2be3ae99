"""Runtime: :func:`~.build.build` and the :class:`~.rnn.RNN` it returns, the arrays its passes use
(:mod:`.arrays`), packages (:mod:`.package` writes them, :mod:`.loader` reads them), the on-disk
build cache of packages (:mod:`.cache`), PyTorch parameters (:mod:`.params`) and the per-kernel
profiler (:mod:`.profile`)."""
