"""What a number computed here may differ by from one written on another machine.

Bit-for-bit equality is claimed and tested only within one machine (one process, or two runs
here): the same code on the same CPU kernels gives the same bytes. Across machines the CPU
kernels differ (AVX-512, AVX2 or none; MKL's code paths), and so do the last bits. The tests
that compare with a file written elsewhere (the TransformerLens 3.9 fixtures in
``tests/tl4/data``, the shipped example series, committed results) use these tolerances, and
``make test-foreign-cpu`` runs them under emulated foreign CPUs
(``ATEN_CPU_CAPABILITY=default`` / ``avx2``, ``MKL_CBWR=COMPATIBLE``).

* :data:`INIT`: seeded initial weights. ``torch.randn`` on the CPU uses vectorised ``log``,
  ``sqrt`` and ``cos`` where the CPU has them: measured under ``ATEN_CPU_CAPABILITY=default``
  against the AVX-512 fixture, at most 4.5e-7 absolute (a few float32 ulps of values up to 1).
* :data:`OUTPUTS`: logits, gradients, trained weights and metrics after a few steps
  (summation order of the matrix products).
* :data:`ZERO_GRADIENT`: parameters whose gradient is zero in exact arithmetic. A key bias
  ``b_K`` adds ``q_i·b_K`` to every score of row ``i``, which the softmax cancels; its float
  gradient is rounding noise, and AdamW turns any nonzero noise into a step of about ``lr``.
  Its value therefore differs between machines by up to ``lr`` per step while the model's
  function does not: such a parameter is compared by its bound, and the model by its outputs.
"""

INIT = dict(atol=1e-6, rtol=1e-5)
OUTPUTS = dict(atol=1e-5, rtol=1e-4)
METRICS = dict(atol=1e-6, rtol=1e-5)
ZERO_GRADIENT = ("attn.b_K",)


def has_zero_gradient(name: str) -> bool:
    """Whether the parameter ``name`` has a zero gradient in exact arithmetic (see the module)."""
    return name.endswith(ZERO_GRADIENT)
