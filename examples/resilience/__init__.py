"""End-to-end resilience example: a torchrun training job, its dataset and the chaos run."""
