"""Sequence classification: a run's classes and probabilities, and its use on new sequences.

- `job.py`: the job (`JOB`): test classes, confusion and reliability figures, the summary
- `classifier.py`: the classifier's model folder (`SequenceContract`) and `Classifier.predict`
- `ensemble.py`: several classifiers trained with other seeds, one folder (`python -m
  tsformer.jobs.classification.ensemble`)
"""
