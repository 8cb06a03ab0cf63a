"""The TPU stack rule under the keras environment's TensorFlow (tensorflow 2.21: no TPU build): the same tests as
tests/estimator/tpu/test_tpu_stack.py, which judge whichever TensorFlow is installed."""

from test_tpu_stack import *  # noqa: F401,F403 (the tests themselves, collected here for this environment)
from test_tpu_stack import api  # noqa: F401 (its fixture)
