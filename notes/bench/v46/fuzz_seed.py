import sys
sys.path.insert(0, "tests")
import hypothesis
from hypothesis import settings, given, HealthCheck
import fuzz
seed, n = int(sys.argv[1]), int(sys.argv[2])

@hypothesis.seed(seed)
@settings(max_examples=n, deadline=None, database=None, print_blob=True, suppress_health_check=list(HealthCheck))
@given(fuzz.cases())
def t(case):
    fuzz.run_case(case, None, "cpu")

t()
print("passed", seed, n, dict(fuzz.SEEN))
