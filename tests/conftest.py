"""Hypothesis profiles for the whole suite, chosen with HYPOTHESIS_PROFILE (default "ci").

ci:   bounded and derandomized, so CI is reproducible and fast.
soak: thousands of examples per property, random seeds (tests/reliability scales its
      own loops, e.g. thread calls and kill trials, from the profile's max_examples).
"""
import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=100, deadline=None, derandomize=True, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "soak", max_examples=3000, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
