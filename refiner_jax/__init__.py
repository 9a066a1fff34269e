"""refiner_jax: generators that revise their reasoning from a critic's feedback, and step-level reward models,
in pure-functional JAX/Flax."""

__version__ = "0.1.0"
