"""python -m ariadne.study: train and evaluate the study's schedules (docs/study.md)."""

import sys

from .train import main

sys.exit(main())
