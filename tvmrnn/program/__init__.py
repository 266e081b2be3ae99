"""Programs: a build's passes (inference forward, training forward, backward, weight packing)
written as calls of kernels over layers, directions and chunks of steps (:mod:`.passes`), and
the sequence driver that compiles them with the sequence length T a run-time variable
(:mod:`.sequence`)."""
