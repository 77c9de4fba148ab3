"""Cost model, schedule IR, simulator, semantic checker, NCCL baselines and lower bounds."""
