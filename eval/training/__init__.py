"""bc-state's training: scripted demonstrations on the train split (``python -m eval.training.demos``), the
MLP trained on them (``python -m eval.training.train_bc``), and the state features the MLP reads, which the
bc-state policy computes the same way at evaluation (``state_features``)."""
