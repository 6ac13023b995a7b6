"""The harness's scenarios, by name, in the shape ortformer.bench.run.run_bench takes."""
from .cpu_engines import cpu_engines
from .real import real
from .serve_scenario import serve

SCENARIOS = {"real": real, "serve": serve, "cpu-engines": cpu_engines}
