"""The studies' living code: the training-study harness (``training_study``: study_task's cells, arms, seeds and
paired analysis) and the real-model study's (``real_model_*``). The estimator study runs on it; finished studies are
rerun from the commit their README names."""
